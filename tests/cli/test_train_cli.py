"""``rlserve train``: run folder, export, resume, stop conditions, env errors, file:Class envs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rlserve.run.progress_file import read_progress

ROOT = Path(__file__).parents[2]

SMALL = ["--num-envs", "4", "--iteration-steps", "2048", "--no-progress", "--seed", "0"]
QUICK_PPO = ["--ppo-train-batch-size", "512", "--ppo-minibatch-size", "128"]
"""Fewer gradient steps than PPO's defaults, for the tests about the command, not learning."""


def _rlserve(*args: str, timeout: float = 200) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run(
        [sys.executable, "-m", "rlserve.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=ROOT,
    )


def _state(run: Path) -> dict[str, object]:
    return json.loads((run / "algorithm.json").read_text())


@pytest.mark.timeout(300)
def test_train_export_and_resume(tmp_path: Path) -> None:
    proc = _rlserve(
        "train", "--env", "CartPole-v1", "--stop-steps", "4096", "--run-dir", str(tmp_path),
        "--name", "t", *SMALL, *QUICK_PPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "t"
    assert (run / "config.toml").is_file()
    assert (run / "spaces.json").is_file()
    assert list((run / "checkpoints").glob("ckpt_*.pt"))
    assert _state(run)["env_steps_sampled"] == 4096
    assert "stopped after 4,096 env steps" in proc.stdout

    exported = _rlserve("export", str(run))
    assert exported.returncode == 0, exported.stderr[-3000:]
    assert (run / "policy.onnx").stat().st_size > 0

    resumed = _rlserve("train", "--resume", str(run), "--stop-steps", "8192", "--no-progress")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming" in resumed.stdout and "4,096 env steps" in resumed.stdout
    state = _state(run)
    assert state["env_steps_sampled"] == 8192  # went on from 4096, not from 0
    assert state["iteration"] == 4
    # A row per iteration, the resumed run's appended under the one header.
    rows = read_progress(run)
    assert [r["samples/env_steps"] for r in rows] == [2048, 4096, 6144, 8192]
    assert (run / "progress.csv").read_text().count("samples/env_steps,") == 1
    shown = _rlserve("status", str(run))
    assert shown.returncode == 0, shown.stderr
    assert "hosted, 4 reports" in shown.stdout and "8,192 env steps" in shown.stdout
    assert "checkpoints, newest checkpoints/ckpt_" in shown.stdout


@pytest.mark.timeout(200)
def test_unreached_stop_return_exits_1(tmp_path: Path) -> None:
    proc = _rlserve(
        "train", "--env", "CartPole-v1", "--stop-return", "1e9", "--stop-steps", "2048",
        "--run-dir", str(tmp_path), "--name", "r", *SMALL, *QUICK_PPO,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "stopped after 2,048 env steps" in proc.stdout


@pytest.mark.timeout(120)
def test_unknown_env_exits_2_naming_close_matches(tmp_path: Path) -> None:
    proc = _rlserve(
        "train", "--env", "CartPol-v1", "--run-dir", str(tmp_path), "--name", "x", *SMALL
    )
    assert proc.returncode == 2
    assert "CartPole-v1" in proc.stderr and "Traceback" not in proc.stderr
    proc = _rlserve(
        "train", "--env", "NoSuchEnv-v0", "--run-dir", str(tmp_path), "--name", "y", *SMALL
    )
    assert proc.returncode == 2
    assert "NoSuchEnv-v0" in proc.stderr and "Traceback" not in proc.stderr


CORRIDOR = textwrap.dedent(
    """
    import gymnasium as gym
    import numpy as np


    class SimpleCorridor(gym.Env):
        def __init__(self, config):
            self.end_pos = config["corridor_length"]
            self.cur_pos = 0.0
            self.action_space = gym.spaces.Discrete(2)
            self.observation_space = gym.spaces.Box(0.0, self.end_pos, shape=(1,))

        def reset(self, *, seed=None, options=None):
            self.cur_pos = 0.0
            return np.array([self.cur_pos]), {}

        def step(self, action):
            if action == 0 and self.cur_pos > 0.0:
                self.cur_pos -= 1.0
            elif action == 1:
                self.cur_pos += 1.0
            if self.cur_pos >= self.end_pos:
                return np.array([0.0]), 1.0, True, True, {}
            return np.array([self.cur_pos]), -0.1, False, False, {}
    """
)


@pytest.mark.timeout(200)
def test_env_from_a_file_with_env_config(tmp_path: Path) -> None:
    module = tmp_path / "corridor_env.py"
    module.write_text(CORRIDOR)
    proc = _rlserve(
        "train", "--env", f"{module}:SimpleCorridor", "--env-config", '{"corridor_length": 3}',
        "--stop-return", "0.75", "--stop-steps", "20000", "--run-dir", str(tmp_path),
        "--name", "c", *SMALL, *QUICK_PPO, "--ppo-lr", "1e-3", "--ppo-gamma", "0.98",
        "--ppo-gae-lambda", "0.8",
    )  # fmt: skip
    # Optimum for length 3: 2 * -0.1 + 1 = 0.8.
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "solved" in proc.stdout
    assert list((tmp_path / "c" / "checkpoints").glob("ckpt_*.pt"))


@pytest.mark.timeout(200)
def test_env_runner_processes_from_the_command_line(tmp_path: Path) -> None:
    done = _rlserve(
        "train", "--env", "CartPole-v1", "--env-runners", "2",
        "--stop-steps", "1024", "--run-dir", str(tmp_path), "--name", "runners", *SMALL,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    state = json.loads((tmp_path / "runners" / "algorithm.json").read_text())
    assert state["env_steps_sampled"] >= 1024


@pytest.mark.timeout(200)
def test_algo_picks_the_learner_and_its_own_flags(tmp_path: Path) -> None:
    done = _rlserve(
        "train", "--env", "CartPole-v1", "--algo", "dqn", "--dqn-lr", "0.0005",
        "--stop-steps", "1024", "--run-dir", str(tmp_path), "--name", "dqn", *SMALL,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    saved = json.loads((tmp_path / "dqn" / "algorithm_config.json").read_text())
    assert saved["algo"] == "dqn" and saved["training_settings"]["lr"] == 0.0005
    resumed = _rlserve(
        "train", "--resume", str(tmp_path / "dqn"), "--algo", "ppo", "--no-progress",
    )  # fmt: skip
    assert resumed.returncode == 2 and "a run keeps its algorithm" in resumed.stderr


@pytest.mark.timeout(120)
def test_another_algorithms_flags_and_unlearnable_spaces_are_refused(tmp_path: Path) -> None:
    mixed = _rlserve("train", "--env", "CartPole-v1", "--dqn-lr", "0.001", "--no-progress")
    assert mixed.returncode == 2 and "pass --algo dqn" in mixed.stderr
    sac = _rlserve(
        "train", "--env", "CartPole-v1", "--algo", "sac", "--run-dir", str(tmp_path), *SMALL
    )
    assert sac.returncode == 2 and "Box" in sac.stderr, sac.stderr[-2000:]


@pytest.mark.parametrize("algo", ["ppo", "dqn", "sac"])
def test_train_help_shows_the_defaults_train_applies(algo: str) -> None:
    """Each shown default is the value ``rlserve train --algo ALGO`` builds when the flag is
    left out (``auto`` for an automatic setting left unset); PPO's are the server's."""
    import argparse
    import dataclasses

    from rlserve.algorithm.config import config_for
    from rlserve.cli.commands import build_parser

    parser = build_parser()
    train = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[
        "train"
    ]
    helps = {action.dest: action.help or "" for action in train._actions}
    applied = config_for(algo).environment("CartPole-v1").algo_settings()
    for field in dataclasses.fields(applied):
        shown = helps[f"{algo}_{field.name}"]
        if field.name == "seed":
            assert shown.endswith("(default: that of --seed)"), shown
            continue
        value = getattr(applied, field.name)
        if value is None and field.type in ("bool | None", bool | None):
            value = "auto"
        elif value is None:
            value = "unset"
        assert shown.endswith(f"(default: {value})"), (field.name, shown, value)
    if algo == "ppo":
        assert helps["ppo_train_batch_size"].endswith("(default: 2048)")
        assert helps["ppo_normalize_observations"].endswith("(default: auto)")
        serve = next(
            a for a in parser._actions if isinstance(a, argparse._SubParsersAction)
        ).choices["serve"]
        served = {action.dest: action.help or "" for action in serve._actions}
        assert served["ppo_train_batch_size"].endswith("(default: 2048)")  # the same


def test_train_help_says_what_an_iteration_is_and_whose_defaults_apply() -> None:
    """The help's claims hold: no algorithm has hosted-only defaults, so every default shown is
    ``rlserve serve``'s (but the seed); an iteration is whole rounds of the learner's batch."""
    import argparse

    from rlserve.algorithm.training_settings import HOSTED_DEFAULTS
    from rlserve.cli.commands import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    train, serve = commands.choices["train"], commands.choices["serve"]
    assert "the same as 'rlserve serve'" in " ".join(train.description.split())
    assert "not the server's" not in train.description
    assert not any(HOSTED_DEFAULTS.values())  # else the description above must name them
    trained = {a.dest: a.help or "" for a in train._actions}
    served = {a.dest: a.help or "" for a in serve._actions}
    compared = [
        dest
        for dest in trained
        if dest in served
        and dest.partition("_")[0] in HOSTED_DEFAULTS
        and not dest.endswith("_seed")
    ]
    assert "dqn_train_every" in compared and "sac_lr" in compared
    for dest in compared:
        assert trained[dest].rpartition("(default:")[2] == served[dest].rpartition("(default:")[2]
    iteration = trained["iteration_steps"]
    assert "--ppo-train-batch-size, 2048 by default" in iteration
    assert "at least one batch" in iteration


@pytest.mark.timeout(300)
def test_a_ppo_iteration_has_at_least_one_train_batch(tmp_path: Path) -> None:
    proc = _rlserve(
        "train", "--env", "CartPole-v1", "--stop-steps", "1", "--run-dir", str(tmp_path),
        "--name", "t", "--num-envs", "4", "--iteration-steps", "64", "--no-progress",
        "--ppo-train-batch-size", "256", "--ppo-minibatch-size", "128",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert read_progress(tmp_path / "t")[-1]["samples/env_steps"] == 256
