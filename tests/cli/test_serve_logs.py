"""``rlserve serve`` logs rlserve's and uvicorn's lines in one format, on stderr (plain text
off a terminal) and in the run folder's ``rlserve.log``; ``--log-level`` filters both."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest

from rlserve.cli.logs import LOG_FILE

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

LINE = re.compile(
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR) +(rlserve|uvicorn)[.\w]*: "
)


def test_the_run_folder_log_has_rlserve_and_uvicorn_lines_in_one_format(
    launch_server: Any,
) -> None:
    server = launch_server("--log-level", "debug")
    reply = httpx.get(f"{server.http_url}/v1/health", timeout=10)
    assert reply.status_code == 200
    assert server.stop() == 0
    lines = (server.run_folder / LOG_FILE).read_text().splitlines()
    assert lines and all(LINE.match(line) for line in lines), lines
    assert any(" rlserve.server: rlserve listening on " in line for line in lines), lines
    assert any(" uvicorn.access: " in line and "GET /v1/health" in line for line in lines), lines
    # stderr is a file here: the same plain lines, no colour.
    stderr = server.log()
    assert "\x1b" not in stderr
    assert any(" uvicorn.access: " in line and LINE.match(line) for line in stderr.splitlines())


def test_log_level_warning_hides_info_lines(launch_server: Any) -> None:
    server = launch_server("--log-level", "warning")
    httpx.get(f"{server.http_url}/v1/health", timeout=10).raise_for_status()
    assert server.stop() == 0
    # The listening line is still printed on stdout (launchers read it there) ...
    assert "rlserve listening on" in server.stdout()
    # ... but no INFO line is logged, on stderr or in the run folder.
    written = (server.run_folder / LOG_FILE).read_text() + server.log()
    assert " INFO " not in written and "GET /v1/health" not in written, written
