"""PettingZoo Parallel and AEC envs hosted through the MultiAgentEnv adapters."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from rlserve.env import ALL_AGENTS, MultiAgentSource, ParallelPettingZooEnv, PettingZooEnv
from rlserve.env.pettingzoo import from_pettingzoo
from rlserve.errors import ConfigError

pettingzoo = pytest.importorskip("pettingzoo")

from pettingzoo.test.example_envs import (  # noqa: E402
    generated_agents_env_v0,
    generated_agents_parallel_v0,
)
from pettingzoo.utils import AgentSelector  # noqa: E402
from pettingzoo.utils.conversions import aec_to_parallel, parallel_to_aec  # noqa: E402


def _drive(source: MultiAgentSource, steps: int, seed: int) -> list[Any]:
    """Answer every poll with random legal actions; return the polls."""
    rng = np.random.default_rng(seed)
    polls = []
    poll = source.poll()
    for _ in range(steps):
        polls.append(poll)
        actions: dict[Any, dict[Any, Any]] = {}
        for env_id, obs in poll.obs.items():
            flags = (poll.terminated.get(env_id, {}), poll.truncated.get(env_id, {}))
            for agent in obs:
                if not (flags[0].get(agent) or flags[1].get(agent)):
                    n = source.action_spaces[agent].n  # type: ignore[attr-defined]
                    actions.setdefault(env_id, {})[agent] = int(rng.integers(n))
        for env_id, obs in poll.reset_obs.items():
            for agent in obs:
                n = source.action_spaces[agent].n  # type: ignore[attr-defined]
                actions.setdefault(env_id, {})[agent] = int(rng.integers(n))
        source.send_actions(actions)
        poll = source.poll()
    return polls


def _generated_aec(max_cycles: int) -> Any:
    from pettingzoo.utils import wrappers

    return wrappers.OrderEnforcingWrapper(generated_agents_env_v0.raw_env(max_cycles=max_cycles))


class Duel(pettingzoo.AECEnv):  # type: ignore[misc]
    """Two players take turns; the non-mover gets rewarded; both truncated after 4 moves."""

    metadata = {"name": "duel_v0", "is_parallelizable": True}

    def __init__(self) -> None:
        super().__init__()
        self.possible_agents = ["a", "b"]
        self.render_mode = None
        self._space = gym.spaces.Box(0.0, 10.0, (1,), np.float32)

    def observation_space(self, agent: str) -> gym.Space[Any]:
        return self._space

    def action_space(self, agent: str) -> gym.Space[Any]:
        return gym.spaces.Discrete(2)

    def observe(self, agent: str) -> np.ndarray:
        return np.array([self.moves], np.float32)

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        self.agents = list(self.possible_agents)
        self.moves = 0
        self.rewards = dict.fromkeys(self.agents, 0.0)
        self._cumulative_rewards = dict.fromkeys(self.agents, 0.0)
        self.terminations = dict.fromkeys(self.agents, False)
        self.truncations = dict.fromkeys(self.agents, False)
        self.infos: dict[str, dict[str, Any]] = {a: {} for a in self.agents}
        self._selector = AgentSelector(self.agents)
        self.agent_selection = self._selector.reset()

    def step(self, action: Any) -> None:
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        self._cumulative_rewards[agent] = 0
        self._clear_rewards()
        other = "b" if agent == "a" else "a"
        self.rewards[other] = 1.0 + action  # the other player scores from this move
        self.moves += 1
        if self.moves >= 4:
            self.truncations = dict.fromkeys(self.agents, True)
        self._accumulate_rewards()
        self.agent_selection = self._selector.next()


@pytest.mark.timeout(15)
def test_aec_turns_rewards_between_turns_and_the_end() -> None:
    source = MultiAgentSource(lambda: PettingZooEnv(Duel()))
    assert set(source.observation_spaces) == {"a", "b"}
    poll = source.poll()
    assert set(poll.obs[0]) == {"a"}
    source.send_actions({0: {"a": 1}})  # b scores 2
    poll = source.poll()
    assert set(poll.obs[0]) == {"b"} and poll.rewards[0] == {"b": 2.0}
    source.send_actions({0: {"b": 0}})  # a scores 1
    poll = source.poll()
    assert set(poll.obs[0]) == {"a"} and poll.rewards[0] == {"a": 1.0}
    source.send_actions({0: {"a": 0}})  # b scores 1
    poll = source.poll()
    source.send_actions({0: {"b": 1}})  # a scores 2, then both are truncated
    poll = source.poll()
    assert poll.episode_over(0)
    assert set(poll.obs[0]) == {"a", "b"}  # final observations of both
    assert poll.rewards[0] == {"a": 2.0, "b": 0.0}
    assert poll.truncated[0] == {"a": True, "b": True, ALL_AGENTS: True}
    assert poll.terminated[0][ALL_AGENTS] is False
    assert set(poll.reset_obs[0]) == {"a"}


@pytest.mark.timeout(15)
def test_pettingzoo_generated_aec_env_with_agents_joining_and_leaving() -> None:
    source = MultiAgentSource(
        lambda: from_pettingzoo(_generated_aec(max_cycles=15)), num_envs=2, seed=3
    )
    polls = _drive(source, 400, seed=0)
    ended = [p for p in polls if p.episode_over(0)]
    assert ended, "an episode should end within 400 turns"
    for poll in polls:
        for env_id, obs in poll.obs.items():
            live = [
                a
                for a in obs
                if not (poll.terminated[env_id].get(a) if env_id in poll.terminated else False)
                and not (poll.truncated[env_id].get(a) if env_id in poll.truncated else False)
            ]
            assert len(live) <= 1  # turn-based: one agent acts at a time
    assert len(source.observation_spaces) > 5  # agents were learned as they appeared


@pytest.mark.timeout(15)
def test_pettingzoo_generated_parallel_env() -> None:
    env = generated_agents_parallel_v0.parallel_env(max_cycles=10)
    wrapped = from_pettingzoo(env)
    assert isinstance(wrapped, ParallelPettingZooEnv)
    source = MultiAgentSource([wrapped], seed=5)
    polls = _drive(source, 25, seed=1)
    first = polls[0]
    assert len(first.obs[0]) == 5  # every live agent acts together
    # Agents join (new ids get observations) while the episode goes on.
    assert len({a for p in polls for a in p.obs[0]}) > 5
    assert not any(p.episode_over(0) for p in polls)


@pytest.mark.timeout(15)
def test_parallel_episode_ends_when_no_agent_is_left() -> None:
    env = aec_to_parallel(Duel())
    source = MultiAgentSource([from_pettingzoo(env)])
    polls = _drive(source, 6, seed=4)
    assert all(set(p.obs[0]) == {"a", "b"} for p in polls)
    over = [p for p in polls if p.episode_over(0)]
    assert len(over) == 2  # two moves per parallel step: over every second step
    assert over[0].truncated[0] == {"a": True, "b": True, ALL_AGENTS: True}
    assert set(over[0].reset_obs[0]) == {"a", "b"}


@pytest.mark.timeout(15)
def test_parallel_env_converted_to_aec_runs_turn_based() -> None:
    env = parallel_to_aec(generated_agents_parallel_v0.parallel_env())
    source = MultiAgentSource([PettingZooEnv(env)], seed=2)
    polls = _drive(source, 60, seed=2)
    assert all(len(p.obs[0]) >= 1 for p in polls)


@pytest.mark.timeout(15)
def test_from_pettingzoo_refuses_other_objects() -> None:
    with pytest.raises(ConfigError, match="not a PettingZoo AECEnv or ParallelEnv"):
        from_pettingzoo(object())


@pytest.mark.timeout(15)
def test_missing_pettingzoo_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "pettingzoo", None)
    with pytest.raises(
        ConfigError, match=r"pip install pettingzoo \(or pip install -e '\.\[pettingzoo\]'"
    ):
        from_pettingzoo(object())
