"""Code named by a saved config is taken only when it is safe to call, or trusted
(``rlserve.algorithm.saved_config.resolve_saved``): a checkpoint may come from anyone."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

from rlserve.algorithm.algorithm import Algorithm
from rlserve.algorithm.saved_config import CONFIG_FILE, load_config
from rlserve.errors import ConfigError


def make_cartpole(config: Any) -> gym.Env[Any, Any]:
    """An env creator function, as a user's module would define one."""
    return gym.make("CartPole-v1")


def _saved(folder: Path, env: str, env_config: dict[str, Any] | None = None) -> Path:
    folder.mkdir()
    plain = {"algo": "ppo", "format": 2, "env": env, "env_config": env_config or {}}
    (folder / CONFIG_FILE).write_text(json.dumps(plain))
    return folder


@pytest.mark.timeout(60)
def test_a_checkpoint_naming_a_command_runs_nothing(tmp_path: Path) -> None:
    """The audit's case: Popen as the env creator, its arguments in env_config."""
    marker = tmp_path / "ran"
    folder = _saved(
        tmp_path / "sent", "subprocess:Popen", {"/bin/sh": 0, "-c": 0, f"touch {marker}": 0}
    )
    with pytest.raises(ConfigError, match=r"subprocess:Popen, a class that is no environment"):
        Algorithm.from_checkpoint(folder)
    assert not marker.exists()


def test_an_env_creator_function_needs_the_callers_trust(tmp_path: Path) -> None:
    folder = _saved(tmp_path / "mine", f"{make_cartpole.__module__}:make_cartpole")
    with pytest.raises(ConfigError, match=r"a function; .*trust_code=True .*--trust-code"):
        load_config(folder)
    assert load_config(folder, trust_code=True).env is make_cartpole


def test_env_classes_and_registered_ids_need_no_trust(tmp_path: Path) -> None:
    cartpole = "gymnasium.envs.classic_control.cartpole:CartPoleEnv"
    loaded = load_config(_saved(tmp_path / "class", cartpole))
    assert loaded.env is gym.envs.classic_control.cartpole.CartPoleEnv
    assert load_config(_saved(tmp_path / "id", "CartPole-v1")).env == "CartPole-v1"
