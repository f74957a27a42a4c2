"""EnvRunner: the generic poll/send path on a scripted EnvSource (exact fragments), the vector
fast path against the generic one, and cut() handing on bootstrapping partial episodes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from rlserve.algorithm.sources import policy_table
from rlserve.env import ALL_AGENTS, SINGLE_AGENT, EnvSource, InProcessVectorSource, Poll
from rlserve.env.base import EnvId
from rlserve.env.runner import EnvRunner
from rlserve.errors import EnvError, SpaceError
from rlserve.experience.collector import Collector
from rlserve.experience.episode_records import EpisodeSummary
from rlserve.learners.ppo import PPOLearner
from rlserve.learners.ppo_config import PPOSettings
from rlserve.policy import NumpyPolicy
from rlserve.protocol.fragment import Fragment
from rlserve.protocol.mapping import PolicyMapping
from rlserve.server.policies import PolicySpec

OBS = gym.spaces.Box(-1000.0, 1000.0, (1,), np.float32)
ACT = gym.spaces.Discrete(3)


def _o(value: float) -> np.ndarray:
    return np.array([value], np.float32)


def make_collector(
    obs_space: gym.Space[Any],
    act_space: gym.Space[Any],
    fragment_length: int = 100,
    multi_agent: bool = False,
    seed: int = 0,
) -> tuple[Collector, list[Fragment], list[EpisodeSummary]]:
    """A collector with one fresh policy ``default``; returns it, its fragments and summaries."""
    package = PPOLearner(
        obs_space, act_space, PPOSettings(hidden=(8,), device="cpu", seed=seed)
    ).weights()
    policy = NumpyPolicy(package.spec, package.arrays, package.version, seed=seed)
    specs = {"default": PolicySpec("default", obs_space, act_space)}
    mapping = PolicyMapping([], {"default": {}}) if multi_agent else None
    fragments: list[Fragment] = []
    summaries: list[EpisodeSummary] = []
    collector = Collector(
        policy_table(specs, mapping),
        {"default": policy},
        fragment_length,
        64,
        fragments.append,
        summaries.append,
    )
    return collector, fragments, summaries


class ScriptedSource(EnvSource):
    """Hands out a fixed list of polls (then empty ones); records every send_actions."""

    def __init__(self, agents: list[str], polls: list[Poll]) -> None:
        self.observation_spaces = dict.fromkeys(agents, OBS)
        self.action_spaces = dict.fromkeys(agents, ACT)
        self._polls: Iterator[Poll] = iter(polls)
        self.sent: list[dict[EnvId, dict[str, Any]]] = []

    def poll(self) -> Poll:
        return next(self._polls, Poll())

    def send_actions(self, actions: dict[EnvId, dict[str, Any]]) -> None:
        self.sent.append(actions)


def _frag(fragments: list[Fragment], first_obs: float, agent: str = SINGLE_AGENT) -> Fragment:
    found = [f for f in fragments if f.obs[0, 0] == first_obs and f.agent_id == agent]
    assert len(found) == 1, [(f.agent_id, f.obs[:, 0].tolist()) for f in fragments]
    return found[0]


A = SINGLE_AGENT


@pytest.mark.timeout(30)
def test_generic_single_agent_path_gives_exact_fragments() -> None:
    polls = [
        # Two episodes start.
        Poll(obs={0: {A: _o(0)}, 1: {A: _o(100)}}),
        # env 0: someone else acted (1) in obs 1; env 1 goes on.
        Poll(
            obs={0: {A: _o(1)}, 1: {A: _o(101)}},
            rewards={0: {A: 1.0}, 1: {A: 2.0}},
            off_policy_actions={0: {A: 1}},
        ),
        # env 0 terminates and resets in the same poll; env 1's sub-process failed.
        Poll(
            obs={0: {A: _o(2)}},
            rewards={0: {A: 0.5}},
            terminated={0: {A: True, ALL_AGENTS: True}},
            truncated={0: {A: False, ALL_AGENTS: False}},
            reset_obs={0: {A: _o(10)}, 1: {A: _o(200)}},
            failed={1: "crashed"},
        ),
        Poll(obs={0: {A: _o(11)}, 1: {A: _o(201)}}, rewards={0: {A: 0.0}, 1: {A: 0.25}}),
        # env 1 is truncated (its final observation is 202) and starts nothing new.
        Poll(
            obs={0: {A: _o(12)}, 1: {A: _o(202)}},
            rewards={0: {A: 0.0}, 1: {A: 0.75}},
            terminated={1: {A: False, ALL_AGENTS: False}},
            truncated={1: {A: True, ALL_AGENTS: True}},
        ),
    ]
    source = ScriptedSource([A], polls)
    collector, fragments, summaries = make_collector(OBS, ACT)
    runner = EnvRunner(source, collector)
    assert runner.sample(9) == 9
    # Only agents that wanted an action were answered (not the off-policy one, not ended ones).
    assert [sorted(s) for s in source.sent] == [[0, 1], [1], [0, 1], [0, 1], [0]]
    sent = [{e: a[A] for e, a in s.items()} for s in source.sent]
    assert runner.episodes_failed == 1

    first = _frag(fragments, 0.0)
    np.testing.assert_array_equal(first.obs[:, 0], [0, 1, 2])
    np.testing.assert_array_equal(first.actions, [sent[0][0], 1])
    np.testing.assert_array_equal(first.rewards, np.array([1.0, 0.5], np.float32))
    np.testing.assert_array_equal(first.policy_chosen, [True, False])
    assert np.isfinite(first.behaviour_logp[0]) and np.isnan(first.behaviour_logp[1])
    assert first.terminated and not first.truncated

    # The failed episode: its last step has no next observation and is dropped; the rest
    # bootstraps from obs 101.
    failed = _frag(fragments, 100.0)
    np.testing.assert_array_equal(failed.obs[:, 0], [100, 101])
    np.testing.assert_array_equal(failed.actions, [sent[0][1]])
    np.testing.assert_array_equal(failed.rewards, [2.0])
    assert not failed.terminated and not failed.truncated

    # The episode started by reset_obs after the failure, truncated at 202.
    restarted = _frag(fragments, 200.0)
    np.testing.assert_array_equal(restarted.obs[:, 0], [200, 201, 202])
    np.testing.assert_array_equal(restarted.actions, [sent[2][1], sent[3][1]])
    np.testing.assert_array_equal(restarted.rewards, [0.25, 0.75])
    np.testing.assert_array_equal(restarted.policy_chosen, [True, True])
    assert restarted.truncated and not restarted.terminated
    assert len(fragments) == 3  # env 0's second episode (10, 11, 12) is still open

    assert sorted(s.reason for s in summaries) == ["failed", "terminated", "truncated"]
    by_reason = {s.reason: s.episode_return for s in summaries}
    assert by_reason == pytest.approx({"terminated": 1.5, "failed": 2.0, "truncated": 1.0})


@pytest.mark.timeout(30)
def test_generic_multi_agent_path_leaves_out_rewards_before_acting() -> None:
    polls = [
        # y is rewarded before it ever acted (and before the episode was open at all).
        Poll(obs={"m": {"x": _o(0)}}, rewards={"m": {"y": 3.0}}),
        # y joins; it is rewarded again before its first action.
        Poll(obs={"m": {"x": _o(1), "y": _o(50)}}, rewards={"m": {"x": 1.0, "y": 4.0}}),
        Poll(
            obs={"m": {"x": _o(2), "y": _o(51)}},
            rewards={"m": {"x": 0.5, "y": 2.0}},
            terminated={"m": {ALL_AGENTS: True}},
            truncated={"m": {ALL_AGENTS: False}},
            reset_obs={"m": {"x": _o(10)}},
        ),
    ]
    source = ScriptedSource(["x", "y"], polls)
    collector, fragments, summaries = make_collector(OBS, ACT, multi_agent=True)
    runner = EnvRunner(source, collector)
    assert runner.sample(4) == 4
    assert [{e: sorted(a) for e, a in s.items()} for s in source.sent] == [
        {"m": ["x"]},
        {"m": ["x", "y"]},
        {"m": ["x"]},
    ]
    assert runner.rewards_before_acting == 2
    sent = source.sent
    x = _frag(fragments, 0.0, "x")
    np.testing.assert_array_equal(x.obs[:, 0], [0, 1, 2])
    np.testing.assert_array_equal(x.actions, [sent[0]["m"]["x"], sent[1]["m"]["x"]])
    np.testing.assert_array_equal(x.rewards, [1.0, 0.5])
    assert x.terminated and not x.truncated and x.policy_id == "default"
    y = _frag(fragments, 50.0, "y")
    np.testing.assert_array_equal(y.obs[:, 0], [50, 51])
    np.testing.assert_array_equal(y.actions, [sent[1]["m"]["y"]])
    np.testing.assert_array_equal(y.rewards, [2.0])
    assert y.terminated and not y.truncated
    assert len(fragments) == 2 and len(summaries) == 1
    assert summaries[0].episode_return == pytest.approx(3.5)


class Generic(EnvSource):
    """A vector source seen only through poll/send_actions (the runner's generic path)."""

    def __init__(self, inner: InProcessVectorSource) -> None:
        self.env_name = inner.env_name
        self.inner = inner
        self.observation_spaces = inner.observation_spaces
        self.action_spaces = inner.action_spaces

    def poll(self) -> Poll:
        return self.inner.poll()

    def send_actions(self, actions: dict[EnvId, dict[str, Any]]) -> None:
        self.inner.send_actions(actions)

    def close(self) -> None:
        self.inner.close()


def _key(f: Fragment) -> tuple[Any, ...]:
    return (
        f.obs.tobytes(),
        f.actions.tobytes(),
        f.rewards.tobytes(),
        f.behaviour_logp.tobytes(),
        f.policy_chosen.tobytes(),
        f.terminated,
        f.truncated,
    )


@pytest.mark.timeout(60)
def test_vector_fast_path_gives_the_generic_paths_fragments() -> None:
    results = []
    for generic in (False, True):
        source = InProcessVectorSource(
            "CartPole-v1", {"max_episode_steps": 30}, num_envs=3, seed=11
        )
        space = source.observation_space
        collector, fragments, summaries = make_collector(space, source.action_space, 16)
        collector.explore = False  # actions independent of the order envs are asked in
        driven: EnvSource = Generic(source) if generic else source
        runner = EnvRunner(driven, collector)
        assert runner._vector is not generic
        runner.sample(600)
        driven.close()
        results.append((sorted(map(_key, fragments)), sorted(s.episode_return for s in summaries)))
    (vector_frags, vector_returns), (generic_frags, generic_returns) = results
    assert len(vector_frags) > 10
    assert vector_frags == generic_frags
    assert vector_returns == generic_returns


@pytest.mark.timeout(30)
def test_cut_hands_on_partial_episodes_that_bootstrap() -> None:
    source = InProcessVectorSource("CartPole-v1", None, num_envs=2, seed=3)
    collector, fragments, _ = make_collector(source.observation_space, source.action_space, 100)
    runner = EnvRunner(source, collector)
    runner.sample(6)
    ended = len(fragments)
    current = runner._obs.copy()
    runner.cut()
    cut = fragments[ended:]
    assert len(cut) == 2
    for i, fragment in enumerate(cut):
        assert not fragment.terminated and not fragment.truncated
        np.testing.assert_array_equal(fragment.obs[-1], current[i])
        assert len(fragment) == 3  # 6 steps over 2 copies, none ended (CartPole lasts > 3)
    runner.sample(2)
    runner.cut()
    after = fragments[ended + 2 :]
    assert len(after) == 2
    for i, fragment in enumerate(after):
        # The episode went on from where it was cut.
        np.testing.assert_array_equal(fragment.obs[0], current[i])
        assert len(fragment) == 1
    source.close()


@pytest.mark.timeout(30)
def test_agents_flagged_at_the_episode_end_keep_their_final_observation() -> None:
    """Per-agent flags plus ``__all__`` (what MultiAgentSource reports): each agent's fragment
    ends in its final observation, so a truncated agent bootstraps from the right state."""
    polls = [
        Poll(obs={"m": {"x": _o(0), "y": _o(50)}}),
        Poll(
            obs={"m": {"x": _o(1), "y": _o(51)}},
            rewards={"m": {"x": 1.0, "y": 2.0}},
            terminated={"m": {"x": False, "y": False, ALL_AGENTS: False}},
            truncated={"m": {"x": True, "y": True, ALL_AGENTS: True}},
            reset_obs={"m": {"x": _o(10), "y": _o(60)}},
        ),
    ]
    source = ScriptedSource(["x", "y"], polls)
    collector, fragments, _ = make_collector(OBS, ACT, multi_agent=True)
    EnvRunner(source, collector).sample(4)
    for agent, start in (("x", 0.0), ("y", 50.0)):
        fragment = _frag(fragments, start, agent)
        np.testing.assert_array_equal(fragment.obs[:, 0], [start, start + 1])
        assert fragment.truncated and not fragment.terminated and len(fragment) == 1


class DictObservations(gym.Env[dict[str, Any], int]):
    """Observations of a Dict space (a Discrete and a Box part), episodes of 5 steps."""

    observation_space = gym.spaces.Dict(
        {"mode": gym.spaces.Discrete(3), "pos": gym.spaces.Box(-1.0, 1.0, (2,), np.float32)}
    )
    action_space = ACT

    def __init__(self, config: Any = None) -> None:
        self.t = 0

    def _obs(self) -> dict[str, Any]:
        return {"mode": self.t % 3, "pos": np.full(2, self.t / 10, np.float32)}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        self.t = 0
        return self._obs(), {}

    def step(self, action: int) -> Any:
        self.t += 1
        return self._obs(), 1.0, False, self.t >= 5, {}


def test_the_vector_path_takes_dict_observations() -> None:
    source = InProcessVectorSource(DictObservations, {}, num_envs=2, seed=0)
    collector, fragments, _ = make_collector(source.observation_space, ACT, 16)
    runner = EnvRunner(source, collector)
    assert runner.sample(20) == 20
    runner.cut()
    assert sum(len(f) for f in fragments) == 20
    first = fragments[0].obs[:3]
    # flatten: the Discrete part one-hot (keys in order: mode, pos), then the Box values.
    np.testing.assert_allclose(first[1], [0, 1, 0, 0.1, 0.1])
    np.testing.assert_allclose(first[2], [0, 0, 1, 0.2, 0.2])


class ShrinkingObsEnv(gym.Env[np.ndarray, int]):
    """Declares 4 observation values but its step() returns 3 (a common env bug)."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        return np.zeros(4, np.float32), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        return np.zeros(3, np.float32), 1.0, False, False, {}


class NanRewardEnv(ShrinkingObsEnv):
    """Right observations, but a NaN reward on its third step."""

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        self.steps = 0
        return super().reset(seed=seed)

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.steps += 1
        reward = float("nan") if self.steps == 3 else 1.0
        return np.zeros(4, np.float32), reward, False, False, {}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("generic", [False, True])
@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (ShrinkingObsEnv, ["reset() or step()", "observation_space", "(2, 3)"]),
        (NanRewardEnv, ["step() returned a reward", "reward nan", "TransformReward"]),
    ],
)
def test_the_env_own_bad_values_are_blamed_on_the_env(
    generic: bool, env: type[gym.Env[Any, Any]], expected: list[str]
) -> None:
    source = InProcessVectorSource(env, num_envs=2, seed=0)
    try:
        collector, _, _ = make_collector(source.observation_space, source.action_space)
        runner = EnvRunner(Generic(source) if generic else source, collector)
        with pytest.raises(EnvError) as caught:
            runner.sample(10)
    finally:
        source.close()
    message = str(caught.value)
    assert message.startswith(f"env {env.__name__}: ")
    for part in expected:
        assert part in message
    assert "log_returns" not in message  # the network callers' wording is not shown


@pytest.mark.timeout(30)
def test_a_refusal_that_is_not_the_env_values_is_not_blamed_on_the_env() -> None:
    package = PPOLearner(OBS, ACT, PPOSettings(hidden=(8,), device="cpu")).weights()
    specs = {pid: PolicySpec(pid, OBS, ACT) for pid in ("a", "b")}
    collector = Collector(
        policy_table(specs, PolicyMapping([("x", "a")], ["a", "b"])),
        {pid: NumpyPolicy(package.spec, package.arrays, package.version) for pid in specs},
        100,
        64,
        lambda fragment: None,
        lambda summary: None,
    )
    source = ScriptedSource(["x", "y"], [Poll(obs={"m": {"x": _o(0), "y": _o(1)}})])
    with pytest.raises(SpaceError, match="'y' maps to no policy") as caught:
        EnvRunner(source, collector).sample(2)
    assert not isinstance(caught.value, EnvError)
