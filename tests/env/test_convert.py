"""to_source: every form an environment can take ends as the right EnvSource, and trains.

(The single-agent forms: registered ids, classes, creators, instances, remote copies are in
test_make.py; these are the multi-agent, PettingZoo and external forms, each driven through an
EnvRunner so a converted source is known to work, not only to exist.)
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from test_runner import make_collector

from rlserve.env import (
    ALL_AGENTS,
    ExternalEnv,
    ExternalEnvSource,
    MultiAgentEnv,
    MultiAgentSource,
    to_source,
)
from rlserve.env.runner import EnvRunner
from rlserve.errors import ConfigError, EnvError

OBS = gym.spaces.Box(-10.0, 10.0, (1,), np.float32)
ACT = gym.spaces.Discrete(2)


class Pair(MultiAgentEnv):
    """Two agents act together for 3 steps; each is rewarded 1 per step."""

    def __init__(self, config: Any = None) -> None:
        self.possible_agents = ["a", "b"]
        self.agents = list(self.possible_agents)
        self.observation_spaces = dict.fromkeys(self.possible_agents, OBS)
        self.action_spaces = dict.fromkeys(self.possible_agents, ACT)
        self.scale = float((config or {}).get("scale", 1.0))
        self.t = 0

    def _obs(self) -> dict[str, np.ndarray]:
        return {a: np.array([self.t * self.scale], np.float32) for a in self.possible_agents}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        self.t = 0
        return self._obs(), {}

    def step(self, action_dict: dict[str, Any]) -> Any:
        assert set(action_dict) == {"a", "b"}
        self.t += 1
        rewards = {"a": 1.0, "b": 1.0}
        return self._obs(), rewards, {ALL_AGENTS: self.t >= 3}, {ALL_AGENTS: False}, {}


def _run(source: Any, steps: int) -> tuple[list[Any], list[Any]]:
    multi = source.multi_agent
    collector, fragments, summaries = make_collector(OBS, ACT, multi_agent=multi)
    runner = EnvRunner(source, collector)
    runner.sample(steps)
    return fragments, summaries


@pytest.mark.timeout(30)
def test_multi_agent_class_with_env_config_becomes_a_multi_agent_source() -> None:
    source = to_source(Pair, {"scale": 2.0}, num_envs=2, seed=0)
    try:
        assert isinstance(source, MultiAgentSource) and source.multi_agent
        assert set(source.observation_spaces) == {"a", "b"}
        fragments, summaries = _run(source, 24)
    finally:
        source.close()
    assert {f.agent_id for f in fragments} == {"a", "b"}
    assert all(f.terminated and len(f) == 3 for f in fragments)
    np.testing.assert_array_equal(fragments[0].obs[:, 0], [0, 2, 4, 6])
    assert summaries and all(s.episode_return == 6.0 for s in summaries)


def test_multi_agent_instance_cannot_be_copied() -> None:
    with pytest.raises(ConfigError, match="cannot be copied"):
        to_source(Pair(), num_envs=2)
    single = to_source(Pair(), num_envs=1)
    assert isinstance(single, MultiAgentSource)
    single.close()


class Countdown(ExternalEnv):
    """Episodes of 2 steps, for ever (until the source closes)."""

    def __init__(self) -> None:
        super().__init__(ACT, OBS)

    def run(self) -> None:
        try:
            while True:
                eid = self.start_episode()
                self.get_action(eid, np.array([2.0], np.float32))
                self.log_returns(eid, 1.0)
                self.get_action(eid, np.array([1.0], np.float32))
                self.log_returns(eid, 1.0)
                self.end_episode(eid, np.array([0.0], np.float32))
        except EnvError:
            return


@pytest.mark.timeout(30)
def test_external_env_instance_becomes_an_external_source() -> None:
    source = to_source(Countdown())
    assert isinstance(source, ExternalEnvSource) and not source.multi_agent
    try:
        fragments, summaries = _run(source, 10)
    finally:
        source.close()
    assert len(fragments) >= 4
    for fragment in fragments:
        np.testing.assert_array_equal(fragment.obs[:, 0], [2, 1, 0])
        assert fragment.terminated
    assert all(s.episode_return == 2.0 for s in summaries)


def test_external_env_class_is_refused_with_the_fix() -> None:
    with pytest.raises(ConfigError, match="pass an instance"):
        to_source(Countdown)


@pytest.mark.timeout(30)
def test_pettingzoo_env_becomes_a_multi_agent_source() -> None:
    pytest.importorskip("pettingzoo")
    from pettingzoo.test.example_envs import generated_agents_parallel_v0

    def make(config: Any) -> Any:
        return generated_agents_parallel_v0.env(max_cycles=20)

    source = to_source(make, num_envs=2, seed=0)
    try:
        assert isinstance(source, MultiAgentSource) and source.multi_agent
        poll = source.poll()
        assert sorted(poll.obs) == [0, 1] and all(poll.obs[e] for e in poll.obs)
    finally:
        source.close()
