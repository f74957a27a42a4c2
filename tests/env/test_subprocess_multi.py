"""Multi-agent copies in sub-processes: the same per-agent results as in process for a seed,
agents that join and leave, PettingZoo envs, a crashed or hung copy restarted and counted, and
the errors."""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from rlserve.env import (
    ALL_AGENTS,
    EnvSource,
    MultiAgentEnv,
    MultiAgentSource,
    Poll,
    ProcessMultiAgentSource,
    ProcessVectorSource,
    to_source,
)
from rlserve.errors import ConfigError, EnvError

OBS = gym.spaces.Box(-10.0, 10.0, (2,), np.float32)
ACT = gym.spaces.Discrete(3)


class Crowd(MultiAgentEnv):
    """A random crowd: ``a`` plays throughout, ``b`` leaves (terminated) and ``c`` (declared by
    its space only, so learnt when first seen) joins at random steps; rewards come from the
    env's seeded generator, the episode is terminated or truncated at a random length.

    ``config["crash"]``: ``(mode, at)`` makes the copy of worker 2 fail at its ``at``-th step
    (``raise``, ``exit``, ``kill`` itself or ``hang``), once: then it leaves the file
    ``config["marker"]``.
    """

    def __init__(self, config: Any) -> None:
        self.possible_agents = ["a", "b"]
        self.observation_spaces = {"a": OBS, "b": OBS, "c": OBS}
        self.action_spaces = {"a": ACT, "b": ACT, "c": ACT}
        crash = config.get("crash")
        self.crash = crash if crash and config.worker_index == 2 else None
        self.marker = Path(config["marker"]) if self.crash else None
        self.steps = 0

    def _obs(self, agents: list[str]) -> dict[str, np.ndarray]:
        return {a: self.np_random.normal(size=2).astype(np.float32) for a in agents}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        gym.Env.reset(self, seed=seed)
        self.t = 0
        self.length = int(self.np_random.integers(4, 9))
        self.leave = int(self.np_random.integers(1, 4))
        self.join = int(self.np_random.integers(1, 4))
        self.live = ["a", "b"]
        return self._obs(self.live), {"a": {"length": self.length}}

    def step(self, action_dict: dict[str, Any]) -> Any:
        self.steps += 1
        if self.marker and self.steps == self.crash[1] and not self.marker.exists():
            self.marker.touch()
            mode = self.crash[0]
            if mode == "raise":
                raise ValueError("boom at step")
            if mode == "exit":
                os._exit(3)
            if mode == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(3600)
        assert set(action_dict) == set(self.live)
        self.t += 1
        rewards = {a: float(action_dict[a]) * float(self.np_random.random()) for a in self.live}
        terminateds: dict[str, bool] = {}
        if self.t == self.leave and "b" in self.live:
            self.live.remove("b")
            terminateds["b"] = True
        obs = self._obs(self.live)
        if self.t == self.leave:
            obs["b"] = self.np_random.normal(size=2).astype(np.float32)  # b's final observation
        if self.t == self.join and "c" not in self.live:
            self.live.append("c")
            obs["c"] = self.np_random.normal(size=2).astype(np.float32)
        over = self.t >= self.length
        terminateds[ALL_AGENTS] = over and self.length % 2 == 0
        truncateds = {ALL_AGENTS: over and self.length % 2 == 1}
        return obs, rewards, terminateds, truncateds, {"a": {"t": self.t}}


def _answer(source: EnvSource, poll: Poll, rng: np.random.Generator) -> dict[Any, Any]:
    """A random action for every agent that wants one."""
    actions: dict[Any, dict[Any, Any]] = {}
    for env_id, obs in poll.obs.items():
        if poll.episode_over(env_id):
            continue
        flags = (poll.terminated.get(env_id, {}), poll.truncated.get(env_id, {}))
        for agent in obs:
            if not (flags[0].get(agent) or flags[1].get(agent)):
                n = source.action_spaces[agent].n  # type: ignore[attr-defined]
                actions.setdefault(env_id, {})[agent] = int(rng.integers(n))
    for env_id, obs in poll.reset_obs.items():
        for agent in obs:
            n = source.action_spaces[agent].n  # type: ignore[attr-defined]
            actions.setdefault(env_id, {})[agent] = int(rng.integers(n))
    return actions


def _same(a: Any, b: Any) -> None:
    """Equal, numpy arrays element by element, dicts key by key."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), (a, b)
        for key in a:
            _same(a[key], b[key])
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)
    else:
        assert a == b, (a, b)


def _lockstep(local: EnvSource, remote: EnvSource, steps: int) -> list[Poll]:
    """Drive both with the same actions; every poll must be equal; the remote polls."""
    rng = np.random.default_rng(0)
    polls = []
    for _ in range(steps):
        expected, got = local.poll(), remote.poll()
        for name in Poll.__slots__:  # type: ignore[attr-defined]
            _same(getattr(expected, name), getattr(got, name))
        polls.append(got)
        actions = _answer(local, expected, rng)
        local.send_actions(actions)
        remote.send_actions(actions)
    return polls


@pytest.mark.timeout(60)
def test_same_per_agent_results_as_in_process_with_agents_joining_and_leaving() -> None:
    local = to_source(Crowd, {}, num_envs=3, seed=21)
    remote = to_source(Crowd, {}, num_envs=3, remote=True, envs_per_process=2, seed=21)
    try:
        assert isinstance(local, MultiAgentSource)
        assert isinstance(remote, ProcessMultiAgentSource) and remote.multi_agent
        assert remote.observation_spaces == {"a": OBS, "b": OBS}
        polls = _lockstep(local, remote, 60)
        # c joined (learnt from the copy that showed it), b left, both kinds of end happened.
        assert remote.observation_spaces == local.observation_spaces == dict.fromkeys("abc", OBS)
        assert any(p.terminated.get(i, {}).get("b") for p in polls for i in range(3))
        ends = [p.terminated[i][ALL_AGENTS] for p in polls for i in range(3) if p.episode_over(i)]
        assert True in ends and False in ends
        assert remote.restarts == 0 and remote.episodes_failed == 0
    finally:
        local.close()
        remote.close()


@pytest.mark.timeout(60)
def test_try_reset_abandons_one_copy_as_in_process() -> None:
    local = to_source(Crowd, {}, num_envs=3, seed=8)
    remote = to_source(Crowd, {}, num_envs=3, remote=True, envs_per_process=2, seed=8)
    try:
        _lockstep(local, remote, 2)
        for source in (local, remote):
            source.try_reset(1)
        after = _lockstep(local, remote, 3)
        assert set(after[0].obs[1]) == {"a", "b"}  # copy 1's new episode starts
        with pytest.raises(EnvError, match="not one of this source's copies"):
            remote.try_reset(3)
    finally:
        local.close()
        remote.close()


def _parallel_crowd() -> Any:
    """A seeded PettingZoo ParallelEnv: ``b`` leaves at step 2, ``c`` joins at step 1, random
    rewards, every agent truncated at a random length (made inside the worker)."""
    pettingzoo = pytest.importorskip("pettingzoo")

    class ParallelCrowd(pettingzoo.ParallelEnv):  # type: ignore[misc]
        metadata = {"name": "parallel_crowd_v0"}

        def __init__(self) -> None:
            self.possible_agents = ["a", "b", "c"]
            self.rng = np.random.default_rng(0)

        def observation_space(self, agent: str) -> gym.Space[Any]:
            return OBS

        def action_space(self, agent: str) -> gym.Space[Any]:
            return ACT

        def _obs(self) -> dict[str, np.ndarray]:
            return {a: self.rng.normal(size=2).astype(np.float32) for a in self.agents}

        def reset(self, seed: int | None = None, options: Any = None) -> Any:
            if seed is not None:
                self.rng = np.random.default_rng(seed)
            self.t, self.length = 0, int(self.rng.integers(4, 9))
            self.agents = ["a", "b"]
            return self._obs(), {a: {} for a in self.agents}

        def step(self, actions: dict[str, Any]) -> Any:
            self.t += 1
            live = list(self.agents)
            rewards = {a: float(actions[a]) * float(self.rng.random()) for a in live}
            over = self.t >= self.length
            terminateds = {a: a == "b" and self.t == 2 for a in live}
            truncateds = {a: over for a in live}
            obs = {a: self.rng.normal(size=2).astype(np.float32) for a in live}
            self.agents = [a for a in live if not (terminateds[a] or truncateds[a])]
            if self.t == 1 and not over:
                self.agents.append("c")  # its first observation comes with this step
                obs["c"] = self.rng.normal(size=2).astype(np.float32)
            return obs, rewards, terminateds, truncateds, {a: {} for a in live}

    return ParallelCrowd()


@pytest.mark.timeout(60)
def test_pettingzoo_env_in_sub_processes_matches_in_process() -> None:
    local = to_source(_parallel_crowd, num_envs=2, seed=3)
    remote = to_source(_parallel_crowd, num_envs=2, remote=True, seed=3)
    try:
        assert isinstance(remote, ProcessMultiAgentSource)
        polls = _lockstep(local, remote, 40)
        assert any(p.episode_over(i) for p in polls for i in (0, 1))
        assert any(p.terminated.get(0, {}).get("b") for p in polls)
        assert remote.observation_spaces == local.observation_spaces == dict.fromkeys("abc", OBS)
    finally:
        local.close()
        remote.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["raise", "exit", "kill", "hang"])
def test_a_crashed_copy_is_restarted_and_its_episode_counted(
    mode: str, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    at = 3
    config = {"crash": (mode, at), "marker": str(tmp_path / "crashed")}
    source = ProcessMultiAgentSource(Crowd, config, num_envs=3, seed=5, step_timeout=1.0)
    reference = MultiAgentSource([Crowd(_context(0)) for _ in range(3)], seed=5)
    reason = {
        "raise": "ValueError: boom at step",
        "exit": "exited with code 3",
        "kill": "SIGKILL",
        "hang": "did not answer within 1 s",
    }[mode]
    try:
        rng = np.random.default_rng(0)
        with caplog.at_level(logging.WARNING, logger="rlserve.env"):
            for step in range(at + 3):
                poll, expected = source.poll(), reference.poll()
                for i in (0, 2):  # the other copies are unaffected
                    _same(poll.obs.get(i), expected.obs.get(i))
                    _same(poll.rewards.get(i), expected.rewards.get(i))
                if step == at:
                    # Copy 1's episode is abandoned mid-way; a new one starts in the same poll.
                    assert list(poll.failed) == [1] and reason in poll.failed[1]
                    assert 1 not in poll.obs and set(poll.reset_obs[1]) == {"a", "b"}
                else:
                    assert not poll.failed
                actions = _answer(source, poll, rng)
                source.send_actions(actions)
                # Copy 1 of the reference did not crash: it goes on with actions of its own.
                own = _answer(reference, expected, np.random.default_rng(step))
                own.update({i: a for i, a in actions.items() if i != 1})
                reference.send_actions(own)
        assert source.restarts == 1 and source.episodes_failed == 1
        assert any(reason in r.getMessage() for r in caplog.records)
    finally:
        source.close()
        reference.close()


def _context(worker_index: int) -> Any:
    from rlserve.env import EnvContext

    return EnvContext({}, worker_index=worker_index)


class NoSpaceForNewcomer(MultiAgentEnv):
    """An agent ``x`` shows up that the env declares no space for."""

    def __init__(self) -> None:
        self.observation_spaces = {"a": OBS}
        self.action_spaces = {"a": ACT}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        return {"a": np.zeros(2, np.float32)}, {}

    def step(self, action_dict: dict[str, Any]) -> Any:
        obs = {"a": np.zeros(2, np.float32), "x": np.zeros(2, np.float32)}
        return obs, {}, {ALL_AGENTS: False}, {ALL_AGENTS: False}, {}


@pytest.mark.timeout(30)
def test_errors_name_the_fix() -> None:
    with pytest.raises(ConfigError, match=r"made a object, not a gymnasium\.Env"):
        to_source(lambda: object(), remote=True)
    with pytest.raises(ConfigError, match="single-agent env: host it with"):
        ProcessMultiAgentSource("CartPole-v1")
    with pytest.raises(ConfigError, match="multi-agent env: host it with"):
        ProcessVectorSource(Crowd, {})
    with pytest.raises(ConfigError, match="an env instance cannot be moved"):
        to_source(Crowd(_context(0)), remote=True)
    source = to_source(NoSpaceForNewcomer, remote=True)
    try:
        poll = source.poll()
        with pytest.raises(ConfigError, match=r"in its sub-process:.*agent 'x' has no entry"):
            source.send_actions({0: dict.fromkeys(poll.obs[0], 0)})
    finally:
        source.close()
