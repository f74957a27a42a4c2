"""Flags win over the ``--config`` file, and a bad value names the file and line or the flag."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_cli import assert_one_line_error

EXAMPLES = Path(__file__).parents[2] / "examples"


@pytest.mark.timeout(120)
def test_a_spaces_file_flag_wins_over_the_configs_spaces_from(launch_server: Any) -> None:
    # examples/rlserve.toml says spaces_from = "CartPole-v1" (4 observations, 2 actions).
    server = launch_server(
        spaces=(
            "--config",
            str(EXAMPLES / "rlserve.toml"),
            "--spaces-file",
            str(EXAMPLES / "spaces.json"),
        )
    )
    spaces = json.loads((server.run_folder / "spaces.json").read_text())
    assert spaces["observation_space"]["shape"] == [6]
    assert spaces["action_space"] == {"type": "Discrete", "n": 3, "start": 0}


def test_alternatives_set_together_are_refused_with_the_fix(
    run_rlserve: Any, tmp_path: Path
) -> None:
    (tmp_path / "both.toml").write_text(
        '[server]\nport = 0\nspaces_from = "CartPole-v1"\nspaces_file = "s.json"\n'
    )
    done = run_rlserve("serve", "--config", "both.toml", "--http-port", "0")
    assert_one_line_error(
        done, "both.toml, line 4", "sets both spaces_from and spaces_file", "keep one"
    )
    done = run_rlserve("serve", "--spaces-from", "CartPole-v1", "--spaces-file", "s.json")
    assert_one_line_error(done, "--spaces-from and --spaces-file are alternatives; pass one")
    assert not (tmp_path / "runs").exists()


def test_what_a_resumed_run_would_ignore_is_refused(run_rlserve: Any, tmp_path: Path) -> None:
    done = run_rlserve(
        "serve", "--resume", "runs/x", "--config", str(EXAMPLES / "rlserve.toml"), "--name", "y"
    )
    assert_one_line_error(done, "--config, --name: a resumed run keeps", "drop --config")


CONFIG_VALUES = {
    "[ppo] value": (
        "[ppo]\nlr = 0.001\ntrain_batch_size = -5\n",
        "line 3: [ppo] train_batch_size = -5",
    ),
    "[server] value": ("[server]\nfragment_length = 0\n", "line 2: [server] fragment_length = 0"),
}


@pytest.mark.parametrize("case", sorted(CONFIG_VALUES))
def test_a_bad_value_in_the_config_names_its_file_line_and_key(
    case: str, run_rlserve: Any, tmp_path: Path
) -> None:
    text, fragment = CONFIG_VALUES[case]
    (tmp_path / "rlserve.toml").write_text(text)
    done = run_rlserve("serve", "--config", "rlserve.toml", "--spaces-from", "CartPole-v1")
    assert_one_line_error(done, f"rlserve.toml, {fragment}: ")
    assert not (tmp_path / "runs").exists()


FLAG_VALUES = {
    "serve algorithm flag": (
        ["serve", "--spaces-from", "CartPole-v1", "--ppo-train-batch-size", "-5"],
        "--ppo-train-batch-size",
    ),
    "serve server flag": (
        ["serve", "--spaces-from", "CartPole-v1", "--fragment-length", "0"],
        "--fragment-length must be at least 1",
    ),
    "train algorithm flag": (
        ["train", "--env", "CartPole-v1", "--ppo-train-batch-size", "-5"],
        "--ppo-train-batch-size",
    ),
    "train flag": (["train", "--env", "CartPole-v1", "--num-envs", "0"], "--num-envs"),
}


@pytest.mark.parametrize("case", sorted(FLAG_VALUES))
def test_a_bad_value_of_a_flag_names_the_flag(case: str, run_rlserve: Any, tmp_path: Path) -> None:
    argv, fragment = FLAG_VALUES[case]
    done = run_rlserve(*argv)
    assert_one_line_error(done, fragment)
    field = fragment.split()[0].removeprefix("--ppo-").removeprefix("--").replace("-", "_")
    assert f" {field}" not in done.stderr  # the flag, not the API field
    assert not (tmp_path / "runs").exists()


@pytest.mark.timeout(120)
def test_spaces_from_takes_an_env_class_in_a_file_as_train_env_does(launch_server: Any) -> None:
    server = launch_server(spaces=("--spaces-from", f"{EXAMPLES / 'corridor.py'}:SimpleCorridor"))
    spaces = json.loads((server.run_folder / "spaces.json").read_text())
    assert spaces["observation_space"]["shape"] == [1]
    assert spaces["action_space"] == {"type": "Discrete", "n": 2, "start": 0}
