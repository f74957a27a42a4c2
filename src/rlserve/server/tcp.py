"""The binary carrier: length-prefixed msgpack frames over TCP (asyncio, uvloop when present).

Requests on one connection are handled in order. While a ``get_action`` waits for its batched
forward pass, later frames of the same connection wait in a backlog, so replies and episode state
follow the order the client sent (a client may pipeline). A connection that sends a frame over the
size limit gets an error and is closed: the stream cannot be resynchronised. A connection whose
``hello`` fails (wrong token or version) is closed after the error reply.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from typing import Any, cast

from rlserve.errors import FrameTooLargeError, ProtocolError
from rlserve.protocol.codec import decode, encode
from rlserve.protocol.framing import FrameDecoder, frame
from rlserve.protocol.limits import Limits
from rlserve.protocol.messages import Hello, error_reply, parse_request, valid_request_id
from rlserve.server.service import Service, Session

MAX_BACKLOG_FRAMES = 1024
"""Frames a connection may have waiting before the server stops reading from it."""


class BinaryConnection(asyncio.Protocol):
    """One client connection of the binary carrier."""

    def __init__(self, service: Service, limits: Limits, registry: set[BinaryConnection]):
        self._registry = registry
        self._service = service
        self._limits = limits
        self._decoder = FrameDecoder(limits.max_frame_bytes)
        self._session = Session()
        self._backlog: deque[bytes] = deque()
        self._deferred = False
        self._reading_paused = False
        self._transport: asyncio.Transport | None = None
        self._closing = False
        self._replied = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Count the client."""
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self._transport = cast(asyncio.Transport, transport)
        self._registry.add(self)
        self._service.stats.clients += 1

    def connection_lost(self, exc: Exception | None) -> None:
        """Uncount the client; its episodes stay open until they end or go idle."""
        self._service.stats.clients -= 1
        self._transport = None
        self._registry.discard(self)

    def data_received(self, data: bytes) -> None:
        """Split the bytes into frames and handle them in order."""
        try:
            self._backlog.extend(self._decoder.feed(data))
        except FrameTooLargeError as exc:
            self._write(error_reply(None, exc.code, str(exc)))
            self._close()
            return
        if len(self._backlog) > MAX_BACKLOG_FRAMES and self._transport is not None:
            self._transport.pause_reading()
            self._reading_paused = True
        self._drain()

    def _drain(self) -> None:
        while self._backlog and not self._deferred and not self._closing:
            body = self._backlog.popleft()
            raw: Any = None
            try:
                raw = decode(body, self._limits)
                request = parse_request(raw, self._limits)
            except ProtocolError as exc:
                self._service.stats.count_error(exc.code)
                self._write(error_reply(valid_request_id(raw), exc.code, str(exc)))
                continue
            if isinstance(request, Hello):
                self._service.handle(request, self._session, self._reply_hello)
                continue
            # A deferred reply (get_action) later comes through _write, which resumes the backlog;
            # a request may also be answered during handle() even when it could have waited.
            self._replied = False
            deferred = self._service.handle(request, self._session, self._write)
            self._deferred = deferred and not self._replied
        if self._reading_paused and len(self._backlog) < MAX_BACKLOG_FRAMES // 2:
            if self._transport is not None:
                self._transport.resume_reading()
            self._reading_paused = False

    def _reply_hello(self, reply: dict[str, Any]) -> None:
        self._write(reply)
        if reply["type"] == "error":
            self._close()

    def _write(self, reply: dict[str, Any]) -> None:
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.write(frame(encode(reply)))
        self._replied = True
        if self._deferred:
            self._deferred = False
            asyncio.get_running_loop().call_soon(self._drain)

    def close(self) -> None:
        """Close the connection; nothing more is read from it."""
        self._close()

    def _close(self) -> None:
        self._closing = True
        self._backlog.clear()
        if self._transport is not None:
            self._transport.close()


class BinaryServer:
    """The listening socket of the binary carrier and its open connections."""

    def __init__(self, server: asyncio.Server, connections: set[BinaryConnection]):
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
    service: Service, limits: Limits, host: str, port: int, *, tls: ssl.SSLContext | None = None
) -> BinaryServer:
    """Listen for binary-carrier connections, with TLS when ``tls`` is given.

    A failed handshake (a plain-text client, an unknown certificate authority on the client's
    side) closes that connection before any frame is read; asyncio logs it only in debug mode.
    """
    loop = asyncio.get_running_loop()
    connections: set[BinaryConnection] = set()
    server = await loop.create_server(
        lambda: BinaryConnection(service, limits, connections),
        host,
        port,
        reuse_address=True,
        ssl=tls,
        ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT if tls is not None else None,
    )
    return BinaryServer(server, connections)
