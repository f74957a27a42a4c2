"""A blocking binary-carrier connection: framing, request ids, pipelining, reconnection.

Requests get increasing ids. :meth:`Connection.request` sends one and reads replies until its
own arrives. :meth:`Connection.send_nowait` sends one without waiting (it is pipelined: the
caller goes on, e.g. resets its simulator, while the reply travels). The next call first reads
the replies of pipelined requests and raises an error among them, naming the request it belongs
to, before it sends anything: a call that raises has taken no effect. Standard library sockets
only.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import ssl
import time
from dataclasses import dataclass
from typing import Any, NamedTuple

from rlserve.errors import (
    ConfigError,
    ConnectionLostError,
    FrameTooLargeError,
    ProtocolError,
    RequestTimeoutError,
    RLServeError,
    TLSError,
    error_for_code,
)
from rlserve.protocol.codec import decode, encode
from rlserve.protocol.framing import FrameDecoder, frame
from rlserve.protocol.limits import DEFAULT_LIMITS, PROTOCOL_VERSION, Limits


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Client timeouts, in seconds.

    Attributes:
        connect: To open the TCP connection.
        request: For a reply (a first get_action may wait while the server's learner starts).
        reconnect: How long to keep retrying, with backoff, after the connection breaks.
    """

    connect: float = 10.0
    request: float = 60.0
    reconnect: float = 30.0


PLAIN_SCHEMES = ("tcp", "http")
"""Address schemes of a plain-text connection (``http`` is RLlib's form of the same address)."""

TLS_SCHEMES = ("tls", "https")
"""Address schemes of a TLS connection: the server's certificate and host name are verified."""

PLAIN_PEER_REASONS = frozenset({"WRONG_VERSION_NUMBER", "PACKET_LENGTH_TOO_LONG", "HTTP_REQUEST"})
"""OpenSSL's reasons for a handshake that met plain text (a server without TLS)."""

HEAD_BYTES = 64
"""First bytes of a connection kept to name a peer that is not a binary carrier."""

HEALTH_PROBE_TIMEOUT = 5.0
"""Seconds to ask an HTTP peer's ``/v1/health`` for the binary port."""

HEALTH_PROBE_BYTES = 64 * 1024
"""Most bytes read of that reply."""

TLS_CA_ENV = "RLSERVE_TLS_CA"
"""Environment variable with a CA bundle file that TLS connections trust (when ``tls_ca`` is
not given)."""


class Address(NamedTuple):
    """A parsed server address."""

    host: str
    port: int
    tls: bool


def parse_address(address: str) -> Address:
    """Parse a server address: plain text or TLS, by its scheme.

    ``host:port``, ``tcp://host:port`` and RLlib's ``http://host:port`` are plain text;
    ``tls://host:port`` and ``https://host:port`` are TLS. A scheme that promises TLS always
    gets TLS; there is no fallback to plain text.

    Raises:
        ConfigError: An unknown scheme (a ``ValueError`` too).
        ValueError: No port, or a port that is not a number.
    """
    if not isinstance(address, str):
        # A user's mistake (a tuple, a bare port): say what to write, never an AttributeError.
        example = (
            f"'{address[0]}:{address[1]}'"
            if isinstance(address, tuple | list) and len(address) == 2
            else "'localhost:9900'"
        )
        raise ConfigError(
            f"the server address must be a string like {example} (or 'tls://host:port'), got "
            f"{address!r} ({type(address).__name__})"
        )
    scheme, sep, rest = address.partition("://")
    if not sep:
        scheme, rest = "", address
    elif scheme.lower() not in PLAIN_SCHEMES + TLS_SCHEMES:
        raise ConfigError(
            f"address '{address}' has the unknown scheme '{scheme}://'; use host:port, tcp:// "
            "or http:// (plain text), or tls:// or https:// (TLS)"
        )
    host, sep, port = rest.rstrip("/").rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"address '{address}' needs a port, e.g. 'localhost:9900'")
    return Address(host.strip("[]") or "127.0.0.1", int(port), scheme.lower() in TLS_SCHEMES)


def client_ssl_context(address: str, tls_ca: str | None) -> ssl.SSLContext | None:
    """The TLS context of a connection to ``address``, or None for a plain-text address.

    The server's certificate must chain to ``tls_ca`` (a PEM bundle; default: the
    ``RLSERVE_TLS_CA`` environment variable, else the system's trusted CAs) and name the host.

    Raises:
        ConfigError: ``tls_ca`` given for a plain-text address, or a CA file that cannot be read.
    """
    if not parse_address(address).tls:
        if tls_ca is not None:
            raise ConfigError(
                f"tls_ca is set but the address '{address}' is plain text; use "
                "tls://host:port to connect with TLS"
            )
        return None
    cafile = tls_ca if tls_ca is not None else os.environ.get(TLS_CA_ENV) or None
    try:
        return ssl.create_default_context(cafile=cafile)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot read the CA bundle {cafile} ({exc}); pass a PEM file") from exc


class Connection:
    """One binary-carrier connection to an rlserve server, re-opened when it breaks.

    Args:
        address: Where the server listens.
        token: The server's token, if it has one.
        client_name: Shown in the server's logs and metrics.
        inference_mode: Sent in ``hello``.
        timeouts: Connect, request and reconnect timeouts.
        tls_ca: CA bundle a ``tls://`` server's certificate must chain to (see
            :func:`client_ssl_context`).
        client_id: The client identity sent in every ``hello`` (episodes belong to it); None:
            the server treats each connection as its own client.
    """

    def __init__(
        self,
        address: str,
        token: str | None,
        client_name: str,
        inference_mode: str,
        timeouts: Timeouts,
        tls_ca: str | None = None,
        client_id: str | None = None,
    ):
        self.host, self.port, self.tls = parse_address(address)
        scheme, sep, _ = address.partition("://")
        self._scheme = f"{scheme}://" if sep else ""
        self._head: bytearray | None = None
        """The first bytes of the connection until its first frame (to name a foreign peer)."""
        self._ssl = client_ssl_context(address, tls_ca)
        self.tcp_connected = False
        """Whether a TCP connection to the server was ever established."""
        self._token = token
        self._client_name = client_name
        self._inference_mode = inference_mode
        self._client_id = client_id
        self.timeouts = timeouts
        self.limits: Limits = DEFAULT_LIMITS
        self._sock: socket.socket | None = None
        self._decoder = FrameDecoder(DEFAULT_LIMITS.max_frame_bytes)
        self._next_id = 1
        self._unanswered: dict[int, dict[str, Any]] = {}
        self._replies: dict[int, dict[str, Any]] = {}
        self._deferred_error: RLServeError | None = None
        self._deferred_message: dict[str, Any] | None = None
        self.failed_message: dict[str, Any] | None = None
        """The pipelined request whose error was raised last (for the caller to undo it)."""
        self.welcome: dict[str, Any] = {}
        self.reconnects = 0

    # -- lifecycle -------------------------------------------------------------------------

    def open(self) -> dict[str, Any]:
        """Connect and say hello; return the server's ``welcome``.

        Raises:
            ConnectionLostError: The server cannot be reached.
            TLSError: Only one side speaks TLS.
            ConfigError: The address leads to an HTTP port, not a binary one (the message names
                the binary port when the server's health says it).
            AuthenticationError, VersionMismatchError: The server refused the hello.
        """
        sock = self._connect_socket()
        sock.settimeout(self.timeouts.request)
        self._sock = sock
        self._decoder = FrameDecoder(DEFAULT_LIMITS.max_frame_bytes)
        self._head = bytearray()
        self._unanswered.clear()
        self._replies.clear()
        try:
            reply = self._roundtrip(
                {
                    "type": "hello",
                    "protocol_version": PROTOCOL_VERSION,
                    "client_name": self._client_name,
                    "token": self._token,
                    "inference_mode": self._inference_mode,
                    "client_id": self._client_id,
                }
            )
        except ConnectionLostError as exc:
            # Closed without a byte of reply: what a TLS server does to a plain-text hello.
            closed = not isinstance(exc, RequestTimeoutError)
            if closed and self._ssl is None and self._head == b"" and self._peer_speaks_tls():
                raise TLSError(self._tls_peer_message()) from exc
            raise
        self.welcome = reply
        limits = reply.get("limits", {})
        known = {k: v for k, v in limits.items() if k in Limits.__dataclass_fields__}
        self.limits = Limits(**known)
        self._decoder.max_frame_bytes = self.limits.max_frame_bytes
        return reply

    def _connect_socket(self) -> socket.socket:
        """Open the TCP connection and, for a TLS address, complete the handshake.

        Raises:
            ConnectionLostError: The server cannot be reached.
            TLSError: The handshake failed; nothing was sent in plain text.
        """
        try:
            sock = socket.create_connection((self.host, self.port), self.timeouts.connect)
        except OSError as exc:
            raise ConnectionLostError(
                f"cannot reach an rlserve server at {self.host}:{self.port} ({exc}); is "
                "'rlserve serve' running, and is this its binary port?"
            ) from exc
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.tcp_connected = True
        if self._ssl is None:
            return sock
        try:
            return self._ssl.wrap_socket(sock, server_hostname=self.host)
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

    # -- a peer that is not a binary carrier -----------------------------------------------

    def _foreign_peer(self) -> RLServeError | None:
        """The error naming the peer whose first bytes are not a frame: HTTP or TLS, or None."""
        head = bytes(self._head or b"")
        if head.startswith(b"HTTP"):
            return ConfigError(self._http_peer_message(head))
        if head[:1] in (b"\x15", b"\x16") and head[1:2] == b"\x03":
            return TLSError(self._tls_peer_message())
        return None

    def _tls_peer_message(self) -> str:
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
        wait = min(self.timeouts.connect, HEALTH_PROBE_TIMEOUT)
        reply = b""
        try:
            sock = socket.create_connection((self.host, self.port), wait)
            if self._ssl is not None:
                sock = self._ssl.wrap_socket(sock, server_hostname=self.host)
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

    def _peer_speaks_tls(self) -> bool:
        """Whether the peer completes a TLS handshake (a probe that sends nothing else)."""
        context = ssl.create_default_context()
        # Only asks "is this TLS?": no data is sent, so the certificate does not matter here.
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        wait = min(self.timeouts.connect, HEALTH_PROBE_TIMEOUT)
        try:
            with socket.create_connection((self.host, self.port), wait) as raw:
                raw.settimeout(wait)
                with context.wrap_socket(raw, server_hostname=self.host):
                    return True
        except OSError:
            return False

    def close(self) -> None:
        """Read outstanding replies (raising a deferred error) and close the socket."""
        try:
            while self._sock is not None and self._unanswered:
                self._receive_some()
        finally:
            self._drop_socket()
        self._raise_deferred()

    def _drop_socket(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
        self._sock = None

    def reconnect(self, deadline: float | None = None) -> dict[str, Any]:
        """Re-open the connection with exponential backoff until the reconnect timeout.

        Args:
            deadline: Give up at this ``time.monotonic()`` instead (e.g. a call's own deadline).

        Raises:
            ConnectionLostError: The server stayed unreachable.
        """
        self._drop_socket()
        if deadline is None:
            deadline = time.monotonic() + self.timeouts.reconnect
        delay = 0.05
        while True:
            try:
                welcome = self.open()
                self.reconnects += 1
                return welcome
            except ConnectionLostError:
                if time.monotonic() + delay > deadline:
                    raise ConnectionLostError(
                        f"lost the connection to {self.host}:{self.port} and could not "
                        f"reconnect within {self.timeouts.reconnect:.0f} s; start the server "
                        "or raise the reconnect timeout"
                    ) from None
                time.sleep(max(0.0, min(delay, deadline - time.monotonic())))
                delay = min(delay * 2, 2.0)

    # -- requests --------------------------------------------------------------------------

    def request(self, message: dict[str, Any]) -> dict[str, Any]:
        """Send ``message`` and return its reply; an ``error`` reply is raised.

        An error of an earlier pipelined request is raised before sending, never after a
        successful round trip: a call that raises has taken no effect.
        """
        self._settle()
        return self._roundtrip(message)

    def send_nowait(self, message: dict[str, Any]) -> None:
        """Send ``message`` without waiting; its error, if any, is raised by the next call."""
        self._settle()
        request_id = self._send(message)
        self._unanswered[request_id] = message

    @property
    def unanswered(self) -> int:
        """How many pipelined requests still wait for their reply."""
        return len(self._unanswered)

    def abort(self) -> None:
        """Shut the socket down from another thread: a blocked read returns at once."""
        sock = self._sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def take_unanswered(self) -> list[dict[str, Any]]:
        """The pipelined requests whose replies never came (the connection broke), in order.

        The caller decides whether re-sending them is safe; they are forgotten here.
        """
        lost = [self._unanswered[key] for key in sorted(self._unanswered)]
        self._unanswered.clear()
        return lost

    def _settle(self) -> None:
        """Read the replies of pipelined requests; raise the first error among them."""
        while self._sock is not None and self._unanswered:
            self._receive_some()
        self._raise_deferred()

    def _roundtrip(self, message: dict[str, Any]) -> dict[str, Any]:
        request_id = self._send(message)
        reply = self._read_until(request_id)
        if reply.get("type") == "error":
            raise error_for_code(str(reply.get("code")), str(reply.get("message")), request_id)
        return reply

    def _send(self, message: dict[str, Any]) -> int:
        if self._sock is None:
            raise ConnectionLostError("the connection is closed")
        request_id = self._next_id
        message["id"] = request_id
        body = encode(message)
        if len(body) > self.limits.max_frame_bytes:
            raise FrameTooLargeError(
                f"a {message.get('type')} of {len(body)} bytes is over the server's frame limit "
                f"of {self.limits.max_frame_bytes} bytes; send less per call"
            )
        self._next_id += 1
        try:
            self._sock.sendall(frame(body))
        except OSError as exc:
            self._drop_socket()
            raise ConnectionLostError(f"sending to {self.host}:{self.port} failed: {exc}") from exc
        return request_id

    def _read_until(self, request_id: int) -> dict[str, Any]:
        while request_id not in self._replies:
            self._receive_some()
        return self._replies.pop(request_id)

    def _receive_some(self) -> None:
        assert self._sock is not None
        try:
            data = self._sock.recv(1 << 16)
        except TimeoutError as exc:
            self._drop_socket()
            raise RequestTimeoutError(
                f"no reply from {self.host}:{self.port} within {self.timeouts.request} s; "
                "raise the request timeout if the server is busy"
            ) from exc
        except OSError as exc:
            self._drop_socket()
            raise ConnectionLostError(
                f"connection to {self.host}:{self.port} broke: {exc}"
            ) from exc
        if not data:
            self._drop_socket()
            raise ConnectionLostError(
                f"the server at {self.host}:{self.port} closed the connection"
            )
        if self._head is not None and len(self._head) < HEAD_BYTES:
            self._head += data[: HEAD_BYTES - len(self._head)]
        try:
            bodies = self._decoder.feed(data)
            replies = [decode(body, self.limits) for body in bodies]
        except ProtocolError as exc:
            self._drop_socket()
            foreign = self._foreign_peer()
            if foreign is not None:
                raise foreign from exc
            raise ConnectionLostError(f"the server sent an invalid frame: {exc}") from exc
        if replies:
            self._head = None
        for reply in replies:
            reply_id = reply.get("id")
            if isinstance(reply_id, int) and reply_id in self._unanswered:
                sent = self._unanswered.pop(reply_id)
                kind = sent["type"]
                if reply.get("type") == "error" and self._deferred_error is None:
                    self._deferred_message = sent
                    episode = sent.get("episode_id")
                    of = f" of episode '{episode}'" if isinstance(episode, str) else ""
                    self._deferred_error = error_for_code(
                        str(reply.get("code")),
                        f"the earlier {kind}{of} failed: {reply.get('message')} (it was sent "
                        "without waiting for its reply, so its error is raised by the next "
                        "call, which was not sent)",
                        reply_id,
                    )
            elif isinstance(reply_id, int):
                self._replies[reply_id] = reply
            elif reply.get("type") == "error":
                # An error without a request id concerns the connection itself.
                self._drop_socket()
                raise error_for_code(str(reply.get("code")), str(reply.get("message")))

    def _raise_deferred(self) -> None:
        error, self._deferred_error = self._deferred_error, None
        if error is not None:
            self.failed_message = self._deferred_message
            raise error
