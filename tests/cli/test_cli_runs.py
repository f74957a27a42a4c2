"""What the commands say about run folders (which command continues one, an untrained export)
and a closed output pipe (``rlserve status | head``)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from test_cli import assert_one_line_error

from conftest import rlserve_command, server_env

SMALL = ["--num-envs", "2", "--iteration-steps", "256", "--stop-steps", "512", "--no-progress"]


def _closed_stdout(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``rlserve ARGS`` with a stdout pipe whose reader has gone (``| head`` after it quit)."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run(
            [*rlserve_command(), *args],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            env=server_env(),
            cwd=cwd,
            check=False,
        )
    finally:
        os.close(write)


def _quiet_exit(done: subprocess.CompletedProcess[str]) -> None:
    assert done.returncode == 1, done.stderr
    assert done.stderr == ""


@pytest.mark.timeout(180)
def test_a_served_run_is_continued_by_serve_not_train(
    launch_server: Any, run_rlserve: Any, tmp_path: Path
) -> None:
    server = launch_server(name="served")
    server.wait_for_weights(0)  # the learner is up: its stop writes the final checkpoint
    _quiet_exit(_closed_stdout(tmp_path, "status", str(server.run_folder)))
    _quiet_exit(_closed_stdout(tmp_path, "status", str(server.run_folder), "--json"))
    assert server.stop() == 0
    assert server.checkpoints
    run = server.run_folder

    done = run_rlserve("train", "--resume", str(run), "--no-progress")
    assert_one_line_error(
        done, f"{run} is a run of 'rlserve serve'", f"rlserve serve --resume {run}"
    )
    assert "EOFError" not in done.stderr
    done = run_rlserve(
        "train", "--env", "CartPole-v1", "--run-dir", str(run.parent), "--name", "served"
    )
    assert_one_line_error(done, f"continue it with 'rlserve serve --resume {run}'")

    exported = run_rlserve("export", str(run))
    assert exported.returncode == 0, exported.stderr
    # No notes of torch.onnx (torchvision, FutureWarning); one warning of ours: never trained.
    lines = exported.stderr.strip().splitlines()
    assert len(lines) == 1, exported.stderr
    assert lines[0].startswith("rlserve: warning: ") and "never trained" in lines[0]
    assert f"rlserve serve --resume {run}" in lines[0]


@pytest.mark.timeout(180)
def test_a_train_run_is_continued_by_train(run_rlserve: Any, tmp_path: Path) -> None:
    first = run_rlserve("train", "--env", "CartPole-v1", "--name", "t", *SMALL, timeout=120)
    assert first.returncode == 0, first.stderr
    run = Path("runs") / "t"
    again = run_rlserve("train", "--env", "CartPole-v1", "--name", "t", *SMALL)
    assert_one_line_error(again, f"continue it with 'rlserve train --resume {run}'")
    ignored = run_rlserve("train", "--resume", str(run), "--ppo-lr", "0.1", "--num-envs", "3")
    assert_one_line_error(ignored, "--num-envs, --ppo-lr: a resumed run keeps", "drop them")

    exported = run_rlserve("export", str(run))
    assert exported.returncode == 0, exported.stderr
    assert exported.stderr == ""  # trained, and torch.onnx's notes are hidden


def test_a_closed_output_pipe_ends_quietly(tmp_path: Path) -> None:
    _quiet_exit(_closed_stdout(tmp_path, "check-env", "CartPole-v1", "--episodes", "1"))
