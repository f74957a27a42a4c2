"""Action distributions: numpy against torch, hand-computed values, layouts, refusals."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from gymnasium import spaces

from rlserve.errors import ConfigError, UnsupportedSpaceError
from rlserve.learners.models import ActorCritic
from rlserve.policy import ModelSpec, NumpyPolicy
from rlserve.policy.action_layout import action_from_wire, actions_to_space, encode_action
from rlserve.policy.distribution import ActionDistribution, ActionPart
from rlserve.policy.space_distribution import action_distribution, check_learnable
from rlserve.protocol.spaces import check_value, describe, from_description

OBS_SPACE = spaces.Box(-np.inf, np.inf, (5,), np.float32)

KINDS: dict[str, spaces.Space[Any]] = {
    "multi_discrete": spaces.MultiDiscrete([3, 2, 4], start=[1, 0, -2]),
    "multi_binary": spaces.MultiBinary([2, 2]),
    "box_2d": spaces.Box(-1.0, 1.0, (2, 2), np.float32),
    "dict": spaces.Dict(
        {
            "gear": spaces.Discrete(3, start=1),
            "lights": spaces.MultiBinary(2),
            "steer": spaces.Box(-0.5, 0.5, (2,), np.float32),
        }
    ),
    "tuple": spaces.Tuple((spaces.MultiDiscrete([2, 5]), spaces.Box(0.0, 1.0, (1,), np.float32))),
}
EXPECTED_KIND = {
    "multi_discrete": "multi_categorical",
    "multi_binary": "bernoulli",
    "box_2d": "gaussian",
    "dict": "composite",
    "tuple": "composite",
}


def _model(action_space: spaces.Space[Any], seed: int = 0) -> ActorCritic:
    torch.manual_seed(seed)
    model = ActorCritic(OBS_SPACE, action_space, (16, 8), "tanh")
    with torch.no_grad():
        for p in model.actor.parameters():
            p.normal_(0.0, 0.6)
        model.log_std.copy_(torch.linspace(-0.7, 0.4, model.log_std.numel()))
    return model


def _obs(n: int = 64, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 1.5, (n, 5)).astype(np.float32)


@pytest.mark.parametrize("name", list(KINDS))
def test_numpy_sampling_and_log_prob_match_torch(name: str) -> None:
    space = from_description(describe(KINDS[name]))
    model = _model(space)
    assert model.distribution == EXPECTED_KIND[name]
    policy = NumpyPolicy(model.spec(), model.actor_arrays(), version=1, seed=4)
    obs = _obs()
    out = policy.compute_actions(obs)
    dist = policy.distribution
    assert dist.check_actions(out.actions, len(obs)) == ""
    with torch.no_grad():
        expected, entropy = model.log_prob_entropy(
            torch.as_tensor(obs), torch.as_tensor(out.actions)
        )
    np.testing.assert_allclose(out.logp, expected.numpy(), atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(policy.log_prob(obs, out.actions), out.logp, atol=1e-5)
    assert (entropy.numpy() > 0).all()
    assert len(np.unique(out.actions, axis=0)) > 1  # it samples, not always the mode
    env = actions_to_space(space, policy.to_env_actions(out.actions))
    for i in range(len(obs)):
        assert space.contains(env[i]), env[i]


def test_greedy_actions_are_each_parts_mode() -> None:
    dist = ActionDistribution(
        "composite",
        (ActionPart("categorical", 3), ActionPart("bernoulli", 2), ActionPart("gaussian", 1)),
        (1, 0, 0, 0),
        (-math.inf, -math.inf, -math.inf, -1.0),
        (math.inf, math.inf, math.inf, 1.0),
    )
    params = np.array([[0.1, 2.0, -1.0, 0.3, -0.2, 1.7]], np.float32)
    actions, logp = dist.sample(params, np.zeros(1, np.float32), np.random.default_rng(0), False)
    np.testing.assert_array_equal(actions, np.array([[1, 1, 0, 1.7]], np.float32))
    np.testing.assert_allclose(dist.to_env(actions), [[2, 1, 0, 1.0]], atol=1e-6)
    # By hand: softmax choice 1, then sigmoid(0.3), 1 - sigmoid(-0.2), and N(0; 0, 1).
    choice = 2.0 - math.log(math.exp(0.1) + math.exp(2.0) + math.exp(-1.0))
    bits = -math.log1p(math.exp(-0.3)) - math.log1p(math.exp(-0.2))
    gauss = -0.5 * math.log(2 * math.pi)
    np.testing.assert_allclose(logp, [choice + bits + gauss], atol=1e-5)


@pytest.mark.parametrize("name", list(KINDS))
def test_an_action_round_trips_through_the_flat_layout(name: str) -> None:
    space = KINDS[name]
    space.seed(5)
    dist = action_distribution(space)
    for _ in range(5):
        value = check_value(space, space.sample(), "action")
        row = encode_action(space, value)
        assert row.dtype == np.float32 and row.shape == (dist.action_width,)
        back = actions_to_space(space, dist.to_env(row[None]))[0]
        assert space.contains(back)
        flat_in = spaces.flatten(space, value)
        np.testing.assert_allclose(spaces.flatten(space, back), flat_in, atol=1e-6)


def test_a_tuple_action_from_msgpack_becomes_a_tuple() -> None:
    space = KINDS["tuple"]
    value = action_from_wire(space, [np.array([1, 4]), np.array([0.5], np.float32)])
    assert isinstance(value, tuple) and space.contains(value)


def test_the_model_spec_carries_the_parts_and_keeps_the_old_fields_for_old_kinds() -> None:
    spec = _model(KINDS["dict"]).spec()
    wire = spec.to_wire()
    assert wire["action_parts"] == [
        {"kind": "categorical", "size": 3},
        {"kind": "bernoulli", "size": 2},
        {"kind": "gaussian", "size": 2},
    ]
    assert wire["action_offsets"] == [1, 0, 0, 0, 0]
    assert wire["action_low"] == [None, None, None, -0.5, -0.5]
    assert ModelSpec.from_wire(wire) == spec
    old = _model(spaces.Discrete(4)).spec().to_wire()
    assert "action_parts" not in old and "action_offsets" not in old
    with pytest.raises(ConfigError, match="actor outputs"):
        ModelSpec.from_wire({**wire, "action_dim": 8})
    with pytest.raises(ConfigError, match="one per action column"):
        ModelSpec.from_wire({**wire, "action_offsets": [1]})


@pytest.mark.parametrize(
    ("action_space", "message"),
    [
        (spaces.Box(0, 10, (2,), np.int64), "MultiDiscrete for integer actions"),
        (spaces.Box(0.0, 1.0, (0,), np.float32), "no values to act on"),
        (spaces.MultiDiscrete([]), "no elements to act on"),
        (spaces.Dict({"a": spaces.Text(3)}), r"\['a'\]: PPO cannot act in Text"),
        (spaces.MultiDiscrete([70_000]), "65536"),
    ],
)
def test_an_action_space_ppo_cannot_learn_is_refused_with_the_reason(
    action_space: spaces.Space[Any], message: str
) -> None:
    with pytest.raises(UnsupportedSpaceError, match=message):
        check_learnable(OBS_SPACE, action_space)


def test_an_observation_space_that_cannot_be_flattened_is_refused() -> None:
    with pytest.raises(UnsupportedSpaceError, match="cannot be flattened"):
        check_learnable(spaces.Sequence(spaces.Discrete(2)), spaces.Discrete(2))
    with pytest.raises(UnsupportedSpaceError, match="flattens to no values"):
        check_learnable(spaces.Box(0.0, 1.0, (0,)), spaces.Discrete(2))


def test_the_protocol_doc_examples_hold() -> None:
    """docs/protocol.md §6.3 (the flat layout) and §14.4.1 (a multi-categorical action)."""
    dict_space = spaces.Dict(
        {
            "gear": spaces.Discrete(3, start=1),
            "lights": spaces.MultiBinary(2),
            "steer": spaces.Box(-1.0, 1.0, (1,), np.float32),
        }
    )
    value = {"gear": 3, "lights": [1, 0], "steer": [0.25]}
    row = encode_action(dict_space, check_value(dict_space, value, "action"))
    np.testing.assert_array_equal(row, np.array([2, 1, 0, 0.25], np.float32))
    space = spaces.MultiDiscrete([3, 2], start=[1, -1])
    dist = action_distribution(space)
    assert [(p.kind, p.size) for p in dist.parts] == [("categorical", 3), ("categorical", 2)]
    params = np.array([[0.1, 2.0, -1.0, 0.3, -0.2]], np.float32)
    actions, logp = dist.sample(params, None, np.random.default_rng(0), explore=False)
    np.testing.assert_array_equal(actions, [[1, 0]])
    np.testing.assert_array_equal(actions_to_space(space, dist.to_env(actions))[0], [2, -1])
    np.testing.assert_allclose(logp, [-0.65586], atol=1e-5)
