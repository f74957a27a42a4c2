"""Collector: actions and fragments from direct calls (as EnvRunner and LocalInference make)."""

from __future__ import annotations

import itertools

import gymnasium as gym
import numpy as np
import pytest

from rlserve.algorithm.sources import policy_table
from rlserve.errors import EpisodeError
from rlserve.experience.collector import Collector
from rlserve.experience.episode_records import EpisodeSummary
from rlserve.learners.ppo import PPOLearner
from rlserve.learners.ppo_config import PPOSettings
from rlserve.policy import NumpyPolicy
from rlserve.protocol.fragment import Fragment
from rlserve.server.policies import PolicySpec

OBS = gym.spaces.Box(-100.0, 100.0, (2,), np.float32)
ACT = gym.spaces.Discrete(4)


def _policy(seed: int = 0, version: int | None = None) -> NumpyPolicy:
    package = PPOLearner(OBS, ACT, PPOSettings(hidden=(8,), device="cpu", seed=seed)).weights()
    return NumpyPolicy(
        package.spec, package.arrays, package.version if version is None else version, seed=seed
    )


def _collector(
    fragment_length: int = 100,
) -> tuple[Collector, list[Fragment], list[EpisodeSummary]]:
    specs = {"default": PolicySpec("default", OBS, ACT)}
    fragments: list[Fragment] = []
    summaries: list[EpisodeSummary] = []
    collector = Collector(
        policy_table(specs, None),
        {"default": _policy()},
        fragment_length,
        16,
        fragments.append,
        summaries.append,
    )
    return collector, fragments, summaries


def _o(value: float) -> np.ndarray:
    return np.array([value, -value], np.float32)


@pytest.mark.timeout(30)
def test_steps_become_an_exact_fragment() -> None:
    collector, fragments, summaries = _collector()
    eid = collector.start_episode(None, True)
    first = collector.get_action([eid], _o(0)[None])
    collector.log_returns(eid, 1.0)
    collector.log_action(eid, _o(1), 3)
    collector.log_returns(eid, 0.5, {"k": 1})
    second = collector.get_one_action(eid, _o(2).astype(np.float64))  # float64 is cast
    collector.log_returns(eid, -1.0)
    collector.end_episode(eid, _o(3), truncated=True)
    assert len(fragments) == 1 and len(summaries) == 1
    fragment = fragments[0]
    np.testing.assert_array_equal(fragment.obs, np.stack([_o(0), _o(1), _o(2), _o(3)]))
    np.testing.assert_array_equal(fragment.actions, [int(first[0]), 3, second])
    np.testing.assert_array_equal(fragment.rewards, np.array([1.0, 0.5, -1.0], np.float32))
    np.testing.assert_array_equal(fragment.policy_chosen, [True, False, True])
    logp = fragment.behaviour_logp
    assert np.isfinite(logp[[0, 2]]).all() and np.isnan(logp[1])
    assert fragment.truncated and not fragment.terminated
    assert fragment.infos == [None, {"k": 1}, None]
    assert summaries[0].episode_return == pytest.approx(0.5)
    assert summaries[0].length == 3 and summaries[0].reason == "truncated"


@pytest.mark.timeout(30)
def test_fragments_split_at_the_fragment_length_and_carry_the_weights_version() -> None:
    collector, fragments, _ = _collector(fragment_length=2)
    eid = collector.start_episode(None, True)
    for t in range(5):
        if t == 2:
            collector.set_policy("default", _policy(version=7))
        collector.get_action([eid], _o(t)[None])
        collector.log_returns(eid, float(t))
    collector.end_episode(eid, _o(5), truncated=False)
    assert [len(f) for f in fragments] == [2, 2, 1]
    for before, after in itertools.pairwise(fragments):
        np.testing.assert_array_equal(before.obs[-1], after.obs[0])  # bootstraps from it
        assert not before.terminated and not before.truncated
    assert fragments[-1].terminated
    np.testing.assert_array_equal(np.concatenate([f.rewards for f in fragments]), [0, 1, 2, 3, 4])
    versions = np.concatenate([f.weights_version for f in fragments])
    np.testing.assert_array_equal(versions, [0, 0, 7, 7, 7])


@pytest.mark.timeout(30)
def test_cut_and_abandon() -> None:
    collector, fragments, summaries = _collector()
    eid = collector.start_episode(None, True)
    collector.get_action([eid], _o(0)[None])
    collector.log_returns(eid, 1.0)
    collector.cut(eid, _o(1))
    assert len(fragments) == 1
    cut = fragments[0]
    np.testing.assert_array_equal(cut.obs, np.stack([_o(0), _o(1)]))
    assert not cut.terminated and not cut.truncated
    # The episode goes on from the observation it was cut at.
    collector.get_action([eid], _o(1)[None])
    collector.log_returns(eid, 2.0)
    collector.get_action([eid], _o(2)[None])  # no observation follows: this step is dropped
    collector.abandon(eid, "failed")
    assert len(fragments) == 2
    np.testing.assert_array_equal(fragments[1].obs, np.stack([_o(1), _o(2)]))
    np.testing.assert_array_equal(fragments[1].rewards, [2.0])
    assert not fragments[1].terminated and not fragments[1].truncated
    assert summaries[-1].reason == "failed"
    with pytest.raises(EpisodeError):
        collector.get_action([eid], _o(3)[None])  # closed


@pytest.mark.timeout(30)
def test_greedy_actions_are_deterministic_and_batches_match_single_calls() -> None:
    collector, _, _ = _collector()
    collector.explore = False
    ids = [collector.start_episode(None, False) for _ in range(3)]
    obs = np.stack([_o(0.5), _o(-3.0), _o(10.0)])
    batch = collector.get_action(ids, obs)
    for i, eid in enumerate(ids):
        collector.log_returns(eid, 0.0)
        assert collector.get_one_action(eid, obs[i]) == int(batch[i])
    with pytest.raises(KeyError):
        collector.set_policy("nope", _policy())
    with pytest.raises(ValueError, match="no weights"):
        Collector(
            policy_table({"default": PolicySpec("default", OBS, ACT)}, None),
            {},
            10,
            4,
            lambda f: None,
            lambda s: None,
        )
