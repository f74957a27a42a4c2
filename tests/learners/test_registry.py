"""The algorithm registry: lookup by name, the learner it builds, refusals that name the fix."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from rlserve.errors import ConfigError, UnsupportedSpaceError
from rlserve.learners.ppo import PPOLearner
from rlserve.learners.ppo_config import PPOSettings
from rlserve.learners.registry import ALGORITHMS, DEFAULT_ALGORITHM, algorithm, register
from rlserve.protocol.fragment import Fragment
from rlserve.server.stats import LEARNER_INITIAL

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


BOX = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
UNBOUNDED = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)


@pytest.mark.parametrize(
    ("name", "action_space", "fits"),
    [
        ("dqn", BOX, "ppo, sac"),  # a bounded float Box: SAC learns it too
        ("dqn", UNBOUNDED, "ppo"),  # SAC needs finite bounds
        ("dqn", gym.spaces.MultiDiscrete([2, 3]), "ppo"),
        ("sac", gym.spaces.Discrete(3), "ppo, dqn"),
        ("sac", gym.spaces.MultiBinary(2), "ppo"),
    ],
)
def test_a_space_refusal_names_the_algorithms_that_fit(
    name: str, action_space: gym.Space[object], fits: str
) -> None:
    with pytest.raises(UnsupportedSpaceError) as caught:
        algorithm(name).check(OBS, action_space)
    message = str(caught.value)
    assert message.startswith(f"{name} learns"), message
    assert message.endswith(f"the algorithms that learn these spaces: {fits}"), message
    assert [e.name for e in ALGORITHMS.values() if e.fits(OBS, action_space)] == fits.split(", ")


def test_spaces_no_algorithm_learns_say_so() -> None:
    with pytest.raises(UnsupportedSpaceError, match="no algorithm of rlserve learns these"):
        algorithm("dqn").check(gym.spaces.Box(0.0, 1.0, (0,)), ACT)


def _fragment(
    action_space: gym.Space[object], steps: int, seed: int, logged: bool = False
) -> Fragment:
    rng = np.random.default_rng(seed)
    if isinstance(action_space, gym.spaces.Discrete):
        actions = rng.integers(0, 2, steps)
    else:
        actions = rng.uniform(-1, 1, (steps, 2)).astype(np.float32)
    return Fragment(
        episode_id=f"e{seed}",
        agent_id="agent0",
        policy_id="default",
        obs=rng.uniform(-1, 1, (steps + 1, 3)).astype(np.float32),
        actions=actions,
        rewards=rng.normal(0, 1, steps).astype(np.float32),
        behaviour_logp=np.full(steps, np.nan if logged else -0.7, np.float32),
        policy_chosen=np.full(steps, not logged),
        weights_version=np.zeros(steps, np.int64),
        terminated=True,
        truncated=False,
    )


SMALL = {
    "ppo": {"hidden": (8,), "train_batch_size": 32, "minibatch_size": 16, "logged_steps": "bc"},
    "dqn": {"hidden": (8,), "learning_starts": 16, "batch_size": 8, "train_every": 8},
    "sac": {"hidden": (8,), "learning_starts": 16, "batch_size": 8, "train_every": 8},
}


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_each_algorithm_declares_the_metrics_its_learner_reports(name: str) -> None:
    """The server lists an algorithm's metric names from the start (docs/metrics.md): its
    declaration must be what an update reports, beyond the names every server has."""
    entry = algorithm(name)
    action_space = BOX if name == "sac" else ACT
    learner = entry.make_learner(OBS, action_space, entry.settings(**SMALL[name]))
    # Steps the policy chose and logged ones (log_action): some statistics need both.
    learner.ingest([_fragment(action_space, 30, seed=1), _fragment(action_space, 10, 2, True)])
    assert learner.ready()
    reported = {k.removeprefix("learner/") for k in learner.update()}
    declared = set(entry.update_metrics) | set(entry.counter_metrics)
    base = {k.removeprefix("learner/") for k in LEARNER_INITIAL}
    assert declared <= reported, declared - reported
    assert reported <= declared | base, reported - declared - base
    assert not set(entry.update_metrics) & set(entry.counter_metrics)
    # Every server lists the names of the default algorithm, PPO's.
    if name == DEFAULT_ALGORITHM:
        assert {f"learner/{k}" for k in declared} <= set(LEARNER_INITIAL)
