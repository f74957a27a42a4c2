"""``rlserve serve --resume`` of a folder whose server runs is refused (it once started a second
server that overwrote the first's checkpoints and marked its endpoints.json stopped); the
folder is free again once the server stops, or is killed with kill -9."""

from __future__ import annotations

import json
import signal
from typing import Any

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


def test_a_second_server_on_a_live_run_folder_is_refused(
    launch_server: Any, run_rlserve: Any
) -> None:
    first = launch_server("--seed", "1")
    run = first.run_folder
    before = json.loads((run / "endpoints.json").read_text())
    checkpoints = sorted((run / "checkpoints").glob("*"))
    done = run_rlserve(
        "serve", "--resume", str(run), "--port", "0", "--http-port", "0", "--no-progress"
    )
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert lines == [
        f"rlserve: error: {run} is in use by pid {first.process.pid}; stop that process first "
        "(one process writes a run at a time)"
    ], done.stderr
    # The live server's files are untouched and `rlserve status` still finds it running.
    assert json.loads((run / "endpoints.json").read_text()) == before
    assert sorted((run / "checkpoints").glob("*")) == checkpoints
    status = run_rlserve("status", str(run))
    assert status.returncode == 0, status.stderr
    assert first.alive()

    # Stopped cleanly: the folder is free.
    assert first.stop() == 0
    second = launch_server(resume=run)
    assert json.loads((run / "endpoints.json").read_text())["pid"] == second.process.pid
    # Killed with kill -9: no stale lock is left behind.
    second.stop(signal.SIGKILL)
    third = launch_server(resume=run)
    assert third.alive()
    assert run_rlserve("status", str(run)).returncode == 0
