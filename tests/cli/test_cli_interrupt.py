"""Ctrl-C in ``rlserve train`` and ``rlserve demo``: one line with what was saved and how to
go on, exit status 130, no traceback."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import rlserve_command, server_env

INTERRUPTED = 130


def _start(tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*rlserve_command(), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env=server_env(),
        cwd=tmp_path,
    )


def _wait(process: subprocess.Popen[str], ready: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 90
    while not ready():
        if process.poll() is not None:
            out, err = process.communicate()
            raise AssertionError(f"exited ({process.returncode}) before {what}:\n{out}\n{err}")
        assert time.monotonic() < deadline, f"no {what} within 90 s"
        time.sleep(0.1)


def _interrupt(process: subprocess.Popen[str]) -> tuple[str, str]:
    process.send_signal(signal.SIGINT)
    try:
        return process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


@pytest.mark.timeout(180)
def test_ctrl_c_in_train_saves_and_says_how_to_resume(tmp_path: Path) -> None:
    run = Path("runs") / "t"
    process = _start(
        tmp_path, "train", "--env", "CartPole-v1", "--name", "t", "--num-envs", "2",
        "--iteration-steps", "256", "--checkpoint-every", "1", "--no-progress",
    )  # fmt: skip
    checkpoints = tmp_path / run / "checkpoints"
    _wait(process, lambda: any(checkpoints.glob("ckpt_*.pt")), "a first checkpoint")
    out, err = _interrupt(process)
    assert process.returncode == INTERRUPTED, (out, err)
    assert "Traceback" not in out + err
    assert err == ""
    lines = out.strip().splitlines()
    assert lines[0] == f"rlserve: training in {run}"
    assert len(lines) == 2, out
    assert lines[1].startswith("rlserve: interrupted after ")
    assert f"saved in {run}; continue with 'rlserve train --resume {run}'" in lines[1]
    state = json.loads((tmp_path / run / "algorithm.json").read_text())
    assert f"{state['env_steps_sampled']:,} env steps" in lines[1]


@pytest.mark.timeout(180)
def test_ctrl_c_in_demo_saves_and_says_how_to_go_on(tmp_path: Path) -> None:
    process = _start(
        tmp_path, "demo", "cartpole", "--clients", "1", "--no-progress", "--run-dir", "runs"
    )

    def stepping() -> bool:
        # The clients' steps reach the run's experience log as they come.
        return any(p.stat().st_size for p in tmp_path.glob("runs/*/experience/*") if p.is_file())

    _wait(process, stepping, "logged experience")
    out, err = _interrupt(process)
    assert process.returncode == INTERRUPTED, (out, err)
    assert "Traceback" not in out + err
    lines = out.strip().splitlines()
    assert len(lines) == 1, out
    (run,) = (tmp_path / "runs").iterdir()
    folder = Path("runs") / run.name
    assert lines[0].startswith("rlserve: interrupted after ")
    assert f"saved in {folder}" in lines[0]
    assert f"'rlserve serve --resume {folder}'" in lines[0]
    assert list((run / "checkpoints").glob("ckpt_*.pt"))
