"""A local-inference client ships what it holds when the interpreter exits without ``close()``
(the README's loop once lost a third of 100 episodes that way), ``with PolicyClient(...)``
closes it, and what cannot be shipped at exit is named in a warning."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

WORKER = Path(__file__).with_name("exit_worker.py")
EPISODES = 40


@pytest.fixture(scope="module")
def server(module_launcher: Any) -> Any:
    handle = module_launcher("--seed", "3")
    handle.wait_for_weights()
    return handle


def _received(server: Any) -> tuple[int, int]:
    metrics = server.metrics()
    return int(metrics["episodes/completed"]), int(metrics["samples/steps_reported"])


def _start(mode: str, address: str, count: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(WORKER), mode, address, str(count)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _delivered(server: Any, before: tuple[int, int], played: dict[str, int]) -> tuple[int, int]:
    """Episodes and steps the server received since ``before``, waiting a little for them."""
    deadline = time.monotonic() + 10.0
    while True:
        episodes, steps = _received(server)
        got = (episodes - before[0], steps - before[1])
        if got == (played["episodes"], played["steps"]) or time.monotonic() > deadline:
            return got
        time.sleep(0.1)


@pytest.mark.parametrize("mode", ["no-close", "with"])
def test_every_episode_reaches_the_server(server: Any, mode: str) -> None:
    before = _received(server)
    worker = _start(mode, server.address, EPISODES)
    out, err = worker.communicate(timeout=120)
    assert worker.returncode == 0, err
    played = json.loads(out.strip().splitlines()[-1])
    assert _delivered(server, before, played) == (EPISODES, played["steps"]), err
    assert "not delivered" not in err, err


def test_exit_warns_what_the_gone_server_never_got(launch_server: Any) -> None:
    server = launch_server("--seed", "4")
    server.wait_for_weights()
    worker = _start("server-gone", server.address, 5)
    assert worker.stdout is not None and worker.stdin is not None
    played = json.loads(worker.stdout.readline())
    server.stop()
    _, err = worker.communicate("exit\n", timeout=60)
    assert worker.returncode == 0, err
    assert f"{played['steps']} steps of 5 episodes were not delivered" in err, err
    assert "with PolicyClient(...)" in err, err
