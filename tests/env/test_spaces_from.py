"""``--spaces-from`` takes the env forms of ``rlserve train --env``
(``rlserve.env.spaces_from.spaces_of_env``)."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import pytest

from rlserve.env.spaces_from import spaces_of_env
from rlserve.errors import ConfigError

EXAMPLES = Path(__file__).parents[2] / "examples"
CORRIDOR = (gym.spaces.Box(0.0, 10.0, (1,), "float32"), gym.spaces.Discrete(2))


def test_a_registered_id() -> None:
    observation_space, action_space = spaces_of_env("CartPole-v1")
    assert observation_space.shape == (4,) and action_space == gym.spaces.Discrete(2)


def test_a_file_path_and_class() -> None:
    assert spaces_of_env(f"{EXAMPLES / 'corridor.py'}:SimpleCorridor") == CORRIDOR


def test_a_module_on_the_path_and_class(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLES))
    assert spaces_of_env("corridor:SimpleCorridor") == CORRIDOR


@pytest.mark.parametrize(
    ("env", "problem"),
    [
        ("CartPol-v1", "--spaces-from CartPol-v1: not a registered Gymnasium id"),
        ("no_such_module_xyz:Env", "no module named 'no_such_module_xyz'"),
        ("examples/no_such_file.py:Env", "examples/no_such_file.py: no such file"),
        (f"{EXAMPLES / 'corridor.py'}:Nope", "has no attribute 'Nope'"),
    ],
)
def test_what_still_fails_names_the_spaces_file_alternative(env: str, problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        spaces_of_env(env)
    message = str(caught.value)
    assert message.startswith(f"--spaces-from {env}: ") and problem in message
    assert "pass --spaces-file FILE.json" in message


def test_a_policy_table_names_its_own_alternative() -> None:
    with pytest.raises(ConfigError) as caught:
        spaces_of_env("CartPol-v1", label="spaces_from", instead='spaces_file = "FILE.json"')
    assert str(caught.value).startswith("spaces_from CartPol-v1: not a registered")
    assert 'pass spaces_file = "FILE.json"' in str(caught.value)
