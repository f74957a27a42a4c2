"""MultiAgentEnv and MultiAgentSource: turn-based and join/leave envs, auto-reset, bad outputs."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from rlserve.env import ALL_AGENTS, MultiAgentEnv, MultiAgentSource
from rlserve.errors import ConfigError, EnvError

OBS = gym.spaces.Box(0.0, 10.0, (1,), np.float32)
ACT = gym.spaces.Discrete(2)


def _obs(value: float) -> np.ndarray:
    return np.array([value], np.float32)


class TurnBased(MultiAgentEnv):
    """Two players alternate; each move scores 1 for the mover; over after ``turns`` moves."""

    def __init__(self, turns: int = 4):
        self.possible_agents = ["p0", "p1"]
        self.agents = list(self.possible_agents)
        self.observation_spaces = dict.fromkeys(self.possible_agents, OBS)
        self.action_spaces = dict.fromkeys(self.possible_agents, ACT)
        self.turns = turns

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        self.t = 0
        return {"p0": _obs(0)}, {"p0": {"start": True}}

    def step(self, action_dict: dict[str, Any]) -> Any:
        mover = "p0" if self.t % 2 == 0 else "p1"
        assert set(action_dict) == {mover}
        self.t += 1
        rewards = {mover: 1.0}
        if self.t >= self.turns:
            return (
                {"p0": _obs(self.t), "p1": _obs(self.t)},
                rewards,
                {ALL_AGENTS: True},
                {ALL_AGENTS: False},
                {},
            )
        nxt = "p1" if mover == "p0" else "p0"
        return {nxt: _obs(self.t)}, rewards, {ALL_AGENTS: False}, {ALL_AGENTS: False}, {}


class JoinLeave(MultiAgentEnv):
    """``a`` plays throughout; ``b`` joins at step 1 and leaves (terminated) at step 2."""

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Dict({"a": OBS, "b": OBS})
        self.action_space = gym.spaces.Dict({"a": ACT, "b": ACT})

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        self.t = 0
        return {"a": _obs(0)}, {}

    def step(self, action_dict: dict[str, Any]) -> Any:
        self.t += 1
        if self.t == 1:
            return (
                {"a": _obs(1), "b": _obs(1)},
                {"a": 0.5},
                {ALL_AGENTS: False},
                {ALL_AGENTS: False},
                {},
            )
        if self.t == 2:
            return (
                {"a": _obs(2), "b": _obs(2)},
                {"a": 0.5, "b": 2.0},
                {"b": True, ALL_AGENTS: False},
                {ALL_AGENTS: False},
                {},
            )
        return {"a": _obs(3)}, {"a": 1.0}, {ALL_AGENTS: False}, {ALL_AGENTS: self.t >= 3}, {}


def _answer(poll: Any, source: MultiAgentSource) -> dict[Any, dict[str, Any]]:
    """Action 0 for every agent that wants one (not done, no off-policy action)."""
    actions: dict[Any, dict[str, Any]] = {}
    for env_id, obs in poll.obs.items():
        for agent_id in obs:
            done = poll.terminated.get(env_id, {}).get(agent_id) or poll.truncated.get(
                env_id, {}
            ).get(agent_id)
            if not done:
                actions.setdefault(env_id, {})[agent_id] = 0
    for env_id, obs in poll.reset_obs.items():
        for agent_id in obs:
            actions.setdefault(env_id, {})[agent_id] = 0
    return actions


@pytest.mark.timeout(10)
def test_turn_based_env_alternates_and_resets_in_the_same_poll() -> None:
    source = MultiAgentSource(lambda: TurnBased(turns=3), num_envs=2, seed=7)
    assert set(source.observation_spaces) == {"p0", "p1"} and source.multi_agent
    first = source.poll()
    assert {i: set(o) for i, o in first.obs.items()} == {0: {"p0"}, 1: {"p0"}}
    assert first.infos[0] == {"p0": {"start": True}}
    movers = []
    poll = first
    for _ in range(3):
        source.send_actions(_answer(poll, source))
        poll = source.poll()
        movers.append(set(poll.obs[0]))
    assert movers[:2] == [{"p1"}, {"p0"}]
    # The third move ends the episode: both agents' final obs, flags for each, then a reset.
    assert poll.episode_over(0) and poll.episode_over(1)
    assert poll.terminated[0] == {ALL_AGENTS: True, "p0": True, "p1": True}
    assert poll.truncated[0] == {ALL_AGENTS: False, "p0": False, "p1": False}
    assert poll.rewards[0] == {"p0": 1.0}
    assert set(poll.reset_obs[0]) == {"p0"} and poll.reset_infos[0] == {"p0": {"start": True}}
    # The next step answers the new episode's first agent.
    source.send_actions(_answer(poll, source))
    assert set(source.poll().obs[0]) == {"p1"}


@pytest.mark.timeout(10)
def test_agents_join_and_leave_and_the_old_dict_space_api_works() -> None:
    env = JoinLeave()
    assert env.get_observation_space("b") is OBS and env.get_action_space("a") is ACT
    source = MultiAgentSource([env])
    # No possible_agents: the agents (and their spaces) are learned as they appear.
    assert source.action_spaces == {}
    poll = source.poll()
    assert set(poll.obs[0]) == {"a"}
    source.send_actions({0: {"a": 1}})
    poll = source.poll()
    assert set(poll.obs[0]) == {"a", "b"}
    assert source.observation_spaces == {"a": OBS, "b": OBS}
    source.send_actions({0: {"a": 0, "b": 1}})
    poll = source.poll()
    assert poll.terminated[0]["b"] is True and not poll.episode_over(0)
    assert poll.rewards[0] == {"a": 0.5, "b": 2.0}
    # b is done: only a acts; an action for b is refused.
    with pytest.raises(EnvError, match=r"agent 'b'.*not asked to act"):
        source.send_actions({0: {"a": 0, "b": 0}})
    source.send_actions({0: {"a": 0}})
    poll = source.poll()
    assert poll.truncated[0] == {ALL_AGENTS: True, "a": True}
    assert poll.terminated[0][ALL_AGENTS] is False
    assert set(poll.reset_obs[0]) == {"a"}


class Scripted(MultiAgentEnv):
    """Returns ``result`` from its first step."""

    def __init__(self, result: Any, reset_result: Any = None):
        self.observation_spaces = {"a": OBS, "b": OBS}
        self.action_spaces = {"a": ACT, "b": ACT}
        self.result = result
        self.reset_result = reset_result

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        return self.reset_result or ({"a": _obs(0)}, {})

    def step(self, action_dict: dict[str, Any]) -> Any:
        return self.result


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("result", "match"),
    [
        (({"a": _obs(1)}, {"zed": 1.0}, {ALL_AGENTS: False}, {ALL_AGENTS: False}, {}), "'zed'"),
        (({}, {"a": 1.0}, {ALL_AGENTS: False}, {ALL_AGENTS: False}, {}), "no agent would act"),
        (({"a": _obs(1)}, {}, {}, {ALL_AGENTS: False}, {}), "without '__all__'"),
        ((_obs(1), 1.0, False, False, {}), "dicts keyed by agent id"),
        (({"a": _obs(1)}, {}, {}, {}), "pre-Gymnasium"),
        (
            ({"a": _obs(1)}, {"a": 1.0}, {"a": True, ALL_AGENTS: False}, {ALL_AGENTS: False}, {}),
            "no agent would act",
        ),
    ],
)
def test_malformed_step_results_raise_clear_errors(result: Any, match: str) -> None:
    source = MultiAgentSource(lambda: Scripted(result))
    source.poll()
    with pytest.raises(EnvError, match=match) as info:
        source.send_actions({0: {"a": 0}})
    assert "Scripted (env id 0)" in str(info.value)


@pytest.mark.timeout(10)
def test_missing_action_empty_reset_and_undeclared_spaces_are_refused() -> None:
    source = MultiAgentSource(lambda: Scripted(None))
    source.poll()
    with pytest.raises(EnvError, match="no action for agent 'a'"):
        source.send_actions({})
    with pytest.raises(EnvError, match="reset\\(\\) returned no observations"):
        MultiAgentSource(lambda: Scripted(None, reset_result=({}, {}))).poll()

    class NoSpaces(MultiAgentEnv):
        possible_agents = ["x"]

    with pytest.raises(ConfigError, match="declares no observation space for agent 'x'"):
        MultiAgentSource(NoSpaces)
    with pytest.raises(ConfigError, match="num_envs"):
        MultiAgentSource([Scripted(None)], num_envs=2)


@pytest.mark.timeout(10)
def test_a_done_agent_that_comes_back_is_refused() -> None:
    env = JoinLeave()
    source = MultiAgentSource([env])
    source.poll()
    source.send_actions({0: {"a": 0}})
    source.poll()
    source.send_actions({0: {"a": 0, "b": 0}})
    source.poll()
    env.step = lambda _a: (  # type: ignore[method-assign]
        {"a": _obs(1), "b": _obs(1)},
        {},
        {ALL_AGENTS: False},
        {ALL_AGENTS: False},
        {},
    )
    with pytest.raises(EnvError, match="agent 'b', which was already done"):
        source.send_actions({0: {"a": 0}})


@pytest.mark.timeout(10)
def test_try_reset_starts_a_new_episode_for_one_copy() -> None:
    source = MultiAgentSource(lambda: TurnBased(turns=10), num_envs=2)
    poll = source.poll()
    source.send_actions(_answer(poll, source))
    source.try_reset(1)
    poll = source.poll()
    assert set(poll.obs[0]) == {"p1"} and set(poll.obs[1]) == {"p0"}
    assert 1 not in poll.rewards
    source.close()
