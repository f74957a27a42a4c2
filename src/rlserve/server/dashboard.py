"""The dashboard's routes on the HTTP carrier: the page, its assets, its live stream.

``GET /`` is the page; ``GET /dashboard/assets/<file>`` its scripts and styles (shipped in the
package, no network needed); ``GET /dashboard/events`` a Server-Sent Events stream (an
``opening`` event with the history, then a ``sample`` each second); ``GET /dashboard/state``
the opening as JSON.

With a token, the page and its data need it like every other route, but a browser's EventSource
cannot send an ``Authorization`` header and a token in a URL ends up in history and logs. So the
page exchanges it once for a cookie: ``POST /dashboard/login`` (the login form) or
``GET /?token=...`` (a link) sets an ``HttpOnly``, ``SameSite=Strict`` cookie and redirects to the
clean ``/``. The cookie holds an HMAC of the token, never the token itself. The Host and Origin
checks of the carrier apply to every route here too.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import html
import json
import secrets
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from starlette.requests import Request as HTTPRequest
from starlette.responses import RedirectResponse, Response, StreamingResponse
from starlette.routing import Route

from rlserve.server.dashboard_feed import DashboardFeed

ASSETS = Path(__file__).parent / "dashboard"
"""The page's files, shipped in the package."""

ASSET_TYPES = {
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
    "uPlot.iife.min.js": "text/javascript; charset=utf-8",
    "uPlot.min.css": "text/css; charset=utf-8",
}
"""The files ``GET /dashboard/assets/<file>`` serves (no other path reaches the disk)."""

PAGE_HEADERS = {
    "Cache-Control": "no-store",
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; "
        "form-action 'self'"
    ),
    # same-origin, not no-referrer: with no-referrer a browser sends 'Origin: null' on the
    # login form's POST, which the Origin check refuses.
    "Referrer-Policy": "same-origin",
    "X-Content-Type-Options": "nosniff",
}
"""Headers of every dashboard response."""

MAX_LOGIN_BYTES = 4096
"""Largest login form body read."""

DASHBOARD_PATHS: dict[str, tuple[str, ...]] = {
    "/": ("GET", "HEAD"),
    "/dashboard/login": ("POST",),
    "/dashboard/events": ("GET", "HEAD"),
    "/dashboard/state": ("GET", "HEAD"),
}
"""The dashboard's paths with their methods (besides ``/dashboard/assets/<file>``)."""


def cookie_name(request: HTTPRequest) -> str:
    """The session cookie's name: one per port, as cookies do not tell ports apart."""
    port = request.url.port or (443 if request.url.scheme == "https" else 80)
    return f"rlserve_dashboard_{port}"


_SESSION_KEY = secrets.token_bytes(32)
"""This process's key for the cookie: a cookie says nothing about the token (no offline
guessing from a stolen cookie) and lapses when the server restarts."""


def cookie_value(token: str) -> str:
    """What the cookie holds: an HMAC of the token under this process's key."""
    return hmac.new(_SESSION_KEY, token.encode(), hashlib.sha256).hexdigest()


def dashboard_routes(
    feed: DashboardFeed,
    token: str | None,
    authorised: Callable[[HTTPRequest], bool],
    guarded: Callable[[Any], Any],
    request_timeout: float = 30.0,
) -> list[Route]:
    """The dashboard's routes.

    Args:
        feed: The samples to show.
        token: The server's shared secret, or None (then the dashboard is open, like the API).
        authorised: Whether a request carries the right ``Authorization`` header.
        guarded: Wraps an endpoint with the carrier's Host and Origin checks.
        request_timeout: Seconds the sign-in form's body has to arrive (as the API's bodies).
    """

    def signed_in(request: HTTPRequest) -> bool:
        if token is None or authorised(request):
            return True
        cookie = request.cookies.get(cookie_name(request), "")
        return hmac.compare_digest(cookie.encode(), cookie_value(token).encode())

    def signed_in_page(request: HTTPRequest) -> Response:
        response = RedirectResponse("/", status_code=303, headers=PAGE_HEADERS)
        if token is not None:
            response.set_cookie(
                cookie_name(request),
                cookie_value(token),
                httponly=True,
                samesite="strict",
                secure=request.url.scheme == "https",
            )
        return response

    def login_page(problem: str, status: int = 401) -> Response:
        page = (ASSETS / "login.html").read_text(encoding="utf-8")
        page = page.replace("{{problem}}", html.escape(problem))
        return Response(page, status, PAGE_HEADERS, "text/html; charset=utf-8")

    def right_token(given: str) -> bool:
        return token is not None and hmac.compare_digest(given.encode(), token.encode())

    async def page(request: HTTPRequest) -> Response:
        given = request.query_params.get("token")
        if given is not None:
            # A link with the token: exchange it at once, so the address bar loses it.
            if right_token(given) or token is None:
                return signed_in_page(request)
            return login_page("That token is wrong; enter the server's --token value.")
        if not signed_in(request):
            return login_page("This server has a token: enter its --token value to sign in.")
        body = (ASSETS / "index.html").read_bytes()
        return Response(body, 200, PAGE_HEADERS, "text/html; charset=utf-8")

    async def read_form(request: HTTPRequest) -> bytes | None:
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_LOGIN_BYTES:
                return None
        return body

    async def login(request: HTTPRequest) -> Response:
        # Open to anyone who can reach the port, so it gets the API's body deadline: a client
        # that stalls mid-body must not hold a connection for ever.
        try:
            body = await asyncio.wait_for(read_form(request), request_timeout)
        except TimeoutError:
            return login_page("The login form did not arrive in time.", 408)
        if body is None:
            return login_page("The login form was too large.", 413)
        form = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
        given = form.get("token", [""])[0]
        if token is None or right_token(given):
            return signed_in_page(request)
        if "token" not in form:
            return login_page(
                "No token field arrived: post the form (token=..., as "
                "application/x-www-form-urlencoded); a script may instead send "
                "'Authorization: Bearer <token>' with each request to the dashboard's pages."
            )
        return login_page("That token is wrong; enter the server's --token value.")

    def unauthorised() -> Response:
        problem = "sign in at / first (or send 'Authorization: Bearer <token>')"
        return Response(
            json.dumps({"type": "error", "id": None, "code": "unauthorized", "message": problem}),
            401,
            PAGE_HEADERS,
            "application/json",
        )

    async def state(request: HTTPRequest) -> Response:
        if not signed_in(request):
            return unauthorised()
        return Response(_json_text(feed.opening()), 200, PAGE_HEADERS, "application/json")

    async def events(request: HTTPRequest) -> Response:
        if not signed_in(request):
            return unauthorised()

        async def stream() -> AsyncIterator[str]:
            yield "retry: 2000\n"
            yield f"event: opening\ndata: {_json_text(feed.opening())}\n\n"
            async for sample in feed.follow():
                yield f"event: sample\ndata: {_json_text(sample)}\n\n"

        return StreamingResponse(
            stream(),
            media_type="text/event-stream",
            headers={**PAGE_HEADERS, "X-Accel-Buffering": "no"},
        )

    async def asset(request: HTTPRequest) -> Response:
        name = request.path_params["name"]
        media = ASSET_TYPES.get(name)
        if media is None:
            return Response(f"no such asset: {name}", 404, PAGE_HEADERS, "text/plain")
        return Response((ASSETS / name).read_bytes(), 200, PAGE_HEADERS, media)

    return [
        Route("/", guarded(page), methods=["GET"]),
        Route("/dashboard/login", guarded(login), methods=["POST"]),
        Route("/dashboard/events", guarded(events), methods=["GET"]),
        Route("/dashboard/state", guarded(state), methods=["GET"]),
        Route("/dashboard/assets/{name}", guarded(asset), methods=["GET"]),
    ]


def _json_text(value: Any) -> str:
    """One line of JSON (NaN was turned into null by the feed; refuse any left)."""
    return json.dumps(value, allow_nan=False, separators=(",", ":"))
