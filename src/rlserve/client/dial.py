"""Reaching a server's port, and naming the peer when it is not an rlserve binary carrier.

:class:`Dialer` opens the TCP connection and, for a TLS address, completes the handshake,
turning a refused certificate or a plain-text peer into a :class:`~rlserve.errors.TLSError`
that says what to change. When the first bytes that come back are not a frame, it names the
peer: an HTTP port (asking its ``/v1/health`` for the binary port) or a TLS server met in
plain text. Standard library sockets only.
"""

from __future__ import annotations

import json
import socket
import ssl

from rlserve.client.address import client_ssl_context, parse_address
from rlserve.errors import ConfigError, ConnectionLostError, RLServeError, TLSError

PLAIN_PEER_REASONS = frozenset({"WRONG_VERSION_NUMBER", "PACKET_LENGTH_TOO_LONG", "HTTP_REQUEST"})
"""OpenSSL's reasons for a handshake that met plain text (a server without TLS)."""

HEALTH_PROBE_TIMEOUT = 5.0
"""Seconds to ask an HTTP peer's ``/v1/health`` for the binary port."""

HEALTH_PROBE_BYTES = 64 * 1024
"""Most bytes read of that reply."""


class Dialer:
    """Opens sockets to one server address.

    Args:
        address: Where the server listens (see :func:`~rlserve.client.address.parse_address`).
        tls_ca: CA bundle a ``tls://`` server's certificate must chain to (see
            :func:`~rlserve.client.address.client_ssl_context`).
        connect_timeout: Seconds to wait for a connection to open.
    """

    def __init__(self, address: str, tls_ca: str | None, connect_timeout: float):
        self.host, self.port, self.tls = parse_address(address)
        scheme, sep, _ = address.partition("://")
        self._scheme = f"{scheme}://" if sep else ""
        self.ssl = client_ssl_context(address, tls_ca)
        """The TLS context, or None for a plain-text address."""
        self._connect_timeout = connect_timeout
        self.tcp_connected = False
        """Whether a TCP connection to the server was ever established."""

    def connect(self) -> socket.socket:
        """Open the TCP connection and, for a TLS address, complete the handshake.

        Raises:
            ConnectionLostError: The server cannot be reached.
            TLSError: The handshake failed; nothing was sent in plain text.
        """
        try:
            sock = socket.create_connection((self.host, self.port), self._connect_timeout)
        except OSError as exc:
            raise ConnectionLostError(
                f"cannot reach an rlserve server at {self.host}:{self.port} ({exc}); is "
                "'rlserve serve' running, and is this its binary port?"
            ) from exc
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.tcp_connected = True
        if self.ssl is None:
            return sock
        try:
            return self.ssl.wrap_socket(sock, server_hostname=self.host)
        except ssl.SSLCertVerificationError as exc:
            sock.close()
            raise TLSError(
                f"the TLS certificate of {self.host}:{self.port} was not accepted "
                f"({exc.verify_message}); if the server uses a private or self-signed CA, pass "
                "tls_ca='ca.pem' (or set RLSERVE_TLS_CA), and connect with the host name the "
                "certificate names"
            ) from exc
        except ssl.SSLError as exc:
            sock.close()
            if exc.reason in PLAIN_PEER_REASONS:
                raise TLSError(
                    f"the TLS handshake with {self.host}:{self.port} failed: the server answered "
                    f"in plain text ({exc.reason}), so this port does not serve TLS; connect with "
                    f"tcp://{self.host}:{self.port} (plain text), or start the server with "
                    "--tls-cert FILE --tls-key FILE"
                ) from exc
            raise TLSError(
                f"the TLS handshake with {self.host}:{self.port} failed ({exc}); does the server "
                "serve TLS (rlserve serve --tls-cert ... --tls-key ...)? If it does not, connect "
                f"with tcp://{self.host}:{self.port}"
            ) from exc
        except OSError as exc:
            sock.close()
            raise TLSError(
                f"the TLS handshake with {self.host}:{self.port} failed ({exc}); does the server "
                "serve TLS (rlserve serve --tls-cert ... --tls-key ...)? If it does not, connect "
                f"with tcp://{self.host}:{self.port}"
            ) from exc

    def foreign_error(self, head: bytes) -> RLServeError | None:
        """The error naming the peer whose first bytes are not a frame: HTTP or TLS, or None."""
        if head.startswith(b"HTTP"):
            return ConfigError(self._http_peer_message(head))
        if head[:1] in (b"\x15", b"\x16") and head[1:2] == b"\x03":
            return TLSError(self.tls_peer_message())
        return None

    def tls_peer_message(self) -> str:
        """What to do when the server speaks TLS and this client plain text."""
        return (
            f"{self.host}:{self.port} speaks TLS and this client plain text: the server was "
            f"started with --tls-cert; connect with tls://{self.host}:{self.port} (with "
            "tls_ca='ca.pem' or RLSERVE_TLS_CA for a private CA)"
        )

    def _http_peer_message(self, head: bytes) -> str:
        status = head.split(b"\r\n", 1)[0].decode("ascii", "replace")
        binary = self._binary_port_from_health()
        if binary is not None and binary != self.port:
            return (
                f"{self.host}:{self.port} is the HTTP port of an rlserve server (it answered "
                f"{status!r}); PolicyClient speaks the binary carrier: use the binary port, "
                f"PolicyClient('{self._scheme}{self.host}:{binary}'), which answers HTTP too"
            )
        return (
            f"{self.host}:{self.port} answered in HTTP ({status!r}), not in rlserve's binary "
            "protocol: it is an HTTP port (rlserve's separate --http-port, default 9901, or "
            "another web server); point PolicyClient at the server's binary port (--port, "
            "default 9900, printed in the 'rlserve listening on' line)"
        )

    def _binary_port_from_health(self) -> int | None:
        """Ask the HTTP peer's ``GET /v1/health`` for the binary port; None if it does not say.

        The request carries nothing secret (no token), over TLS when the address is TLS.
        """
        host = f"[{self.host}]" if ":" in self.host else self.host
        request = (
            f"GET /v1/health HTTP/1.1\r\nHost: {host}:{self.port}\r\n"
            "Accept: application/json\r\nConnection: close\r\n\r\n"
        ).encode("ascii", "replace")
        wait = min(self._connect_timeout, HEALTH_PROBE_TIMEOUT)
        reply = b""
        try:
            sock = socket.create_connection((self.host, self.port), wait)
            if self.ssl is not None:
                sock = self.ssl.wrap_socket(sock, server_hostname=self.host)
            with sock:
                sock.settimeout(wait)
                sock.sendall(request)
                while len(reply) < HEALTH_PROBE_BYTES:
                    chunk = sock.recv(HEALTH_PROBE_BYTES)
                    if not chunk:
                        break
                    reply += chunk
            health = json.loads(reply.partition(b"\r\n\r\n")[2])
        except (OSError, ValueError):
            return None
        port = health.get("binary_port") if isinstance(health, dict) else None
        return port if isinstance(port, int) and 0 < port < 65536 else None

    def speaks_tls(self) -> bool:
        """Whether the peer completes a TLS handshake (a probe that sends nothing else)."""
        context = ssl.create_default_context()
        # Only asks "is this TLS?": no data is sent, so the certificate does not matter here.
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        wait = min(self._connect_timeout, HEALTH_PROBE_TIMEOUT)
        try:
            with socket.create_connection((self.host, self.port), wait) as raw:
                raw.settimeout(wait)
                with context.wrap_socket(raw, server_hostname=self.host):
                    return True
        except OSError:
            return False
