"""RLlib's ``compute_single_action(obs, state)`` for a policy with memory: state in, state out."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from memory_policies import CELLS, greedy_run, memory_policy
from rlserve.algorithm.inference import ActingMixin
from rlserve.errors import SpaceError
from rlserve.policy import ModelSpec, NumpyPolicy
from rlserve.server.policies import PolicySpec

OBS = gym.spaces.Box(-2.0, 2.0, (4,), np.float32)


class _Acting(ActingMixin):
    """The acting part of an Algorithm, over given numpy policies."""

    def __init__(self, policy: NumpyPolicy) -> None:
        self.specs = {"default": PolicySpec("default", OBS, gym.spaces.Discrete(2))}
        self._policy = policy

    def _acting_policy(self, policy_id: str) -> NumpyPolicy:
        return self._policy


def test_state_in_state_out_follows_the_episode_in_both_forms() -> None:
    algo = _Acting(memory_policy())
    obs = np.random.default_rng(4).uniform(-2, 2, (6, 4)).astype(np.float32)
    expected, states, _ = greedy_run(memory_policy(), obs)
    pair: Any = [np.zeros(CELLS, np.float32), np.zeros(CELLS, np.float32)]
    flat: Any = np.zeros(2 * CELLS, np.float32)
    for t, row in enumerate(obs):
        np.testing.assert_allclose(np.concatenate(pair), states[t], atol=1e-6)
        action, pair, extra = algo.compute_single_action(row, pair)
        assert action == expected[t] and isinstance(pair, list) and len(pair) == 2
        assert np.isfinite(extra["action_logp"])
        action, flat, _ = algo.compute_single_action(row, state=flat)
        assert action == expected[t] and flat.shape == (2 * CELLS,)
        np.testing.assert_allclose(flat, np.concatenate(pair))


@pytest.mark.parametrize(
    ("state", "message"),
    [
        (None, r"has memory \(use_lstm\): pass state=\[h, c\] \(3 values each"),
        (np.zeros(4), "state has 4 values .* recurrent state of 6"),
        ([np.zeros(3), np.full(3, np.nan)], "finite: False"),
    ],
)
def test_a_missing_or_wrong_state_is_refused_with_the_fix(state: Any, message: str) -> None:
    with pytest.raises(SpaceError, match=message):
        _Acting(memory_policy()).compute_single_action(np.zeros(4, np.float32), state)


def test_a_policy_without_memory_answers_the_action_or_rllibs_triple_for_an_empty_state() -> None:
    spec = ModelSpec(4, ("l0",), "tanh", "categorical", 2)
    # Two equal logits: the greedy action is the first, of probability one half.
    arrays = {"l0.weight": np.ones((2, 4), np.float32), "l0.bias": np.zeros(2, np.float32)}
    algo = _Acting(NumpyPolicy(spec, arrays, 0))
    obs = np.ones(4, np.float32)
    assert algo.compute_single_action(obs) == 0
    assert algo.compute_single_action(obs, []) == (
        0,
        [],
        {"action_logp": pytest.approx(np.log(0.5))},
    )
    with pytest.raises(SpaceError, match="has no memory"):
        algo.compute_single_action(obs, np.zeros(6))
