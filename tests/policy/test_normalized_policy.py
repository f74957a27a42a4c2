"""Observation normalisation and normalised Box actions in the model spec and the numpy policy.

Hand-computed values, the wire form (absent fields mean none; every length and value from the
wire checked), and the numpy policy against the torch model that trains with the same settings.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from gymnasium import spaces

from rlserve.errors import ConfigError
from rlserve.learners.models import ActorCritic
from rlserve.learners.normalization import ObservationNormalizer, with_observation_normalization
from rlserve.policy import ModelSpec, NumpyPolicy
from rlserve.policy.gaussian import LOG_2PI
from rlserve.policy.space_distribution import (
    MAX_ACTION_HALF_RANGE,
    action_distribution,
    normalized_box_actions,
)

OBS_SPACE = spaces.Box(-np.inf, np.inf, (3,), np.float32)
BOX_100 = spaces.Box(
    np.array([-100.0, 0.0], np.float32), np.array([100.0, 10.0], np.float32), dtype=np.float32
)
MEAN = np.array([1.0, -2.0, 50.0], np.float32)
STD = np.array([2.0, 0.5, 100.0], np.float32)


def _spec(**fields: Any) -> ModelSpec:
    base = ModelSpec(3, (), "tanh", "gaussian", 3, (-1.0,) * 3, (1.0,) * 3)
    return ModelSpec(**{**{f: getattr(base, f) for f in base.__slots__}, **fields})


def _gaussian(spec: ModelSpec) -> NumpyPolicy:
    """A policy with no layer: the mean is the (normalised) observation itself."""
    return NumpyPolicy(spec, {"log_std": np.array([-1.0, 0.0, 0.5], np.float32)}, version=0)


# -- observation normalisation ---------------------------------------------------------------


def test_normalisation_by_hand_clips_and_is_applied_before_the_first_layer() -> None:
    spec = _spec(obs_mean=tuple(MEAN), obs_std=tuple(STD), obs_clip=3.0)
    policy = _gaussian(spec)
    obs = np.array([[3.0, 0.0, 50.0], [1.0, -2.5, -1000.0]], np.float32)
    expected = np.array([[1.0, 3.0, 0.0], [0.0, -1.0, -3.0]], np.float32)  # 4.0 and -10.5 clipped
    np.testing.assert_array_equal(policy.normalize(obs), expected)
    np.testing.assert_array_equal(policy.forward(obs), expected)
    assert policy.compute_actions(obs, explore=False).actions.tolist() == expected.tolist()


def test_normalisation_is_the_same_float32_arithmetic_as_torch() -> None:
    rng = np.random.default_rng(0)
    mean = rng.normal(0, 100, 3).astype(np.float32)
    std = rng.uniform(0.01, 50, 3).astype(np.float32)
    obs = rng.normal(0, 200, (256, 3)).astype(np.float32)
    spec = _spec(obs_mean=tuple(mean), obs_std=tuple(std), obs_clip=5.0)
    ours = _gaussian(spec).normalize(obs)
    theirs = ObservationNormalizer(mean, std, 5.0)(torch.as_tensor(obs)).numpy()
    np.testing.assert_array_equal(ours, theirs)  # bit for bit
    assert (np.abs(ours) == 5.0).any() and (np.abs(ours) < 5.0).any()


def test_a_spec_without_normalisation_is_the_old_wire_form() -> None:
    spec = _spec()
    wire = spec.to_wire()
    for key in ("obs_mean", "obs_std", "obs_clip", "action_scale", "action_bias"):
        assert key not in wire
    assert ModelSpec.from_wire(wire) == spec
    obs = np.array([[0.5, -0.25, 9.0]], np.float32)
    np.testing.assert_array_equal(_gaussian(spec).forward(obs), obs)


def test_normalisation_and_scaling_fields_round_trip_on_the_wire() -> None:
    spec = _spec(
        obs_mean=tuple(MEAN),
        obs_std=tuple(STD),
        obs_clip=10.0,
        action_scale=(100.0, 5.0, 1.0),
        action_bias=(0.0, 5.0, 0.0),
    )
    wire = spec.to_wire()
    assert wire["obs_mean"] == [1.0, -2.0, 50.0] and wire["obs_clip"] == 10.0
    assert wire["action_scale"] == [100.0, 5.0, 1.0] and wire["action_bias"] == [0.0, 5.0, 0.0]
    assert ModelSpec.from_wire(wire) == spec


BAD_WIRE: dict[str, tuple[dict[str, Any], str]] = {
    "short_mean": ({"obs_mean": [0.0, 0.0]}, "obs_dim = 3"),
    "long_std": ({"obs_std": [1.0] * 4}, "obs_dim = 3"),
    "nan_mean": ({"obs_mean": [0.0, math.nan, 0.0]}, "obs_mean holds"),
    "inf_mean": ({"obs_mean": [0.0, math.inf, 0.0]}, "obs_mean holds"),
    "zero_std": ({"obs_std": [1.0, 0.0, 1.0]}, "obs_std must hold finite positive"),
    "negative_std": ({"obs_std": [1.0, -1.0, 1.0]}, "obs_std must hold finite positive"),
    "inf_std": ({"obs_std": [1.0, math.inf, 1.0]}, "obs_std must hold finite positive"),
    "zero_clip": ({"obs_clip": 0.0}, "obs_clip must be"),
    "nan_clip": ({"obs_clip": math.nan}, "obs_clip must be"),
    "no_clip": ({"obs_clip": None}, "obs_clip must be"),
    "string_element": ({"obs_mean": [0.0, "1", 0.0]}, "malformed"),
    "bool_element": ({"obs_std": [1.0, True, 1.0]}, "malformed"),
    "not_a_list": ({"obs_mean": "abc"}, "malformed"),
    "scale_length": ({"action_scale": [1.0, 2.0]}, "scale and bias need 3"),
    "zero_scale": ({"action_scale": [1.0, 0.0, 1.0]}, "finite and positive"),
    "nan_bias": ({"action_bias": [0.0, math.nan, 0.0]}, "finite and positive"),
}


@pytest.mark.parametrize("case", list(BAD_WIRE))
def test_from_wire_checks_every_normalisation_field(case: str) -> None:
    good = _spec(
        obs_mean=(0.0,) * 3,
        obs_std=(1.0,) * 3,
        obs_clip=5.0,
        action_scale=(1.0,) * 3,
        action_bias=(0.0,) * 3,
    ).to_wire()
    change, message = BAD_WIRE[case]
    with pytest.raises(ConfigError, match=message):
        ModelSpec.from_wire({**good, **change})


def test_statistics_come_together_and_scaling_only_for_gaussian_columns() -> None:
    wire = _spec().to_wire()
    with pytest.raises(ConfigError, match="obs_dim = 3"):
        ModelSpec.from_wire({**wire, "obs_std": [1.0, 1.0, 1.0], "obs_clip": 1.0})
    with pytest.raises(ConfigError, match="obs_clip"):
        ModelSpec.from_wire({**wire, "obs_mean": [0.0] * 3, "obs_std": [1.0] * 3})
    categorical = ModelSpec(3, (), "tanh", "categorical", 3).to_wire()
    with pytest.raises(ConfigError, match="no action_scale"):
        ModelSpec.from_wire({**categorical, "action_scale": [2.0] * 3, "action_bias": [0.0] * 3})
    composite = ModelSpec.for_distribution(
        3,
        (),
        "tanh",
        action_distribution(spaces.Tuple((spaces.Discrete(3), spaces.Box(-5.0, 5.0, (1,))))),
    ).to_wire()
    with pytest.raises(ConfigError, match="column 0 is categorical"):
        ModelSpec.from_wire({**composite, "action_scale": [2.0, 5.0], "action_bias": [0.0, 0.0]})


# -- normalised Box actions ------------------------------------------------------------------


def test_normalized_box_actions_by_hand() -> None:
    assert normalized_box_actions(action_distribution(BOX_100)).scale == (100.0, 5.0)
    assert normalized_box_actions(action_distribution(BOX_100)).bias == (0.0, 5.0)
    unit = action_distribution(spaces.Box(-1.0, 1.0, (2,), np.float32))
    assert normalized_box_actions(unit) is unit  # nothing to scale: no fields at all
    big = float(np.finfo(np.float32).max)
    mixed = spaces.Box(
        np.array([-np.inf, 2.0, -big, 0.3], np.float32),
        np.array([5.0, 2.0, big, 0.7], np.float32),
    )
    dist = normalized_box_actions(action_distribution(mixed))
    # Unbounded, empty and "float32 max" ranges stay in the space's units.
    assert dist.scale[:3] == (1.0, 1.0, 1.0) and dist.bias[:3] == (0.0, 0.0, 0.0)
    assert dist.scale[3] == float(np.float32((np.float32(0.7) - np.float32(0.3)) / 2))
    assert dist.bias[3] == float(np.float32((np.float32(0.7) + np.float32(0.3)) / 2))
    assert big > MAX_ACTION_HALF_RANGE
    composite = normalized_box_actions(
        action_distribution(spaces.Dict({"g": spaces.Discrete(3), "s": spaces.Box(0.0, 4.0)}))
    )
    assert (composite.scale, composite.bias) == ((1.0, 2.0), (0.0, 2.0))


def test_scaled_gaussian_samples_in_the_space_units_with_the_normalised_density() -> None:
    spec = _spec(action_scale=(100.0, 5.0, 1.0), action_bias=(0.0, 5.0, 0.0))
    policy = NumpyPolicy(spec, {"log_std": np.array([-1.0, 0.0, 0.5], np.float32)}, 0, seed=4)
    obs = np.array([[0.5, -0.2, 0.3]], np.float32)
    out = policy.compute_actions(obs)
    noise = np.random.default_rng(4).standard_normal((1, 3)).astype(np.float32)
    log_std = np.array([-1.0, 0.0, 0.5], np.float32)
    u = obs + np.exp(log_std) * noise
    np.testing.assert_allclose(out.actions, u * [100.0, 5.0, 1.0] + [0.0, 5.0, 0.0], rtol=1e-6)
    expected_logp = -0.5 * (noise**2).sum() - log_std.sum() - 1.5 * LOG_2PI
    assert float(out.logp[0]) == pytest.approx(float(expected_logp), abs=1e-5)
    # The density of a given (space-unit) action is that of its normalised value.
    assert float(policy.log_prob(obs, out.actions)[0]) == pytest.approx(float(out.logp[0]), 1e-5)
    greedy = policy.compute_actions(obs, explore=False).actions
    np.testing.assert_allclose(greedy, [[50.0, 4.0, 0.3]], rtol=1e-6)
    np.testing.assert_allclose(policy.to_env_actions(greedy), [[1.0, 1.0, 0.3]])  # clipped


def test_composite_scaled_sample_and_log_prob_agree() -> None:
    space = spaces.Dict({"g": spaces.Discrete(3), "s": spaces.Box(-100.0, 100.0, (2,))})
    dist = normalized_box_actions(action_distribution(space))
    params = np.random.default_rng(5).normal(0, 1, (64, dist.param_dim)).astype(np.float32)
    log_std = np.array([-0.5, 0.2], np.float32)
    actions, logp = dist.sample(params, log_std, np.random.default_rng(6), explore=True)
    np.testing.assert_allclose(dist.log_prob(params, log_std, actions), logp, atol=1e-5)
    assert np.abs(actions[:, 1:]).max() > 50  # space units: the normalised std 1 reaches far
    mode, _ = dist.sample(params, log_std, np.random.default_rng(0), explore=False)
    np.testing.assert_allclose(mode[:, 1:], params[:, 3:] * 100.0, rtol=1e-5)


# -- the numpy policy against the torch model ------------------------------------------------


def _trained_like(normalize_actions: bool, seed: int = 0) -> ActorCritic:
    torch.manual_seed(seed)
    model = ActorCritic(OBS_SPACE, BOX_100, (16, 8), "tanh", normalize_actions=normalize_actions)
    with torch.no_grad():
        for p in model.actor.parameters():
            p.normal_(0.0, 0.6)
        model.log_std.copy_(torch.tensor([-0.3, 0.2]))
    return model


@pytest.mark.parametrize("normalize_actions", [True, False])
def test_numpy_policy_matches_the_torch_model_with_normalisation(normalize_actions: bool) -> None:
    model = _trained_like(normalize_actions)
    assert model.normalizes_actions is normalize_actions
    rng = np.random.default_rng(7)
    obs = (rng.normal(0, 1, (128, 3)) * [1.0, 300.0, 0.01] + [0.0, 1000.0, -5.0]).astype(np.float32)
    normalizer = ObservationNormalizer(obs.mean(axis=0), obs.std(axis=0), 4.0)
    spec = with_observation_normalization(
        model.spec(), normalizer.mean.numpy(), normalizer.std.numpy(), 4.0
    )
    policy = NumpyPolicy(ModelSpec.from_wire(spec.to_wire()), model.actor_arrays(), 3, seed=8)
    with torch.no_grad():
        x = normalizer(torch.as_tensor(obs))
        means = model.actor(x).numpy()
    np.testing.assert_allclose(policy.forward(obs), means, atol=1e-5)
    out = policy.compute_actions(obs)
    with torch.no_grad():
        logp, _ = model.log_prob_entropy(x, torch.as_tensor(out.actions))
    # The behaviour log-probability the policy reports is the learner's, to float32 rounding.
    np.testing.assert_allclose(out.logp, logp.numpy(), atol=1e-4)
    scale = 100.0 if normalize_actions else 1.0
    assert np.abs(out.actions[:, 0]).mean() > 0.5 * scale  # std 1 in the network's units
