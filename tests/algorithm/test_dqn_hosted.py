"""DQN through the Algorithm API on a hosted CartPole: it learns, checkpoints and restores."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rlserve import DQNConfig
from rlserve.algorithm.algorithm import Algorithm

pytestmark = pytest.mark.timeout(300)

FAST: dict[str, Any] = {
    "learning_starts": 500,
    "min_env_steps_per_iteration": 2000,
}
"""The defaults (epsilon to 0.01 over 5,000 steps, one gradient step per 4 env steps, soft
target updates), with a shorter warm-up."""


def test_dqn_learns_cartpole_within_a_step_budget() -> None:
    config = DQNConfig().environment("CartPole-v1").debugging(seed=0).training(**FAST)
    with config.build() as algo:
        while algo.env_steps_sampled < 14_000:
            result = algo.train()
        learner = result["learners"]["default"]
        assert learner["epsilon"] == pytest.approx(0.01)
        assert learner["gradient_steps"] > 3_000  # a quarter of the 13,500 after the warm-up
        evaluation = algo.evaluate(5)["evaluation"]["env_runners"]
    # A random policy averages about 22; the greedy policy balances far longer.
    assert evaluation["episode_return_mean"] >= 150, evaluation


def test_a_dqn_checkpoint_restores_with_its_replay(tmp_path: Path) -> None:
    config = (
        DQNConfig()
        .environment("CartPole-v1")
        .debugging(seed=1)
        .training(
            **{**FAST, "learning_starts": 100, "min_env_steps_per_iteration": 300},
            checkpoint_replay=True,
            hidden=[16],
        )
    )
    with config.build() as algo:
        algo.train()
        folder = algo.save(tmp_path / "ckpt")
        stored = len(algo.learners["default"].replay)  # type: ignore[attr-defined]
        counters = algo.learners["default"].counters()
    assert (folder / "config.toml").read_text().count("[dqn]") == 1
    with Algorithm.from_checkpoint(folder) as restored:
        assert restored.config.algo_name == "dqn"
        learner = restored.learners["default"]
        assert len(learner.replay) == stored > 0  # type: ignore[attr-defined]
        assert learner.counters() == counters
        restored.train()
