"""The HTTP/JSON carrier (Starlette): the same messages as the binary carrier, for any language.

``POST /v1/<type>`` takes a request's fields as a JSON object (``type`` comes from the path, ``id``
is optional) and answers with the reply as JSON; errors use HTTP status codes and the same
``error`` message body. With a token, requests need ``Authorization: Bearer <token>``. Episodes are
owned per ``X-RLServe-Client`` header (default ``anonymous``). ``GET /v1/health`` needs no token;
``GET /v1/metrics`` (JSON) and ``GET /metrics`` (Prometheus text) do. Any other path is a 404 and a
known path with the wrong method a 405 (with ``Allow``), both with a JSON ``error`` body.
The server's dashboard (``GET /`` and ``/dashboard/...``) is in :mod:`~rlserve.server.dashboard`.

Browser safety: ``POST /v1/*`` requires ``Content-Type: application/json`` (415 otherwise, which
also stops "simple" cross-site form posts); a request with an ``Origin`` header other than the
server's own is refused with 403 unless the origin is in ``http_allowed_origins``; on a loopback
bind the ``Host`` header must name a loopback host (421 otherwise), which defeats DNS rebinding.
Large bodies are parsed off the event loop; a body must arrive within ``http_request_timeout``.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
from prometheus_client import CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from rlserve.errors import LimitExceededError, RLServeError
from rlserve.protocol.codec import encode_json, to_jsonable
from rlserve.protocol.limits import PROTOCOL_VERSION
from rlserve.protocol.messages import REQUEST_TYPES, parse_request, valid_request_id
from rlserve.protocol.replies import ErrorReply
from rlserve.server.config import ServerConfig, is_loopback
from rlserve.server.dashboard import DASHBOARD_PATHS, dashboard_routes
from rlserve.server.dashboard_feed import DashboardFeed
from rlserve.server.json_body import parse_body
from rlserve.server.prometheus import TEXT_FORMAT, StatsCollector
from rlserve.server.replies import INTERNAL_ERROR
from rlserve.server.service import Service
from rlserve.server.sessions import Session, identity_key
from rlserve.server.throttled_log import SERVER_LOG
from rlserve.version import __version__

STATUS_FOR_CODE = {
    "unauthorized": 401,
    "version_mismatch": 400,
    "episode_error": 409,
    "bad_value": 422,
    "unsupported_space": 422,
    "capacity": 429,
    "decode_error": 400,
    "limit_exceeded": 413,
    "frame_too_large": 413,
    "timeout": 408,
    INTERNAL_ERROR: 500,
}
"""HTTP status of an ``error`` reply, by its code (others: 400)."""

KNOWN_PATHS: dict[str, tuple[str, ...]] = {
    **{f"/v1/{kind}": ("POST",) for kind in REQUEST_TYPES},
    "/v1/health": ("GET", "HEAD"),
    "/v1/metrics": ("GET", "HEAD"),
    "/metrics": ("GET", "HEAD"),
    **DASHBOARD_PATHS,
}
"""Every path the HTTP carrier serves, with its methods (others: 405, unknown paths: 404); the
dashboard's only when the server has one."""

MAX_HTTP_SESSIONS = 10_000
"""Distinct ``X-RLServe-Client`` names remembered at once."""

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]", "::1")
"""Host names a loopback-bound server answers to."""


@dataclass(frozen=True)
class BrowserPolicy:
    """What the HTTP carrier accepts from browsers and foreign hosts.

    Attributes:
        loopback_only: The server is bound to a loopback address: ``Host`` must name one.
        allowed_origins: ``Origin`` values allowed besides the server's own.
        request_timeout: Seconds a client has to send a request body.
    """

    loopback_only: bool = True
    allowed_origins: tuple[str, ...] = ()
    request_timeout: float = 30.0

    @classmethod
    def from_config(cls, config: ServerConfig) -> BrowserPolicy:
        """The policy a server configuration sets."""
        return cls(
            is_loopback(config.host), config.http_allowed_origins, config.http_request_timeout
        )


def _host_name(host: str) -> str:
    """The name part of a ``Host`` header (``[::1]:9901`` -> ``[::1]``, ``a:80`` -> ``a``)."""
    if host.startswith("["):
        return host[: host.find("]") + 1] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _names_loopback(name: str) -> bool:
    """Whether a Host name is a loopback one (one of :data:`LOOPBACK_HOSTS`, or an address).

    Any loopback address written out is (127.0.0.3 for a server bound there): DNS rebinding
    needs a name.
    """
    if name.lower() in LOOPBACK_HOSTS:
        return True
    try:
        return ipaddress.ip_address(name.strip("[]")).is_loopback
    except ValueError:
        return False


def _refusal(request: HTTPRequest, policy: BrowserPolicy) -> Response | None:
    """A 421/403 response when the request's Host or Origin is not acceptable, else None."""
    host = request.headers.get("host", "")
    if policy.loopback_only and not _names_loopback(_host_name(host)):
        return _json(
            ErrorReply(
                None,
                "forbidden",
                f"Host header {host!r} does not name this loopback server; use localhost, "
                "127.0.0.1 or [::1] (a foreign Host is how DNS rebinding reaches a local server)",
            ).to_wire(),
            421,
        )
    origin = request.headers.get("origin")
    if origin is not None and origin not in policy.allowed_origins:
        own = {f"{request.url.scheme}://{host}"}
        if origin not in own:
            return _json(
                ErrorReply(
                    None,
                    "forbidden",
                    f"cross-origin request from {origin!r} refused; allow it with the server "
                    "option http_allowed_origins",
                ).to_wire(),
                403,
            )
    return None


CLOSE_AFTER = {"Connection": "close"}
"""The header of a reply to a body not read to its end: the connection is mid-request, so it
closes after the reply (the rest of the body cannot be told from a next request)."""


def _is_json(request: HTTPRequest) -> bool:
    media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    return media == "application/json"


def _json(
    payload: dict[str, Any], status: int = 200, headers: dict[str, str] | None = None
) -> Response:
    return Response(
        encode_json(payload), status_code=status, headers=headers, media_type="application/json"
    )


def build_http_app(
    service: Service,
    token: str | None,
    policy: BrowserPolicy | None = None,
    health_state: Callable[[], dict[str, Any]] | None = None,
    dashboard: DashboardFeed | None = None,
) -> Starlette:
    """The Starlette application of the HTTP carrier.

    Args:
        service: Handles the messages.
        token: The shared secret, or None.
        policy: Which browser origins and hosts may call it, and its deadlines.
        health_state: Adds ``status`` ("ok" or "degraded") and ``problems`` to the health reply.
        dashboard: What the dashboard shows (None: no dashboard routes).
    """
    policy = policy or BrowserPolicy()
    sessions: dict[str, Session] = {}
    registry = CollectorRegistry(auto_describe=True)
    registry.register(StatsCollector(service.stats.snapshot))
    limits = service.limits

    def refused(
        request_id: Any, code: str, problem: str, status: int, headers: dict[str, str] | None = None
    ) -> Response:
        """An error reply of the HTTP layer itself, counted in ``server/errors``.

        The service counts its own error replies, and the binary carrier its refusals.
        """
        service.stats.count_error(code)
        return _json(ErrorReply(request_id, code, problem).to_wire(), status, headers)

    def authorised(request: HTTPRequest) -> bool:
        if token is None:
            return True
        header = request.headers.get("authorization", "")
        scheme, _, value = header.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(value.encode(), token.encode())

    def unauthorised() -> Response:
        return refused(
            None,
            "unauthorized",
            "missing or wrong token: send the header 'Authorization: Bearer <token>'",
            401,
        )

    async def health(request: HTTPRequest) -> Response:
        return JSONResponse(
            {
                "status": "ok",
                "protocol_version": PROTOCOL_VERSION,
                "server_version": __version__,
                "weights_version": service.stats.weights_version,
                **(health_state() if health_state is not None else {}),
            }
        )

    async def metrics_json(request: HTTPRequest) -> Response:
        if not authorised(request):
            return unauthorised()
        snapshot = {
            k: (None if isinstance(v, float) and not math.isfinite(v) else v)
            for k, v in service.stats.snapshot().items()
        }
        return JSONResponse(snapshot)

    async def metrics_prometheus(request: HTTPRequest) -> Response:
        if not authorised(request):
            return unauthorised()
        return Response(generate_latest(registry), media_type=TEXT_FORMAT)

    async def message(request: HTTPRequest) -> Response:
        kind = request.scope["path"].removeprefix("/v1/")
        if not authorised(request):
            return unauthorised()
        if not _is_json(request):
            return refused(
                None,
                "decode_error",
                "POST /v1/* needs the header 'Content-Type: application/json', got "
                f"{request.headers.get('content-type')!r}",
                415,
            )
        raw: Any = None
        body: bytes | None = None
        try:
            body = await asyncio.wait_for(
                _read_body(request, limits.max_frame_bytes), policy.request_timeout
            )
            raw = await parse_body(body, arrays_for_obs, limits) if body else {}
            raw["type"] = kind
            if kind == "hello" and raw.get("token") is None:
                # The Bearer header was checked; a token left out or null is not a wrong one.
                raw["token"] = token
            parsed = parse_request(raw, limits)
        except RLServeError as exc:  # a ProtocolError, or a SpaceError of an out-of-range reward
            status = STATUS_FOR_CODE.get(exc.code, 400)
            closing = CLOSE_AFTER if body is None else None
            return refused(valid_request_id(raw), exc.code, str(exc), status, closing)
        except TimeoutError:
            return refused(
                None,
                "timeout",
                f"the request body did not arrive within {policy.request_timeout:g} s",
                408,
                CLOSE_AFTER,
            )
        except ClientDisconnect:
            SERVER_LOG.warn("http_disconnect", "an HTTP client disconnected mid-request")
            return Response(status_code=400)
        except Exception as exc:  # the parser's bug, but the body is at fault: answer it
            SERVER_LOG.warn("http_parse", f"unexpected error parsing an HTTP body: {exc!r}")
            return refused(valid_request_id(raw), "decode_error", f"malformed message: {exc}", 400)
        # The header is the client identity (a bearer secret): its episodes are its own.
        client = request.headers.get("x-rlserve-client", "anonymous")
        if not 1 <= len(client) <= limits.max_id_length:
            message = f"header X-RLServe-Client must have 1 to {limits.max_id_length} characters"
            return refused(valid_request_id(raw), "limit_exceeded", message, 413)
        session = sessions.get(client)
        if session is None:
            if len(sessions) >= MAX_HTTP_SESSIONS:
                # Sessions only hold a name; episode ownership is by key, so forgetting the
                # oldest loses nothing.
                sessions.pop(next(iter(sessions)))
            session = sessions[client] = Session(
                name=client, key=identity_key(client), authenticated=True, identity_by_hello=False
            )
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()

        def respond(reply: dict[str, Any]) -> None:
            # A retried seq that joined a pending get_action is answered later too; a caller
            # that has gone (its future cancelled) is skipped.
            if not future.done():
                future.set_result(reply)

        service.handle(parsed, session, respond)
        reply = await future
        status = (
            STATUS_FOR_CODE.get(reply.get("code", ""), 400) if reply["type"] == "error" else 200
        )
        return _json(to_jsonable(reply), status)

    # Box observations become arrays anyway: converting them in the parsing thread keeps a large
    # batch's list-to-array work off the event loop too.
    arrays_for_obs = all(
        isinstance(slot.observation_space, gym.spaces.Box) for slot in service.slots.values()
    )

    def guarded(handler: Any) -> Any:
        async def endpoint(request: HTTPRequest) -> Response:
            refusal = _refusal(request, policy)
            if refusal is not None:
                service.stats.count_error("forbidden")
                return refusal
            response: Response = await handler(request)
            return response

        return endpoint

    async def no_route(request: HTTPRequest) -> Response:
        """404 for a path the server does not have, 405 for a known path's wrong method."""
        path, method = request.scope["path"], request.method
        allowed = KNOWN_PATHS.get(path) if dashboard or path not in DASHBOARD_PATHS else None
        if allowed is not None and method not in allowed:
            return refused(
                None,
                "decode_error",
                f"{path} does not take {method}; use {' or '.join(allowed)}",
                405,
                headers={"Allow": ", ".join(allowed)},
            )
        if path.startswith("/v1/") and method == "POST":
            known = ", ".join(REQUEST_TYPES)
            problem = f"unknown message type '{path[4:]}'; known: {known}"
        else:
            problem = (
                f"no such path: {method} {path}; the server has POST /v1/<type> (a message "
                "type), GET /v1/health, GET /v1/metrics and GET /metrics"
                + (", and the dashboard at GET /" if dashboard else "")
            )
        return refused(None, "decode_error", problem, 404)

    routes = [Route(f"/v1/{kind}", guarded(message), methods=["POST"]) for kind in REQUEST_TYPES]
    routes += [
        Route("/v1/health", guarded(health), methods=["GET"]),
        Route("/v1/metrics", guarded(metrics_json), methods=["GET"]),
        Route("/metrics", guarded(metrics_prometheus), methods=["GET"]),
        *(
            dashboard_routes(dashboard, token, authorised, guarded, policy.request_timeout)
            if dashboard
            else []
        ),
        # Last: every other path or method, so that it gets the JSON error of section 4.3.
        Route("/{path:path}", _AnyMethod(guarded(no_route))),
    ]
    return Starlette(routes=routes)


class _AnyMethod:
    """An endpoint as a plain ASGI app, so that its route takes every method.

    Starlette limits a function endpoint to GET unless given a list of methods, which cannot
    name every method a client may send.
    """

    def __init__(self, handler: Callable[[HTTPRequest], Awaitable[Response]]):
        self._handler = handler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = await self._handler(HTTPRequest(scope, receive))
        await response(scope, receive, send)


async def _read_body(request: HTTPRequest, max_bytes: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise LimitExceededError(
            f"body of {declared} bytes is over the limit of {max_bytes} (the server's "
            "--max-frame-bytes)"
        )
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > max_bytes:
            raise LimitExceededError(
                f"body is over the limit of {max_bytes} bytes (the server's --max-frame-bytes)"
            )
    return bytes(body)
