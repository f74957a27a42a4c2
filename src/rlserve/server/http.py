"""The HTTP/JSON carrier (Starlette): the same messages as the binary carrier, for any language.

``POST /v1/<type>`` takes a request's fields as a JSON object (``type`` comes from the path, ``id``
is optional) and answers with the reply as JSON; errors use HTTP status codes and the same
``error`` message body. With a token, requests need ``Authorization: Bearer <token>``. Episodes are
owned per ``X-RLServe-Client`` header (default ``anonymous``). ``GET /v1/health`` needs no token;
``GET /v1/metrics`` (JSON) and ``GET /metrics`` (Prometheus text) do.
"""

from __future__ import annotations

import asyncio
import hmac
import math
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from starlette.applications import Starlette
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from rlserve import __version__
from rlserve.errors import LimitExceededError, ProtocolError
from rlserve.protocol.codec import encode_json, to_jsonable
from rlserve.protocol.limits import PROTOCOL_VERSION
from rlserve.protocol.messages import (
    REQUEST_TYPES,
    error_reply,
    parse_request,
    valid_request_id,
)
from rlserve.server.service import Service, Session, identity_key

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
}
"""HTTP status of an ``error`` reply, by its code (others: 400)."""

MAX_HTTP_SESSIONS = 10_000
"""Distinct ``X-RLServe-Client`` names remembered at once."""


class _StatsCollector:
    """Exposes the server's counters to prometheus_client."""

    def __init__(self, service: Service):
        self._service = service

    def collect(self) -> Any:
        for name, value in self._service.stats.snapshot().items():
            metric = "rlserve_" + name.replace("/", "_")
            yield GaugeMetricFamily(metric, f"rlserve {name}", value=float(value))


def _json(payload: dict[str, Any], status: int = 200) -> Response:
    return Response(encode_json(payload), status_code=status, media_type="application/json")


def build_http_app(
    service: Service,
    token: str | None,
    health_state: Callable[[], dict[str, Any]] | None = None,
) -> Starlette:
    """The Starlette application of the HTTP carrier.

    Args:
        service: Handles the messages.
        token: The shared secret, or None.
        health_state: Adds ``status`` ("ok" or "degraded") and ``problems`` to the health reply.
    """
    sessions: dict[str, Session] = {}
    registry = CollectorRegistry(auto_describe=True)
    registry.register(_StatsCollector(service))
    limits = service.limits

    def authorised(request: HTTPRequest) -> bool:
        if token is None:
            return True
        header = request.headers.get("authorization", "")
        scheme, _, value = header.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(value.encode(), token.encode())

    def unauthorised() -> Response:
        return _json(
            error_reply(
                None,
                "unauthorized",
                "missing or wrong token: send the header 'Authorization: Bearer <token>'",
            ),
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
        return PlainTextResponse(generate_latest(registry).decode())

    async def message(request: HTTPRequest) -> Response:
        kind = request.path_params["kind"]
        if kind not in REQUEST_TYPES:
            return _json(
                error_reply(
                    None,
                    "decode_error",
                    f"unknown message type '{kind}'; known: {', '.join(REQUEST_TYPES)}",
                ),
                404,
            )
        if not authorised(request):
            return unauthorised()
        raw: Any = None
        try:
            raw = await _read_json(request, limits.max_frame_bytes)
            raw["type"] = kind
            if kind == "hello":
                raw.setdefault("token", token)
            parsed = parse_request(raw, limits)
        except ProtocolError as exc:
            return _json(
                error_reply(valid_request_id(raw), exc.code, str(exc)),
                STATUS_FOR_CODE.get(exc.code, 400),
            )
        # The header is the client identity (a bearer secret): its episodes are its own.
        client = request.headers.get("x-rlserve-client", "anonymous")
        if not 1 <= len(client) <= limits.max_id_length:
            message = f"header X-RLServe-Client must have 1 to {limits.max_id_length} characters"
            return _json(error_reply(None, "limit_exceeded", message), 413)
        session = sessions.get(client)
        if session is None:
            if len(sessions) >= MAX_HTTP_SESSIONS:
                # Sessions only hold a name; episode ownership is by key, so forgetting the
                # oldest loses nothing.
                sessions.pop(next(iter(sessions)))
            session = sessions[client] = Session(
                name=client, key=identity_key(client), authenticated=True
            )
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        service.handle(parsed, session, future.set_result)
        reply = await future
        status = (
            STATUS_FOR_CODE.get(reply.get("code", ""), 400) if reply["type"] == "error" else 200
        )
        return _json(to_jsonable(reply), status)

    return Starlette(
        routes=[
            Route("/v1/health", health, methods=["GET"]),
            Route("/v1/metrics", metrics_json, methods=["GET"]),
            Route("/metrics", metrics_prometheus, methods=["GET"]),
            Route("/v1/{kind}", message, methods=["POST"]),
        ]
    )


async def _read_json(request: HTTPRequest, max_bytes: int) -> dict[str, Any]:
    import json

    from rlserve.errors import DecodeError

    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise LimitExceededError(f"body of {declared} bytes is over the limit of {max_bytes}")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > max_bytes:
            raise LimitExceededError(f"body is over the limit of {max_bytes} bytes")
    if not body:
        return {}
    try:
        value = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise DecodeError(f"body is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise DecodeError("the body must be a JSON object of the message's fields")
    return value
