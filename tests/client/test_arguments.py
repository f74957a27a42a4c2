"""The client's own checks of a call's arguments, before anything is sent."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from rlserve.client.arguments import step_returns
from rlserve.errors import LimitExceededError, SpaceError


@pytest.mark.parametrize(
    ("reward", "expected"),
    [(1, 1.0), (np.float32(0.5), 0.5), (np.int64(-3), -3.0), (2.5, 2.5)],
)
def test_a_step_reward_of_any_number_type_is_a_float(reward: Any, expected: float) -> None:
    value, info = step_returns("e1", reward, None, 1024)
    assert value == pytest.approx(expected, abs=1e-6) and isinstance(value, float)
    assert info is None


@pytest.mark.parametrize(
    ("reward", "fix"),
    [
        (True, "reward must be a number, got bool"),
        ("1", "reward must be a number, got str"),
        ({"a": 1.0}, r"multi-agent episodes: PolicyClient\(\.\.\., multiagent=True\)"),
        (float("nan"), "reward nan is out of range"),
        (1e10, "out of range"),
    ],
)
def test_a_step_reward_that_cannot_be_trained_on_names_the_episode(reward: Any, fix: str) -> None:
    with pytest.raises(SpaceError, match=fix) as caught:
        step_returns("e1", reward, None, 1024)
    assert "log_returns for episode 'e1'" in str(caught.value)


def test_a_step_info_travels_as_a_plain_map_within_its_limit() -> None:
    _, info = step_returns("e1", 1.0, {"hits": np.int64(3), 7: "seven"}, 1024)
    assert info == {"hits": 3, "7": "seven"}
    with pytest.raises(LimitExceededError, match="log_returns for episode 'e1'"):
        step_returns("e1", 1.0, {"blob": "x" * 2000}, 1024)
    with pytest.raises(SpaceError, match="'bad'"):
        step_returns("e1", 1.0, {"bad": {1, 2}}, 1024)
