"""uvicorn's h11 protocol with a request deadline and a hard connection cap.

uvicorn has no timeout on receiving a request: ``timeout_keep_alive`` only runs between requests
and is reset by every byte, so a client that sends its headers one byte at a time (slow-loris)
holds a connection for ever. Here a connection must deliver a request's headers within
``request_timeout`` seconds of connecting or of its previous response; the body has its own
deadline in the handler (:mod:`rlserve.server.http`). And ``limit_concurrency`` only answers 503
once a request arrives, so a connection over the cap is answered 503 and closed at once.

The same protocol serves HTTP requests that arrive on the binary port
(:func:`shared_port_protocol`); there the header deadline counts from the connect.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any, cast

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from rlserve.protocol.replies import ErrorReply
from rlserve.server.config import ServerConfig
from rlserve.server.throttled_log import SERVER_LOG


def _response_503(max_connections: int) -> bytes:
    refusal = ErrorReply(
        None,
        "capacity",
        f"the server has {max_connections} open HTTP connections, its limit; retry later or "
        "ask the operator to raise http_max_connections",
    )
    body = json.dumps(refusal.to_wire()).encode()
    head = (
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
        f"connection: close\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def deadline_protocol(request_timeout: float, max_connections: int) -> type[H11Protocol]:
    """An h11 protocol class (for ``uvicorn.Config(http=...)``) enforcing the deadlines.

    Args:
        request_timeout: Seconds a connection has to send a request's headers, counted from the
            connection or its previous response.
        max_connections: Open connections beyond which a new one is answered 503 and closed.
    """

    class DeadlineH11Protocol(H11Protocol):
        """h11 with a header deadline and a hard connection cap."""

        _rl_waiting_since = 0.0
        _rl_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            if len(self.connections) >= max_connections:
                SERVER_LOG.warn(
                    "http_max_connections",
                    f"refused an HTTP connection: {max_connections} are open "
                    "(raise http_max_connections if the clients are legitimate)",
                )
                transport.write(_response_503(max_connections))
                transport.close()
                return
            super().connection_made(transport)
            self._rl_waiting_since = self.loop.time()
            self._rl_timer = self.loop.call_later(request_timeout, self._rl_check)

        def connection_lost(self, exc: Exception | None) -> None:
            if self.transport is None:  # refused in connection_made
                return
            if self._rl_timer is not None:
                self._rl_timer.cancel()
                self._rl_timer = None
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self.transport is None:
                return
            super().data_received(data)

        def backdate(self, opened_at: float) -> None:
            """Count the header deadline from ``opened_at``: the connect, on the shared port."""
            if self.transport is None or self._rl_timer is None:
                return
            self._rl_waiting_since = opened_at
            self._rl_timer.cancel()
            self._rl_timer = self.loop.call_at(opened_at + request_timeout, self._rl_check)

        def on_response_complete(self) -> None:
            self._rl_waiting_since = self.loop.time()
            super().on_response_complete()

        def _rl_check(self) -> None:
            self._rl_timer = None
            if self.transport is None or self.transport.is_closing():
                return
            now = self.loop.time()
            in_request = self.cycle is not None and not self.cycle.response_complete
            if not in_request and now - self._rl_waiting_since >= request_timeout:
                SERVER_LOG.warn(
                    "http_request_timeout",
                    f"closed an HTTP connection that sent no complete request headers within "
                    f"{request_timeout:g} s",
                )
                self.transport.close()
                return
            wait = request_timeout - (now - self._rl_waiting_since)
            self._rl_timer = self.loop.call_later(max(wait, 0.05), self._rl_check)

    return DeadlineH11Protocol


def shared_port_protocol(server: uvicorn.Server) -> Callable[[], asyncio.Protocol]:
    """A factory of ``server``'s HTTP protocol for connections the binary port hands over.

    They share ``server``'s configuration (the deadlines, caps and app above) and its connection
    set, so ``http_max_connections`` counts both ports together and uvicorn's shutdown closes
    them too.
    """
    config = server.config
    if not config.loaded:
        config.load()
    protocol = cast(type[H11Protocol], config.http_protocol_class)

    def make() -> asyncio.Protocol:
        # Lifespan is off, so the app state is empty.
        return protocol(config=config, server_state=server.server_state, app_state={})

    return make


def protocol_kwargs(config: ServerConfig) -> dict[str, Any]:
    """The ``uvicorn.Config`` keyword arguments of the HTTP carrier's hygiene."""
    return {
        "http": deadline_protocol(config.http_request_timeout, config.http_max_connections),
        "timeout_keep_alive": config.http_idle_timeout,
        # uvicorn answers 503 past this many connections or running requests; it counts the
        # asking connection itself.
        "limit_concurrency": config.http_max_connections + 1,
        # Headers larger than this are refused by h11 (431 / connection closed).
        "h11_max_incomplete_event_size": 64 * 1024,
    }
