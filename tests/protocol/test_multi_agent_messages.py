"""Parsing of the multi-agent forms: agent ids and per-agent rewards, checked together.

Hundreds of agents per call are checked with a few vectorised operations; anything unusual is
checked again one by one, so the errors are those of the one-by-one check.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from rlserve.errors import DecodeError, LimitExceededError, SpaceError
from rlserve.protocol.messages import parse_request

KINDS = ("get_action", "log_action", "log_returns", "end_episode")


def _message(kind: str, agent_ids: Any, rewards: Any) -> dict[str, Any]:
    return {
        "type": kind,
        "id": 1,
        "episode_id": "ep",
        "agent_ids": agent_ids,
        "observations": np.zeros((3, 2), np.float32),
        "actions": [0, 0, 0],
        "rewards": rewards,
    }


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "rewards",
    [
        [0.5, -1.0, 1e9],
        [1, 0, -3],
        np.array([0.5, -1.0, 1e9]),
        np.array([1, 0, -3], np.int32),
        np.array([0.5, -1.0, 2.0], np.float32),
    ],
    ids=["floats", "ints", "array", "int-array", "float32-array"],
)
def test_rewards_of_many_agents_arrive_as_one_float64_array(kind: str, rewards: Any) -> None:
    request = parse_request(_message(kind, ["a", "b", "c"], rewards))
    assert isinstance(request.rewards, np.ndarray) and request.rewards.dtype == np.float64
    assert request.rewards.tolist() == [float(r) for r in np.asarray(rewards).tolist()]
    assert request.agent_ids == ["a", "b", "c"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    ("rewards", "error", "text"),
    [
        ([True, 0.0, 0.0], DecodeError, "'rewards' must hold finite numbers, got True"),
        ([float("nan"), 0.0, 0.0], DecodeError, "'rewards' must hold finite numbers, got nan"),
        ([0.0, float("-inf"), 0.0], DecodeError, "'rewards' must hold finite numbers, got -inf"),
        ([0.0, 0.0, "1"], DecodeError, "'rewards' must hold finite numbers, got '1'"),
        ([0.0, 2e9, 0.0], SpaceError, "'rewards': reward 2000000000.0 is out of range"),
        ([2**70, 0.0, 0.0], SpaceError, "'rewards': reward 1.1805916207174113e+21 is out"),
        ([0.0, 0.0], DecodeError, "'rewards' must be a list of 3 numbers"),
        (3.0, DecodeError, "'rewards' must be a list of 3 numbers"),
        (np.zeros(4), DecodeError, "'rewards' must be a list of 3 numbers"),
        (np.zeros((3, 1)), DecodeError, "'rewards' must hold finite numbers, got [0.0]"),
        (np.zeros(3, bool), DecodeError, "'rewards' must hold finite numbers, got False"),
        (np.array([0.0, np.nan, 0.0]), DecodeError, "'rewards' must hold finite numbers, got nan"),
        (np.array([0.0, 0.0, -2e9]), SpaceError, "'rewards': reward -2000000000.0 is out of"),
    ],
)
def test_a_bad_reward_is_reported_as_one_by_one(
    kind: str, rewards: Any, error: type[Exception], text: str
) -> None:
    with pytest.raises(error) as caught:
        parse_request(_message(kind, ["a", "b", "c"], rewards))
    assert str(caught.value).startswith(f"{kind} {text}")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    ("agent_ids", "error", "text"),
    [
        (["a", "", "c"], LimitExceededError, "field 'agent_ids' must have 1 to 128 characters"),
        (["a", "x" * 129, "c"], LimitExceededError, "field 'agent_ids' must have 1 to 128"),
        (["a", 5, "c"], DecodeError, "field 'agent_ids' must be a string, got int"),
        (["a", None, "c"], DecodeError, "field 'agent_ids' must be a string, got NoneType"),
        (["a", "b", "a"], DecodeError, "'agent_ids' names an agent more than once"),
        ("abc", DecodeError, "field 'agent_ids' must be a non-empty list of strings, got str"),
    ],
)
def test_bad_agent_ids_are_reported_as_one_by_one(
    kind: str, agent_ids: Any, error: type[Exception], text: str
) -> None:
    with pytest.raises(error, match="^" + f"'{kind}' {text}".replace("(", r"\(")):
        parse_request(_message(kind, agent_ids, [0.0, 0.0, 0.0]))


def test_many_agents_at_the_id_length_limit_are_accepted() -> None:
    ids = [f"{i:0128d}" for i in range(300)]
    request = parse_request(_message("log_returns", ids, np.zeros(300)))
    assert request.agent_ids == ids


def test_single_agent_batched_rewards_stay_a_list_of_floats() -> None:
    for rewards in ([1, 2.5], np.array([1, 2.5])):
        request = parse_request(
            {
                "type": "get_action",
                "id": 1,
                "episode_ids": ["a", "b"],
                "observations": np.zeros((2, 2), np.float32),
                "rewards": rewards,
            }
        )
        assert request.rewards == [1.0, 2.5]
        assert all(type(r) is float for r in request.rewards)
