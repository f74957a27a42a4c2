"""Mistakes a user makes on the command line are one line naming the fix, before anything starts.

In process (``rlserve.cli.commands.main``): each case fails before a server, a learner or a run
folder would be created, so no process is started.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlserve.cli.commands import main
from rlserve.cli.status import run_status
from rlserve.errors import ConfigError
from rlserve.run.progress_file import ProgressFile

SERVE = ["serve", "--spaces-from", "CartPole-v1", "--port", "0", "--http-port", "0"]

MISTAKES: dict[str, tuple[list[str], str, list[str]]] = {
    "flags of an algorithm not in use": (
        [*SERVE, "--algo", "dqn", "--ppo-lr", "0.1"],
        "",
        ["--ppo-lr set ppo settings, but the algorithm is dqn", "pass --algo ppo"],
    ),
    "a key [algorithm] does not have": (
        SERVE,
        '[algorithm]\nalgo = "dqn"\n',
        ["rlserve.toml: [algorithm] has the key(s) algo", "its only key is name"],
    ),
    "a module:Env id whose module is missing": (
        ["serve", "--spaces-from", "no_such_module_xyz:Env", "--port", "0"],
        "",
        [
            "--spaces-from no_such_module_xyz:Env: no module named 'no_such_module_xyz'",
            "pass --spaces-file FILE.json",
        ],
    ),
    "a misspelt env id": (
        ["serve", "--spaces-from", "CartPol-v1", "--port", "0"],
        "",
        ["--spaces-from CartPol-v1: not a registered Gymnasium id", "CartPole"],
    ),
    "a port past 65535": ([*SERVE[:3], "--port", "70000"], "", ["--port must be from 0"]),
    "an HTTP port below -1": (
        [*SERVE[:5], "--http-port", "-2"],
        "",
        ["--http-port must be from -1"],
    ),
    "no checkpoint kept": (
        [*SERVE, "--keep-checkpoints", "0"],
        "",
        ["--keep-checkpoints must be at least 1"],
    ),
    "a zero metrics interval": (
        [*SERVE, "--metrics-interval", "0"],
        "",
        ["--metrics-interval must be a positive"],
    ),
    "a zero-width layer": ([*SERVE, "--ppo-hidden", "0"], "", ["--ppo-hidden must list layer"]),
    "settings the env does not take": (
        ["train", "--env", "CartPole-v1", "--env-config", '{"no_such_setting": 1}'],
        "",
        ["env CartPole-v1: the env does not take the settings given (no_such_setting)"],
    ),
}


def _run(argv: list[str], config: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    if config:
        Path("rlserve.toml").write_text(config)
        argv = [*argv, "--config", "rlserve.toml"]
    code = main([*argv, "--run-dir", "runs"] if argv[0] == "serve" else argv)
    return code, capsys.readouterr().err


@pytest.mark.parametrize("case", sorted(MISTAKES))
def test_a_mistake_is_one_line_with_the_fix_and_creates_nothing(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    argv, config, fragments = MISTAKES[case]
    code, err = _run(argv, config, capsys)
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rlserve: error: "), err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_an_algorithm_table_no_policy_uses_is_warned_about(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    # The bad --ppo-lr stops the command after the warning, before anything starts.
    code, err = _run([*SERVE, "--ppo-lr", "-1"], "[dqn]\nlr = 0.001\n", capsys)
    assert code == 2
    assert "the [dqn] table is not used: no policy learns with dqn" in err
    assert "--algo dqn would use it" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_a_cuda_learner_without_cuda_stops_serve_before_listening(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    code, err = _run([*SERVE, "--ppo-device", "cuda"], "", capsys)
    assert code == 2
    assert (
        "the ppo device (--ppo-device, [ppo] device) cuda: torch" in err
        and "use auto (cuda where present) or cpu" in err
    )
    assert not (tmp_path / "runs").exists()


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=30)
    return child.pid


def test_status_of_a_run_whose_server_died_says_how_to_resume_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "crashed"
    run.mkdir()
    endpoints = {
        "state": "running",  # what a server killed with -9 leaves behind
        "pid": _dead_pid(),
        "machine": socket.gethostname(),
        "http": {"host": "127.0.0.1", "port": 1},
    }
    (run / "endpoints.json").write_text(json.dumps(endpoints))
    with pytest.raises(ConfigError, match=r"is not running: its process \(\d+\) is gone"):
        run_status(str(run))
    ProgressFile(run).append({"samples/env_steps": 512.0}, 1.0)
    assert run_status(str(run)) == 0
    out = capsys.readouterr().out
    assert "not running (its server, process" in out
    assert f"'rlserve serve --resume {run}' continues it" in out
    assert "512 env steps" in out


def test_a_pid_written_on_another_machine_is_not_judged_here(tmp_path: Path) -> None:
    run = tmp_path / "elsewhere"
    run.mkdir()
    endpoints = {"state": "running", "pid": os.getpid() + 10**6, "machine": "another-host"}
    (run / "endpoints.json").write_text(json.dumps({**endpoints, "http": None}))
    with pytest.raises(ConfigError, match="without its HTTP carrier"):
        run_status(str(run))
