"""Normalisation in the learners: statistics frozen per version and published, checkpoints.

PPO, DQN and SAC with ``normalize_observations``; PPO's ``normalize_rewards`` and
``normalize_actions``. The invariant checked throughout: the published weights and statistics
are exactly what the learner computes with, so the numpy policy's actions and log-probabilities
are the learner's.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from gymnasium import spaces

from rlserve.errors import ConfigError
from rlserve.learners.dqn import DQNLearner
from rlserve.learners.dqn_config import DQNSettings
from rlserve.learners.normalization import (
    MAX_NORMALIZED_OBS_DIM,
    ObservationNormalization,
    normalizes_observations,
    unbounded_observations,
)
from rlserve.learners.ppo import PPOLearner
from rlserve.learners.ppo_config import PPOSettings
from rlserve.learners.running_stats import NORM_EPSILON
from rlserve.learners.sac import SACLearner
from rlserve.learners.sac_config import SACSettings
from rlserve.policy import NumpyPolicy
from rlserve.protocol.fragment import Fragment

OBS = spaces.Box(-np.inf, np.inf, (3,), np.float32)
BOX_100 = spaces.Box(
    np.array([-100.0, 0.0], np.float32), np.array([100.0, 10.0], np.float32), dtype=np.float32
)
DISCRETE = spaces.Discrete(2)
# Observations far from zero and of very different spreads.
OBS_SCALE = np.array([100.0, 1.0, 0.01], np.float32)
OBS_OFFSET = np.array([1000.0, -5.0, 3.0], np.float32)
ONE_FLOAT32_ULP = 2.0**-23
"""The relative tolerance of statistics checked against :func:`_frozen`: the learner takes them
in fragment by fragment (Chan's merge), the test in one pass over all of them, both in float64,
and the two differ in their last digits; rounded to float32 they can differ by one unit in the
last place."""


def _ppo(**overrides: Any) -> PPOSettings:
    values: dict[str, Any] = {
        "train_batch_size": 64,
        "minibatch_size": 16,
        "num_epochs": 2,
        "hidden": (16,),
        "device": "cpu",
        "lr": 3e-3,
        "normalize_observations": True,
    }
    values.update(overrides)
    return PPOSettings(**values)


def episodes(
    policy: NumpyPolicy, count: int, seed: int, length: int = 8, reward_scale: float = 1.0
) -> list[Fragment]:
    """``count`` episodes acted by ``policy``, one fragment each (the last one truncated)."""
    rng = np.random.default_rng(seed)
    out = []
    for e in range(count):
        obs = (rng.normal(0, 1, (length + 1, 3)) * OBS_SCALE + OBS_OFFSET).astype(np.float32)
        acted = policy.compute_actions(obs[:length])
        env_actions = policy.to_env_actions(acted.actions)
        if env_actions.ndim == 1:
            rewards = (env_actions == (obs[:length, 1] > -5)).astype(np.float32)
        else:
            rewards = -np.abs(env_actions[:, 0] - obs[:length, 1] * 10) / 100
        out.append(
            Fragment(
                episode_id=f"s{seed}-{e}",
                agent_id="agent0",
                policy_id="default",
                obs=obs,
                actions=acted.actions,
                rewards=(rewards * reward_scale).astype(np.float32),
                behaviour_logp=acted.logp,
                policy_chosen=np.ones(length, bool),
                weights_version=np.full(length, policy.version, np.int64),
                terminated=e % 2 == 0,
                truncated=e % 2 == 1,
            )
        )
    return out


def _policy(learner: Any, seed: int = 0) -> NumpyPolicy:
    package = learner.weights()
    return NumpyPolicy(package.spec, package.arrays, package.version, seed=seed)


def _step_obs(fragments: list[Fragment]) -> np.ndarray:
    return np.concatenate([f.obs[: len(f)] for f in fragments]).astype(np.float64)


def _frozen(obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return obs.mean(axis=0).astype(np.float32), np.sqrt(obs.var(axis=0) + NORM_EPSILON).astype(
        np.float32
    )


# -- the normaliser --------------------------------------------------------------------------


def test_observe_then_freeze_then_revert() -> None:
    norm = ObservationNormalization(3, 5.0)
    np.testing.assert_array_equal(norm.mean, np.zeros(3, np.float32))
    np.testing.assert_array_equal(norm.std, np.ones(3, np.float32))
    data = np.array([[0.0, 10.0, 1.0], [2.0, 30.0, 1.0]], np.float32)
    norm.observe(data)
    np.testing.assert_array_equal(norm.mean, np.zeros(3, np.float32))  # not used until frozen
    norm.freeze()
    np.testing.assert_array_equal(norm.mean, [1.0, 20.0, 1.0])
    np.testing.assert_allclose(norm.std, [1.0, 10.0, 1e-4], rtol=1e-6)
    # A constant element divides by sqrt(1e-8): a new value far from it hits the clip.
    np.testing.assert_array_equal(norm.numpy(np.array([[1.0, 40.0, 2.0]])), [[0.0, 2.0, 5.0]])
    norm.revert()
    np.testing.assert_array_equal(norm.mean, np.zeros(3, np.float32))
    with pytest.raises(ConfigError, match="too wide"):
        ObservationNormalization(MAX_NORMALIZED_OBS_DIM + 1, 5.0)
    with pytest.raises(ConfigError, match="obs_clip"):
        ObservationNormalization(3, 0.0)


# -- PPO -------------------------------------------------------------------------------------


def test_ppo_publishes_the_statistics_it_trained_with_and_acts_as_it_computes() -> None:
    learner = PPOLearner(OBS, BOX_100, _ppo())
    first = learner.weights().spec
    assert first.obs_mean == (0.0,) * 3 and first.obs_std == (1.0,) * 3 and first.obs_clip == 10
    assert first.action_scale == (100.0, 5.0) and first.action_bias == (0.0, 5.0)
    batch = episodes(_policy(learner), 8, seed=1)
    learner.ingest(batch)
    learner.update()
    mean, std = _frozen(_step_obs(batch))
    spec = learner.weights().spec
    np.testing.assert_allclose(spec.obs_mean, mean, rtol=ONE_FLOAT32_ULP, atol=0)
    np.testing.assert_allclose(spec.obs_std, std, rtol=ONE_FLOAT32_ULP, atol=0)
    # Version 1 acts; its numpy log-probabilities are the learner's, its means the model's.
    policy = _policy(learner, seed=2)
    fragments = episodes(policy, 4, seed=3)
    obs = np.concatenate([f.obs[: len(f)] for f in fragments])
    actions = np.concatenate([f.actions for f in fragments])
    x = torch.as_tensor(learner.normalized_observations(obs))
    with torch.no_grad():
        logp, _ = learner.model.log_prob_entropy(x, torch.as_tensor(actions))
        means = learner.model.actor(x).numpy()
    np.testing.assert_allclose(
        np.concatenate([f.behaviour_logp for f in fragments]), logp, atol=2e-4
    )
    np.testing.assert_allclose(policy.forward(obs), means, atol=1e-5)
    assert np.abs(x.numpy()).max() < 10  # normalised, not raw (the raw values reach ~1000)
    # The next update trains with statistics of both batches and publishes those.
    learner.ingest(fragments)
    learner.update()
    both = _frozen(np.concatenate([_step_obs(batch), _step_obs(fragments)]))
    np.testing.assert_allclose(learner.weights().spec.obs_mean, both[0], rtol=1e-6)
    np.testing.assert_allclose(learner.weights().spec.obs_std, both[1], rtol=1e-6)


def test_an_update_that_applies_no_step_keeps_the_published_statistics() -> None:
    learner = PPOLearner(OBS, DISCRETE, _ppo(max_abs_input=3e38))
    batch = episodes(_policy(learner), 8, seed=1)
    # Finite, but the value loss squares them past float32: no step applies.
    learner.ingest([dataclasses.replace(f, rewards=f.rewards + 1e30) for f in batch])
    metrics = learner.update()
    assert metrics["learner/updates_skipped_nonfinite"] == 1
    assert learner.version == 0
    assert learner.weights().spec.obs_mean == (0.0,) * 3  # version 0's, as published
    # The running statistics did take the steps in: the next update uses them.
    learner.ingest(episodes(_policy(learner), 8, seed=2))
    learner.update()
    assert learner.version == 1
    assert abs(learner.weights().spec.obs_mean[0] - 1000) < 30


def test_reward_normalisation_makes_the_update_independent_of_the_reward_unit() -> None:
    def values_after_update(normalize: bool, unit: float) -> tuple[np.ndarray, float]:
        learner = PPOLearner(
            OBS, DISCRETE, _ppo(normalize_rewards=normalize, seed=4, max_grad_norm=1e9)
        )
        learner.ingest(episodes(_policy(learner), 8, seed=5, reward_scale=unit))
        metrics = learner.update()
        probe = learner.normalized_observations(
            np.random.default_rng(6).normal(0, 1, (32, 3)) * OBS_SCALE + OBS_OFFSET
        )
        with torch.no_grad():
            values = learner.model.value(torch.as_tensor(probe)).numpy()
        return values, metrics.get("learner/reward_scale", float("nan"))

    small, scale_small = values_after_update(True, 1.0)
    large, scale_large = values_after_update(True, 100.0)
    assert scale_large == pytest.approx(100 * scale_small, rel=1e-6)
    np.testing.assert_allclose(small, large, rtol=1e-3, atol=1e-4)
    raw_small, _ = values_after_update(False, 1.0)
    raw_large, _ = values_after_update(False, 100.0)
    assert np.abs(raw_large - raw_small).max() > 10 * np.abs(small - large).max() + 1e-3


def test_reward_scale_is_the_std_of_the_discounted_returns_by_hand() -> None:
    learner = PPOLearner(OBS, DISCRETE, _ppo(normalize_rewards=True, gamma=0.5))
    batch = episodes(_policy(learner), 8, seed=1, length=3)
    learner.ingest(batch)
    metrics = learner.update()
    returns = []
    for f in batch:
        running = 0.0
        for r in f.rewards.tolist():
            running = 0.5 * running + r
            returns.append(running)
    expected = float(np.sqrt(np.var(returns) + NORM_EPSILON))
    assert metrics["learner/reward_scale"] == pytest.approx(expected, rel=1e-12)


def test_ppo_checkpoint_round_trip_with_every_normalisation(tmp_path: Path) -> None:
    settings = _ppo(normalize_rewards=True)
    a = PPOLearner(OBS, BOX_100, settings)
    a.ingest(episodes(_policy(a), 8, seed=1))
    a.update()
    path = tmp_path / "ckpt.pt"
    a.save(path, {})
    state = torch.load(path, weights_only=True)
    assert state["normalize_actions"] is True
    assert state["obs_normalization"]["mean"].dtype == torch.float64
    assert state["obs_normalization"]["frozen_std"].dtype == torch.float32
    b = PPOLearner(OBS, BOX_100, settings)
    b.load(path)
    assert b.weights().spec == a.weights().spec
    assert a.obs_normalization is not None and b.obs_normalization is not None
    assert a.return_scaler is not None and b.return_scaler is not None
    assert b.obs_normalization.stats.count == a.obs_normalization.stats.count == 64
    np.testing.assert_array_equal(b.obs_normalization.stats.var, a.obs_normalization.stats.var)
    np.testing.assert_array_equal(b.return_scaler.stats.var, a.return_scaler.stats.var)
    # Both continue identically.
    batch = episodes(_policy(a), 8, seed=2)
    a.ingest(batch)
    b.ingest(batch)
    metrics_a, metrics_b = a.update(), b.update()
    metrics_a.pop("learner/update_seconds")
    metrics_b.pop("learner/update_seconds")
    assert metrics_a == metrics_b
    assert b.weights().spec == a.weights().spec


def test_a_checkpoint_brings_its_own_normalisation_whatever_the_settings(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    normalising = PPOLearner(OBS, BOX_100, _ppo())
    normalising.ingest(episodes(_policy(normalising), 8, seed=1))
    normalising.update()
    with_stats = tmp_path / "with.pt"
    normalising.save(with_stats, {})
    raw = PPOLearner(OBS, BOX_100, _ppo(normalize_observations=False, normalize_actions=False))
    without = tmp_path / "without.pt"
    raw.save(without, {})

    caplog.set_level(logging.WARNING, "rlserve.learner")
    loaded = PPOLearner(OBS, BOX_100, _ppo(normalize_observations=False))
    loaded.load(with_stats)
    assert loaded.weights().spec == normalising.weights().spec
    assert "trained on normalised observations" in caplog.text
    caplog.clear()
    fresh = PPOLearner(OBS, BOX_100, _ppo())
    fresh.initialise_from(without)
    spec = fresh.weights().spec
    assert not spec.obs_mean and not spec.action_scale
    assert "trained on raw observations" in caplog.text
    assert "in the Box's own units" in caplog.text


def test_a_checkpoint_of_before_normalised_actions_keeps_acting_in_the_box_units(
    tmp_path: Path,
) -> None:
    old = PPOLearner(OBS, BOX_100, _ppo(normalize_observations=False, normalize_actions=False))
    path = tmp_path / "old.pt"
    old.save(path, {})
    state = torch.load(path, weights_only=True)
    del state["normalize_actions"]  # as an rlserve without normalised actions wrote it
    torch.save(state, path)
    loaded = PPOLearner(OBS, BOX_100, _ppo(normalize_observations=False))
    assert loaded.model.normalizes_actions  # the default
    loaded.load(path)
    assert not loaded.model.normalizes_actions
    assert loaded.weights().spec == old.weights().spec


# -- DQN and SAC -----------------------------------------------------------------------------


def _dqn(**overrides: Any) -> DQNSettings:
    values: dict[str, Any] = {
        "hidden": (16,),
        "device": "cpu",
        "batch_size": 16,
        "learning_starts": 32,
        "train_every": 16,
        "normalize_observations": True,
    }
    values.update(overrides)
    return DQNSettings(**values)


def _sac(**overrides: Any) -> SACSettings:
    values: dict[str, Any] = {
        "hidden": (16,),
        "device": "cpu",
        "batch_size": 16,
        "learning_starts": 32,
        "train_every": 16,
        "buffer_size": 1000,
        "normalize_observations": True,
    }
    values.update(overrides)
    return SACSettings(**values)


@pytest.mark.parametrize("kind", ["dqn", "sac"])
def test_off_policy_learners_store_raw_observations_and_publish_frozen_statistics(
    kind: str, tmp_path: Path
) -> None:
    learner: DQNLearner | SACLearner
    if kind == "dqn":
        learner = DQNLearner(OBS, DISCRETE, _dqn())
    else:
        learner = SACLearner(OBS, BOX_100, _sac())
    assert learner.weights().spec.obs_mean == (0.0,) * 3
    batch = episodes(_policy(learner), 6, seed=1)
    learner.ingest(batch)
    assert learner.ready()
    # The replay buffer holds the observations as they came.
    np.testing.assert_array_equal(learner.replay.state()["obs"], _step_obs(batch))
    learner.update()
    mean, std = _frozen(_step_obs(batch))
    spec = learner.weights().spec
    np.testing.assert_allclose(spec.obs_mean, mean, rtol=ONE_FLOAT32_ULP, atol=0)
    np.testing.assert_allclose(spec.obs_std, std, rtol=ONE_FLOAT32_ULP, atol=0)
    # The statistics taken in after the update wait for the next one.
    more = episodes(_policy(learner), 2, seed=2)
    learner.ingest(more)
    assert learner.weights().spec.obs_mean == spec.obs_mean
    # Numpy inference is the torch network on the normalised observations.
    obs = _step_obs(more).astype(np.float32)
    x = torch.as_tensor(learner.normalized_observations(obs))
    with torch.no_grad():
        expected = (
            learner.model(x) if isinstance(learner, DQNLearner) else learner.actor.actor(x)
        ).numpy()
    np.testing.assert_allclose(_policy(learner).forward(obs), expected, atol=1e-5)
    # A checkpoint brings the running and the frozen statistics back.
    path = tmp_path / "ckpt.pt"
    learner.save(path, {})
    copy: DQNLearner | SACLearner
    copy = DQNLearner(OBS, DISCRETE, _dqn()) if kind == "dqn" else SACLearner(OBS, BOX_100, _sac())
    copy.load(path)
    assert copy.weights().spec == learner.weights().spec
    assert copy.obs_normalization is not None and learner.obs_normalization is not None
    assert copy.obs_normalization.stats.count == learner.obs_normalization.stats.count == 64
    np.testing.assert_array_equal(
        copy.obs_normalization.stats.mean, learner.obs_normalization.stats.mean
    )


@pytest.mark.parametrize(
    ("env_id", "unbounded"),
    [("CartPole-v1", True), ("Pendulum-v1", False), ("Acrobot-v1", False)],
)
def test_automatic_normalisation_is_on_for_unbounded_box_observations(
    env_id: str, unbounded: bool
) -> None:
    import gymnasium as gym

    space = gym.make(env_id).observation_space
    assert unbounded_observations(space) is unbounded
    learner = PPOLearner(space, DISCRETE, PPOSettings(hidden=(8,), device="cpu"))
    assert (learner.obs_normalization is not None) is unbounded
    off = PPOLearner(space, DISCRETE, PPOSettings(hidden=(8,), normalize_observations=False))
    assert off.obs_normalization is None  # an explicit setting wins over the rule
    on = PPOLearner(space, DISCRETE, PPOSettings(hidden=(8,), normalize_observations=True))
    assert on.obs_normalization is not None


def test_automatic_normalisation_looks_into_dict_and_tuple_spaces() -> None:
    bounded = spaces.Box(-1.0, 1.0, (2,), np.float32)
    assert not unbounded_observations(spaces.Dict({"a": bounded, "b": spaces.Discrete(3)}))
    assert unbounded_observations(spaces.Dict({"a": bounded, "b": OBS}))
    assert unbounded_observations(spaces.Tuple((spaces.Discrete(2), spaces.Tuple((OBS,)))))
    half = spaces.Box(np.array([0.0, -np.inf], np.float32), np.array([1.0, 5.0], np.float32))
    assert unbounded_observations(half)  # one infinite bound is enough
    assert not unbounded_observations(spaces.MultiDiscrete([3, 4]))
    assert normalizes_observations(None, OBS) and not normalizes_observations(False, OBS)
    assert normalizes_observations(True, bounded) and not normalizes_observations(None, bounded)
    wide = spaces.Box(-np.inf, np.inf, (MAX_NORMALIZED_OBS_DIM + 1,), np.float32)
    assert not normalizes_observations(None, wide)  # too wide to ship: auto stays off
