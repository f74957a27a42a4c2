"""The algorithm registry: lookup by name, the learner it builds, refusals that name the fix."""

from __future__ import annotations

import gymnasium as gym
import pytest

from rlserve.algorithms.ppo import PPOLearner
from rlserve.algorithms.ppo_config import PPOSettings
from rlserve.algorithms.registry import ALGORITHMS, DEFAULT_ALGORITHM, algorithm, register
from rlserve.errors import ConfigError, UnsupportedSpaceError

OBS = gym.spaces.Box(-1.0, 1.0, (3,))
ACT = gym.spaces.Discrete(2)


def test_ppo_is_the_default_and_builds_its_learner() -> None:
    entry = algorithm(None)
    assert entry.name == DEFAULT_ALGORITHM == "ppo"
    assert algorithm("ppo") is entry and not entry.off_policy
    learner = entry.make_learner(
        OBS, ACT, PPOSettings(hidden=(8,), train_batch_size=64, minibatch_size=32)
    )
    assert isinstance(learner, PPOLearner)
    assert learner.sample_steps == 64


def test_an_unknown_name_lists_the_algorithms() -> None:
    with pytest.raises(ConfigError, match=r"unknown algorithm 'a2c'; choose one of: ppo \("):
        algorithm("a2c")


def test_wrong_settings_and_unlearnable_spaces_are_refused() -> None:
    entry = algorithm("ppo")
    with pytest.raises(ConfigError, match="ppo takes PPOSettings, got dict"):
        entry.make_learner(OBS, ACT, {"lr": 1e-3})
    with pytest.raises(UnsupportedSpaceError, match="observation space"):
        entry.make_learner(gym.spaces.Box(0.0, 1.0, (0,)), ACT, PPOSettings())


def test_names_are_registered_once() -> None:
    with pytest.raises(ValueError, match="registered already"):
        register(ALGORITHMS["ppo"])
