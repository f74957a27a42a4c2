"""The binary carrier: length-prefixed msgpack frames over TCP (asyncio, uvloop when present).

Its port serves the HTTP carrier too: :class:`CarrierSniffer` reads each connection's first byte
(after the TLS handshake) and hands the connection to the HTTP protocol when that byte starts an
HTTP method, to :class:`BinaryConnection` otherwise (``docs/protocol.md`` section 3.6).

Requests on one connection are handled in order. While a ``get_action`` waits for its batched
forward pass, later frames of the same connection wait in a backlog, so replies and episode state
follow the order the client sent (a client may pipeline). A connection that sends a frame over the
size limit gets an error and is closed: the stream cannot be resynchronised. A connection whose
``hello`` fails (wrong token or version) is closed after the error reply. Before a successful
``hello`` every other message is answered ``unauthorized`` without its fields being read.

Hygiene (see :class:`ConnectionPolicy`): before a successful ``hello`` frames are limited to a
small size and the connection must say ``hello`` within a deadline; the number of connections is
capped; a connection quiet for too long is closed (without an error frame, so that a client simply
reconnects). Back-pressure: when a connection's unsent replies pass the transport's high-water mark
(the client does not read), the server stops handling and reading that connection until the
replies drain, so its memory stays bounded whatever the client sends.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from rlserve.errors import AuthenticationError, DecodeError, FrameTooLargeError, RLServeError
from rlserve.protocol.codec import decode, encode
from rlserve.protocol.framing import FrameDecoder, frame
from rlserve.protocol.limits import Limits
from rlserve.protocol.messages import parse_request, valid_request_id
from rlserve.protocol.replies import ErrorReply
from rlserve.protocol.session_requests import Hello
from rlserve.server.config import ServerConfig
from rlserve.server.service import Service, Session
from rlserve.server.throttled_log import SERVER_LOG

MAX_BACKLOG_FRAMES = 1024
"""Frames a connection may have waiting before the server stops reading from it."""

MAX_BACKLOG_BYTES = 4 * 1024 * 1024
"""Bytes of frames a connection may have waiting before the server stops reading from it."""

WRITE_HIGH_WATER = 1024 * 1024
"""Unsent reply bytes of a connection past which the server stops handling its requests."""

TIMEOUT_CODE = "timeout"
"""Error code of a connection closed for not saying ``hello`` in time."""


@dataclass(frozen=True, slots=True)
class ConnectionPolicy:
    """Per-connection hygiene of the binary carrier.

    Attributes:
        max_connections: Most open connections; one more gets a ``capacity`` error and is closed.
        pre_hello_frame_bytes: Largest frame accepted before a successful ``hello``.
        hello_timeout: Seconds a new connection has to complete ``hello``.
        idle_timeout: Seconds without a frame or reply after which a connection is closed
            (0 or less: never).
    """

    max_connections: int = 512
    pre_hello_frame_bytes: int = 64 * 1024
    hello_timeout: float = 10.0
    idle_timeout: float = 600.0

    @classmethod
    def from_config(cls, config: ServerConfig) -> ConnectionPolicy:
        """The policy a server configuration sets."""
        return cls(
            config.max_connections,
            config.pre_hello_frame_bytes,
            config.hello_timeout,
            config.connection_idle_timeout,
        )


class BinaryConnection(asyncio.Protocol):
    """One client connection of the binary carrier.

    Args:
        service: Handles the requests.
        limits: The wire limits.
        registry: The open connections of the port; this one joins it unless the port is full.
        policy: The connection hygiene.
        opened_at: ``loop.time()`` of the connect when it came before this protocol took over
            (the shared port sniffs first); the ``hello`` deadline counts from it.
    """

    def __init__(
        self,
        service: Service,
        limits: Limits,
        registry: set[PortConnection],
        policy: ConnectionPolicy = ConnectionPolicy(),
        *,
        opened_at: float | None = None,
    ):
        self._registry = registry
        self._opened_at = opened_at
        self._service = service
        self._limits = limits
        self._policy = policy
        self._decoder = FrameDecoder(min(policy.pre_hello_frame_bytes, limits.max_frame_bytes))
        self._session = Session()
        self._backlog: deque[bytes] = deque()
        self._backlog_bytes = 0
        self._deferred = False
        self._reading_paused = False
        self._writing_paused = False
        self._transport: asyncio.Transport | None = None
        self._closing = False
        self._replied = False
        self._counted = False
        self._activity = 0  # frames received plus replies sent; cheaper than a clock per frame
        self._seen_activity = 0
        self._quiet_since = 0.0
        self._hello_timer: asyncio.TimerHandle | None = None
        self._idle_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Count the client, or refuse it when the server is at its connection cap."""
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self._transport = cast(asyncio.Transport, transport)
        if len(self._registry) >= self._policy.max_connections:
            self._service.stats.count_error("capacity")
            SERVER_LOG.warn(
                "max_connections",
                f"refused a binary connection: {self._policy.max_connections} are open "
                "(raise max_connections if the clients are legitimate)",
            )
            self._write(
                ErrorReply(
                    None,
                    "capacity",
                    f"the server has {self._policy.max_connections} open connections, its limit; "
                    "retry later or ask the operator to raise max_connections",
                ).to_wire()
            )
            self._close()
            return
        self._transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        self._registry.add(self)
        self._counted = True
        self._service.stats.clients += 1
        loop = asyncio.get_running_loop()
        # On the shared port the deadline counts from the connect, not from the first byte.
        opened = loop.time() if self._opened_at is None else self._opened_at
        self._quiet_since = opened
        self._hello_timer = loop.call_at(opened + self._policy.hello_timeout, self._hello_expired)
        if self._policy.idle_timeout > 0:
            self._idle_timer = loop.call_later(self._policy.idle_timeout / 4, self._check_idle)

    def connection_lost(self, exc: Exception | None) -> None:
        """Uncount the client; its episodes stay open until they end or go idle."""
        for timer in (self._hello_timer, self._idle_timer):
            if timer is not None:
                timer.cancel()
        if self._counted:
            self._service.stats.clients -= 1
            self._counted = False
        self._transport = None
        self._closing = True
        self._backlog.clear()
        self._registry.discard(self)

    def pause_writing(self) -> None:
        """The client does not read its replies: stop handling (and so reading) its requests."""
        self._writing_paused = True
        self._pause_reading()

    def resume_writing(self) -> None:
        """The replies drained: carry on with the backlog."""
        self._writing_paused = False
        asyncio.get_running_loop().call_soon(self._drain)

    def data_received(self, data: bytes) -> None:
        """Split the bytes into frames and handle them in order."""
        if self._closing:
            return
        self._activity += 1
        try:
            frames = self._decoder.feed(data)
        except FrameTooLargeError as exc:
            message = str(exc)
            if not self._session.authenticated:
                message += "; before a successful hello frames are limited to " + (
                    f"{self._decoder.max_frame_bytes} bytes"
                )
            self._service.stats.count_error(exc.code)
            self._write(ErrorReply(None, exc.code, message).to_wire())
            self._close()
            return
        if len(frames) == 1 and not (
            self._backlog or self._deferred or self._writing_paused or self._reading_paused
        ):
            # The common case (a client waits for each reply): no queue to go through.
            self._handle_frame(frames[0])
            return
        self._backlog.extend(frames)
        self._backlog_bytes += sum(len(body) for body in frames)
        if len(self._backlog) > MAX_BACKLOG_FRAMES or self._backlog_bytes > MAX_BACKLOG_BYTES:
            self._pause_reading()
        self._drain()

    def _pause_reading(self) -> None:
        if not self._reading_paused and self._transport is not None:
            self._transport.pause_reading()
            self._reading_paused = True

    def _drain(self) -> None:
        while self._backlog and not self._deferred and not self._closing:
            if self._writing_paused:
                return
            body = self._backlog.popleft()
            self._backlog_bytes -= len(body)
            self._handle_frame(body)
        if (
            self._reading_paused
            and not self._writing_paused
            and len(self._backlog) < MAX_BACKLOG_FRAMES // 2
            and self._backlog_bytes < MAX_BACKLOG_BYTES // 2
        ):
            if self._transport is not None:
                self._transport.resume_reading()
            self._reading_paused = False

    def _handle_frame(self, body: bytes) -> None:
        raw: Any = None
        try:
            raw = decode(body, self._limits)
            if not self._session.authenticated and raw.get("type") != "hello":
                # Nothing but hello is looked at before hello: not even its fields.
                raise AuthenticationError(
                    "the first message on a connection must be 'hello' with a valid token"
                )
            request = parse_request(raw, self._limits)
        except RLServeError as exc:  # a ProtocolError, or a SpaceError of an out-of-range reward
            self._refuse(raw, exc)
            return
        except Exception as exc:  # the parser's bug, but the frame is at fault: answer it
            SERVER_LOG.warn("parse", f"unexpected error parsing a frame: {exc!r}")
            self._refuse(raw, DecodeError(f"malformed message: {type(exc).__name__}: {exc}"))
            return
        if isinstance(request, Hello):
            self._service.handle(request, self._session, self._reply_hello)
            return
        # A deferred reply (get_action) later comes through _write, which resumes the backlog;
        # a request may also be answered during handle() even when it could have waited.
        self._replied = False
        deferred = self._service.handle(request, self._session, self._write)
        self._deferred = deferred and not self._replied

    def _refuse(self, raw: Any, exc: RLServeError) -> None:
        self._service.stats.count_error(exc.code)
        self._write(ErrorReply(valid_request_id(raw), exc.code, str(exc)).to_wire())

    def _reply_hello(self, reply: dict[str, Any]) -> None:
        self._write(reply)
        if reply["type"] == "error":
            self._close()
        else:
            self._decoder.max_frame_bytes = self._limits.max_frame_bytes

    def _hello_expired(self) -> None:
        if self._session.authenticated or self._closing:
            return
        self._service.stats.count_error(TIMEOUT_CODE)
        self._write(
            ErrorReply(
                None,
                TIMEOUT_CODE,
                f"no successful hello within {self._policy.hello_timeout:g} s of connecting; "
                "send hello first",
            ).to_wire()
        )
        self._close()

    def _check_idle(self) -> None:
        """Runs every quarter of the idle timeout: closes after a whole timeout of quiet."""
        if self._closing:
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        if self._activity != self._seen_activity or self._deferred or self._backlog:
            self._seen_activity = self._activity
            self._quiet_since = now
        elif now - self._quiet_since >= self._policy.idle_timeout:
            # No error frame: a client that comes back simply reconnects.
            self._close()
            return
        self._idle_timer = loop.call_later(self._policy.idle_timeout / 4, self._check_idle)

    def _write(self, reply: dict[str, Any]) -> None:
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.write(frame(encode(reply)))
            self._activity += 1
        self._replied = True
        if self._deferred:
            self._deferred = False
            if self._backlog or self._reading_paused:
                asyncio.get_running_loop().call_soon(self._drain)

    def close(self) -> None:
        """Close the connection; nothing more is read from it."""
        self._close()

    def _close(self) -> None:
        self._closing = True
        self._backlog.clear()
        self._backlog_bytes = 0
        if self._transport is not None:
            self._transport.close()


HTTP_FIRST_BYTES = frozenset(range(ord("A"), ord("Z") + 1))
"""First bytes that make a connection of the shared port HTTP: every HTTP method starts with one.

A binary frame cannot start with one: its first byte is the top byte of a big-endian length of
at most ``MAX_FRAME_BYTES_CEILING`` (1 GiB), so it is at most ``0x40``."""


class CarrierSniffer(asyncio.Protocol):
    """A new connection of the binary port until its first byte says which carrier it speaks.

    An HTTP request (first byte ``A``-``Z``: ``GET``, ``POST``, ...) goes to the HTTP carrier's
    protocol with that byte; anything else goes to :class:`BinaryConnection`. With TLS the
    transport is already decrypted, so the sniffing sees the plain stream. While it waits, the
    connection counts against ``max_connections`` like a binary one; a full port, or a
    connection that sends nothing within ``hello_timeout``, is handed to the binary carrier,
    which answers ``capacity`` or ``timeout`` as it always has.

    Args:
        binary: Makes the binary protocol of this connection (takes ``opened_at``).
        http: Makes the HTTP carrier's protocol.
        registry: The open connections of the port (this one while it sniffs).
        policy: The connection hygiene (cap and deadline).
    """

    def __init__(
        self,
        binary: Callable[[float], BinaryConnection],
        http: Callable[[], asyncio.Protocol],
        registry: set[PortConnection],
        policy: ConnectionPolicy,
    ):
        self._binary = binary
        self._http = http
        self._registry = registry
        self._policy = policy
        self._transport: asyncio.Transport | None = None
        self._opened_at = 0.0
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Wait for the first byte, or let the binary carrier refuse a full port."""
        self._transport = cast(asyncio.Transport, transport)
        loop = asyncio.get_running_loop()
        self._opened_at = loop.time()
        if len(self._registry) >= self._policy.max_connections:
            self._hand_over(self._binary(self._opened_at), b"")
            return
        self._registry.add(self)
        self._timer = loop.call_later(self._policy.hello_timeout, self._silent)

    def data_received(self, data: bytes) -> None:
        """Hand the connection, with these bytes, to the carrier they belong to."""
        if data[0] in HTTP_FIRST_BYTES:
            self._hand_over(self._http(), data)
        else:
            self._hand_over(self._binary(self._opened_at), data)

    def connection_lost(self, exc: Exception | None) -> None:
        """Gone before its first byte."""
        self._stop()
        self._transport = None

    def close(self) -> None:
        """Close the connection (the server stops)."""
        self._stop()
        if self._transport is not None:
            self._transport.close()

    def _silent(self) -> None:
        # The binary carrier answers a silent connection: its hello deadline has passed.
        self._timer = None
        if self._transport is not None and not self._transport.is_closing():
            self._hand_over(self._binary(self._opened_at), b"")

    def _stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._registry.discard(self)

    def _hand_over(self, protocol: asyncio.Protocol, data: bytes) -> None:
        self._stop()
        transport = self._transport
        if transport is None:
            return
        self._transport = None
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        backdate = getattr(protocol, "backdate", None)
        if backdate is not None:
            backdate(self._opened_at)
        if data and not transport.is_closing():
            protocol.data_received(data)


PortConnection = BinaryConnection | CarrierSniffer
"""An open connection of the binary port: binary, or still sniffing."""


class BinaryServer:
    """The listening socket of the binary carrier and its open connections."""

    def __init__(self, server: asyncio.Server, connections: set[PortConnection]):
        self.server = server
        self._connections = connections

    @property
    def port(self) -> int:
        """The port it listens on."""
        return int(self.server.sockets[0].getsockname()[1])

    def close(self) -> None:
        """Stop accepting and close every open connection (clients reconnect elsewhere)."""
        self.server.close()
        for connection in list(self._connections):
            connection.close()


TLS_HANDSHAKE_TIMEOUT = 10.0
"""Seconds a client has to complete the TLS handshake before the connection is closed."""


async def start_binary_server(
    service: Service,
    limits: Limits,
    host: str,
    port: int,
    policy: ConnectionPolicy = ConnectionPolicy(),
    *,
    tls: ssl.SSLContext | None = None,
    http: Callable[[], asyncio.Protocol] | None = None,
) -> BinaryServer:
    """Listen for binary-carrier connections, with TLS when ``tls`` is given.

    With ``http`` (a factory of the HTTP carrier's protocol) the port serves both carriers: each
    connection's first byte (after the TLS handshake) decides (:class:`CarrierSniffer`).

    A failed handshake (a plain-text client, an unknown certificate authority on the client's
    side) closes that connection before any frame is read; asyncio logs it only in debug mode.
    """
    loop = asyncio.get_running_loop()
    connections: set[PortConnection] = set()

    def binary(opened_at: float | None = None) -> BinaryConnection:
        return BinaryConnection(service, limits, connections, policy, opened_at=opened_at)

    def connection() -> asyncio.Protocol:
        if http is None:
            return binary()
        return CarrierSniffer(binary, http, connections, policy)

    server = await loop.create_server(
        connection,
        host,
        port,
        reuse_address=True,
        ssl=tls,
        ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT if tls is not None else None,
    )
    return BinaryServer(server, connections)
