"""SACConfig end to end: a hosted Pendulum-v1 learns, the run saves and restores as SAC.

The full target (the mean of the last 20 episodes >= -200 within 20,000 steps) is in
``bench/sac_pendulum.py``; here a short, seeded budget shows the learning in CI time.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rlserve import SACConfig
from rlserve.algorithm import Algorithm
from rlserve.learners.sac_config import SACSettings

pytestmark = pytest.mark.timeout(600)


def _config() -> SACConfig:
    config = (
        SACConfig()
        .environment("Pendulum-v1")
        .training(hidden=(64, 64), lr=1e-3, torch_threads=1, min_env_steps_per_iteration=1000)
        .debugging(seed=0)
    )
    assert isinstance(config, SACConfig)
    return config


def test_hosted_pendulum_learns_within_a_short_budget() -> None:
    algo = _config().build()
    results = [algo.train() for _ in range(5)]
    returns = [r["env_runners"]["episode_return_mean"] for r in results]
    # A random policy scores about -1200 an episode; the first 1000 steps are near that.
    assert returns[0] < -900
    greedy = algo.evaluate()["evaluation"]["env_runners"]
    # The greedy policy (tanh of the mean, scaled) after 5000 steps; -200 is the issue's
    # target for the training episodes at 20,000.
    assert greedy["episode_return_mean"] > -400, (returns, greedy)


def test_a_sac_run_restores_as_sac(tmp_path: Path) -> None:
    config = _config().training(min_env_steps_per_iteration=300, learning_starts=100)
    algo = config.build()
    algo.train()
    saved = algo.save(str(tmp_path / "ckpt"))
    restored = Algorithm.from_checkpoint(saved)
    assert isinstance(restored.config, SACConfig)
    settings = restored.config.algo_settings()
    assert isinstance(settings, SACSettings) and settings.hidden == (64, 64)
    assert restored.env_steps_sampled == algo.env_steps_sampled
    restored.train()
