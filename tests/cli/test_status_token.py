"""Where ``rlserve status`` sends the token: only to an address the user gave, or to loopback
from a run folder, and never along a redirect (``rlserve.cli.status``)."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from rlserve.cli.status import run_status
from rlserve.errors import ConfigError


def test_a_run_folder_cannot_steer_the_token_off_this_machine(tmp_path: Path) -> None:
    run = tmp_path / "sent"
    run.mkdir()
    endpoints = {"state": "running", "pid": os.getpid(), "machine": "another-host"}
    # 192.0.2.0/24 is for documentation: the check refuses before any connection is made.
    endpoints["http"] = {"host": "192.0.2.1", "port": 9901}
    (run / "endpoints.json").write_text(json.dumps(endpoints))
    with pytest.raises(ConfigError, match=r"names 192\.0\.2\.1, not this machine's loopback"):
        run_status(str(run), token="s3cret")


class _Recorder(BaseHTTPRequestHandler):
    """Answers health, redirects metrics to ``target``, and records the headers it was sent."""

    target = ""
    seen: list[dict[str, str]] = []

    def do_GET(self) -> None:  # http.server's name
        type(self).seen.append(dict(self.headers))
        if self.path == "/v1/health" or not self.target:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b"{}")
            return
        self.send_response(302)
        self.send_header("Location", f"{self.target}{self.path}")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def servers() -> Iterator[tuple[str, list[dict[str, str]]]]:
    """A redirecting server, and the list of requests the one it redirects to was sent."""
    other_class = type("Other", (_Recorder,), {"seen": [], "target": ""})
    other = ThreadingHTTPServer(("127.0.0.1", 0), other_class)
    redirect_class = type(
        "Redirect", (_Recorder,), {"seen": [], "target": f"http://127.0.0.1:{other.server_port}"}
    )
    redirecting = ThreadingHTTPServer(("127.0.0.1", 0), redirect_class)
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in (other, redirecting)]
    for thread in threads:
        thread.start()
    try:
        yield f"http://127.0.0.1:{redirecting.server_port}", other_class.seen
    finally:
        for server in (other, redirecting):
            server.shutdown()
            server.server_close()


@pytest.mark.timeout(30)
def test_the_token_does_not_follow_a_redirect(servers: tuple[str, list[dict[str, str]]]) -> None:
    address, seen_elsewhere = servers
    with pytest.raises(ConfigError, match="HTTP 302"):
        run_status(address, token="s3cret", timeout=10)
    assert seen_elsewhere == []
