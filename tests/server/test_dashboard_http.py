"""The dashboard's routes and their sign-in rules, against a live server (docs/protocol.md 4.4)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from rlserve.server.dashboard import cookie_value

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

TOKEN = "dashboard-s3cret"


@pytest.fixture(scope="module")
def token_server(module_launcher: Any) -> Any:
    return module_launcher("--token", TOKEN)


@pytest.fixture(scope="module")
def open_server(module_launcher: Any) -> Any:
    return module_launcher()


def _client(server: Any) -> httpx.Client:
    return httpx.Client(base_url=server.http_url, timeout=30, follow_redirects=False)


@contextlib.contextmanager
def _signed_in(server: Any) -> Iterator[httpx.Client]:
    """A client holding the dashboard cookie, got by the login form."""
    with _client(server) as client:
        reply = client.post("/dashboard/login", data={"token": TOKEN})
        assert reply.status_code == 303, reply.text
        assert reply.headers["location"] == "/"
        yield client


def test_page_asks_for_the_token_and_never_shows_it(token_server: Any) -> None:
    with _client(token_server) as http:
        reply = http.get("/")
        assert reply.status_code == 401
        assert reply.headers["content-type"].startswith("text/html")
        assert 'action="/dashboard/login"' in reply.text
        assert TOKEN not in reply.text
        for path in ("/dashboard/state", "/dashboard/events"):
            refused = http.get(path)
            assert refused.status_code == 401
            assert refused.json()["code"] == "unauthorized"
            assert "sign in" in refused.json()["message"]


def test_token_link_is_exchanged_for_a_cookie_and_a_clean_address(token_server: Any) -> None:
    with _client(token_server) as http:
        reply = http.get("/", params={"token": TOKEN})
        assert reply.status_code == 303
        assert reply.headers["location"] == "/"
        cookie = reply.headers["set-cookie"]
        assert f"rlserve_dashboard_{token_server.http_port}=" in cookie
        assert "HttpOnly" in cookie
        assert "samesite=strict" in cookie.lower()
        assert TOKEN not in cookie  # an HMAC of it
        page = http.get("/")
        assert page.status_code == 200
        assert "/dashboard/assets/app.js" in page.text
        assert http.get("/dashboard/state").status_code == 200


def test_wrong_token_or_forged_cookie_is_refused(token_server: Any) -> None:
    with _client(token_server) as http:
        assert http.get("/", params={"token": "wrong"}).status_code == 401
        wrong = http.post("/dashboard/login", data={"token": "wrong"})
        assert wrong.status_code == 401
        assert "set-cookie" not in wrong.headers
        assert "That token is wrong" in http.post("/dashboard/login", data={"token": ""}).text
        as_json = http.post("/dashboard/login", json={"token": TOKEN})  # not a form
        assert as_json.status_code == 401 and "No token field arrived" in as_json.text
        http.cookies.set(f"rlserve_dashboard_{token_server.http_port}", cookie_value("wrong"))
        assert http.get("/dashboard/state").status_code == 401
        assert http.get("/").status_code == 401


def test_bearer_header_works_as_for_the_api(token_server: Any) -> None:
    with _client(token_server) as http:
        reply = http.get("/dashboard/state", headers={"Authorization": f"Bearer {TOKEN}"})
        assert reply.status_code == 200
        assert reply.json()["policies"] == ["default"]


def test_host_and_origin_checks_apply(token_server: Any) -> None:
    with _signed_in(token_server) as http:
        assert http.get("/dashboard/state").status_code == 200
        foreign = http.get("/dashboard/state", headers={"Origin": "http://evil.example"})
        assert foreign.status_code == 403
        login = http.post(
            "/dashboard/login", data={"token": TOKEN}, headers={"Origin": "http://evil.example"}
        )
        assert login.status_code == 403
        rebound = http.get("/", headers={"Host": f"evil.example:{token_server.http_port}"})
        assert rebound.status_code == 421
        # Any loopback address written out is no rebinding (a server bound to 127.0.0.3).
        literal = http.get(
            "/dashboard/state", headers={"Host": "127.0.0.3", "Authorization": f"Bearer {TOKEN}"}
        )
        assert literal.status_code == 200
        assert http.get("/", headers={"Host": "127.0.0.3.evil.example"}).status_code == 421
        own = f"http://127.0.0.1:{token_server.http_port}"
        assert http.get("/dashboard/state", headers={"Origin": own}).status_code == 200


def test_page_headers_forbid_framing_and_foreign_scripts(token_server: Any) -> None:
    with _signed_in(token_server) as http:
        page = http.get("/")
        csp = page.headers["content-security-policy"]
        assert "default-src 'self'" in csp
        assert "frame-ancestors 'none'" in csp
        assert page.headers["cache-control"] == "no-store"


def test_assets_ship_in_the_package(token_server: Any) -> None:
    with _client(token_server) as http:
        for name, media in (
            ("app.js", "text/javascript"),
            ("style.css", "text/css"),
            ("uPlot.iife.min.js", "text/javascript"),
            ("uPlot.min.css", "text/css"),
        ):
            reply = http.get(f"/dashboard/assets/{name}")
            assert reply.status_code == 200, name
            assert reply.headers["content-type"].startswith(media)
            assert len(reply.content) > 100
        assert http.get("/dashboard/assets/index.py").status_code == 404
        assert http.get("/dashboard/assets/..%2Fhttp.py").status_code == 404


def test_event_stream_sends_the_history_then_samples(token_server: Any) -> None:
    with _signed_in(token_server) as http, http.stream("GET", "/dashboard/events") as stream:
        assert stream.status_code == 200
        assert stream.headers["content-type"].startswith("text/event-stream")
        events: list[tuple[str, dict[str, Any]]] = []
        kind = ""
        for line in stream.iter_lines():
            if line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data: "):
                events.append((kind, json.loads(line[6:])))
                if len(events) == 3:
                    break
    assert [kind for kind, _ in events] == ["opening", "sample", "sample"]
    opening = events[0][1]
    assert opening["policies"] == ["default"]
    assert opening["history"], "the history has the samples taken since the start"
    sample = events[1][1]
    assert set(sample) >= {"env_steps", "totals", "policies", "clients", "checkpoints", "health"}
    assert sample["health"]["status"] == "ok"
    assert "return_mean" in sample["policies"]["default"]


def test_without_a_token_it_just_works(open_server: Any) -> None:
    with _client(open_server) as http:
        page = http.get("/")
        assert page.status_code == 200
        assert "rlserve dashboard" in page.text
        assert http.get("/dashboard/state").status_code == 200
        link = http.get("/", params={"token": "anything"})
        assert link.status_code == 303 and link.headers["location"] == "/"
        assert http.put("/").status_code == 405


def test_a_stalled_sign_in_form_is_cut_off_at_the_request_deadline(launch_server: Any) -> None:
    """The form is open to anyone who reaches the port: a half-sent body must not hold it."""
    import socket

    server = launch_server("--token", TOKEN, "--http-request-timeout", "1")
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as sock:
        sock.sendall(
            b"POST /dashboard/login HTTP/1.1\r\n"
            + f"Host: 127.0.0.1:{server.http_port}\r\n".encode()
            + b"Content-Type: application/x-www-form-urlencoded\r\n"
            b"Content-Length: 4000\r\n\r\ntoken=dash"
        )
        reply = sock.recv(4096)
    assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
    assert TOKEN.encode() not in reply
