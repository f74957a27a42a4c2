"""The client's per-agent values: policies of agent-id lists, observations, actions, rewards."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from gymnasium import spaces

from rlserve.client.arguments import agent_keys as _agent_keys
from rlserve.client.arguments import agent_rewards as _agent_rewards
from rlserve.errors import SpaceError
from rlserve.experience.agent_values import PolicyTable
from rlserve.protocol.spaces import describe

BOX = spaces.Box(-1.0, 1.0, (3,), np.float32)


def _table(mapping: list[list[str]] | None = None, **explicit: str) -> PolicyTable:
    policies = {
        "red": {"observation_space": describe(BOX), "action_space": describe(spaces.Discrete(3))},
        "blue": {
            "observation_space": describe(spaces.Box(0.0, 1.0, (2,), np.float32)),
            "action_space": describe(spaces.Box(-1.0, 1.0, (2,), np.float32)),
        },
    }
    welcome = {"policies": policies, "mapping": mapping or [["red_*", "red"], ["blue_*", "blue"]]}
    return PolicyTable(welcome, explicit)


def test_the_policies_of_an_agent_list_are_remembered_for_the_next_call() -> None:
    table = _table()
    ids = [f"red_{i}" for i in range(5)]
    policies, shared = table.policies_of(ids)
    assert shared is not None and shared.policy_id == "red"
    assert table.policies_of(list(ids))[0] is policies  # an equal list: not resolved again
    mixed, none = table.policies_of(["red_0", "blue_0"])
    assert none is None and [p.policy_id for p in mixed] == ["red", "blue"]
    explicit = _table(red_1="blue")
    assert explicit.policies_of(["red_0", "red_1"])[1] is None


def test_observations_of_one_box_policy_are_one_array_and_mistakes_name_the_agent() -> None:
    table = _table()
    ids = [f"red_{i}" for i in range(4)]
    rows = [np.full(3, i / 10, np.float32) for i in range(4)]
    stacked = table.observations(ids, rows, check=True)
    assert isinstance(stacked, np.ndarray) and stacked.shape == (4, 3)
    rows[2] = np.full(3, 5.0, np.float32)
    with pytest.raises(SpaceError, match=r"agent 'red_2' \(policy 'red'\)"):
        table.observations(ids, rows, check=True)
    both = table.observations(["red_0", "blue_0"], [rows[0], np.zeros(2, np.float32)], True)
    assert isinstance(both, list) and len(both) == 2


def test_actions_come_back_keyed_by_agent() -> None:
    table = _table()
    ids = ["red_0", "red_1"]
    assert table.actions(ids, np.array([2, 0])) == {"red_0": 2, "red_1": 0}
    out = table.actions(["red_0", "blue_0"], [1, np.array([0.5, -0.5], np.float32)])
    assert out["red_0"] == 1 and out["blue_0"].tolist() == [0.5, -0.5]


@pytest.mark.parametrize(
    "rewards",
    [
        {"a": 1.0, "b": -2.5},
        {"a": 1, "b": np.float32(-2.5)},
        {"a": np.float64(1.0), "b": np.int64(0)},
    ],
)
def test_reward_dicts_of_numbers_are_taken_as_floats(rewards: dict[str, Any]) -> None:
    out = _agent_rewards("ep", rewards)
    assert out == {k: float(v) for k, v in rewards.items()}
    assert all(type(v) is float for v in out.values())


@pytest.mark.parametrize(
    ("rewards", "text"),
    [
        ({"a": 1.0, "b": True}, "agent 'b': reward must be a number, got bool"),
        ({"a": float("nan")}, "agent 'a': reward nan is out of range"),
        ({"a": 0.0, "b": 2e9}, "agent 'b': reward 2000000000.0 is out of range"),
        ({"a": 2**2000}, "agent 'a': reward 1148130695274254524232833201177681984022317702088695"),
        ({"a": "1"}, "agent 'a': reward must be a number, got str"),
    ],
)
def test_a_bad_reward_names_its_agent(rewards: dict[str, Any], text: str) -> None:
    with pytest.raises(SpaceError, match=f"^log_returns for episode 'ep', {text}"):
        _agent_rewards("ep", rewards)


def test_agent_keys_are_strings() -> None:
    assert _agent_keys({"a": 0, "b": 1}) == ["a", "b"]
    assert _agent_keys({1: 0, "b": 1}) == ["1", "b"]
