"""The epsilon-greedy distribution: its choices, log-probabilities and wire form."""

from __future__ import annotations

import math

import numpy as np
import pytest
from gymnasium import spaces

from rlserve.errors import ConfigError, UnsupportedSpaceError
from rlserve.policy import ModelSpec, NumpyPolicy
from rlserve.policy.greedy import epsilon_greedy_log_prob
from rlserve.policy.space_distribution import epsilon_greedy


def _policy(epsilon: float, start: int = 0, seed: int = 0) -> NumpyPolicy:
    # One linear layer that copies the 4 observation values out as Q-values.
    spec = ModelSpec.for_distribution(
        4, ("head",), "relu", epsilon_greedy(spaces.Discrete(4, start=start), epsilon)
    )
    weights = {"head.weight": np.eye(4, dtype=np.float32), "head.bias": np.zeros(4, np.float32)}
    return NumpyPolicy(spec, weights, version=3, seed=seed)


def test_log_probabilities_by_hand() -> None:
    values = np.array([[0.0, 2.0, 1.0], [5.0, 1.0, 1.0]])
    logp = epsilon_greedy_log_prob(values, 0.3, np.array([1, 2]))
    np.testing.assert_allclose(logp, [math.log(0.7 + 0.1), math.log(0.1)], rtol=1e-6)
    assert epsilon_greedy_log_prob(values, 0.0, np.array([0]))[0] == -np.inf


def test_greedy_without_exploration_and_the_start_offset() -> None:
    policy = _policy(0.5, start=10)
    obs = np.array([[0, 3, 1, 2], [9, 0, 0, 0]], np.float32)
    out = policy.compute_actions(obs, explore=False)
    np.testing.assert_array_equal(out.actions, [1, 0])
    np.testing.assert_allclose(out.logp, math.log(0.5 + 0.125), rtol=1e-6)
    np.testing.assert_array_equal(policy.to_env_actions(out.actions), [11, 10])


@pytest.mark.parametrize("rows", [1, 4000])
def test_exploring_takes_a_random_choice_epsilon_of_the_time(rows: int) -> None:
    policy = _policy(0.4, seed=1)
    obs = np.tile(np.array([[0, 0, 5, 0]], np.float32), (rows, 1))
    draws = 4000 // rows
    actions = np.concatenate([policy.compute_actions(obs).actions for _ in range(draws)])
    # The best choice: 1 - 0.4 + 0.1 = 0.7 of the time; each other 0.1.
    shares = np.bincount(actions, minlength=4) / len(actions)
    np.testing.assert_allclose(shares, [0.1, 0.1, 0.7, 0.1], atol=0.03)
    out = policy.compute_actions(obs)
    np.testing.assert_allclose(out.logp, policy.log_prob(obs, out.actions), rtol=1e-6)


def test_the_spec_carries_epsilon_on_the_wire_and_old_specs_still_parse() -> None:
    spec = _policy(0.25).spec
    wire = spec.to_wire()
    assert wire["distribution"] == "epsilon_greedy" and wire["epsilon"] == 0.25
    assert ModelSpec.from_wire(wire) == spec
    del wire["epsilon"]
    assert ModelSpec.from_wire(wire).epsilon == 0.0
    categorical = ModelSpec(4, ("head",), "relu", "categorical", 4)
    assert "epsilon" not in categorical.to_wire()  # other kinds' wire form is unchanged
    with pytest.raises(ConfigError, match="epsilon must be within"):
        ModelSpec.from_wire({**spec.to_wire(), "epsilon": 1.5})


def test_only_discrete_spaces_have_one() -> None:
    with pytest.raises(UnsupportedSpaceError, match="needs a Discrete action space"):
        epsilon_greedy(spaces.MultiDiscrete([2, 2]))
