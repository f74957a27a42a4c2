"""Legal-move masks in hosted training: PPO and DQN runners never take an illegal action."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from rlserve import DQNConfig, PPOConfig

pytestmark = pytest.mark.timeout(300)


class PickTheBestLegal(gym.Env[dict[str, np.ndarray], int]):
    """Eight steps per episode: action ``i`` of 4 pays ``i / 3``; a random subset is legal.

    An illegal action raises: the runner would fail the iteration.
    """

    observation_space = gym.spaces.Dict(
        {
            "action_mask": gym.spaces.MultiBinary(4),
            "observations": gym.spaces.Box(0.0, 1.0, (1,), np.float32),
        }
    )
    action_space = gym.spaces.Discrete(4)

    def __init__(self, config: Any = None) -> None:
        self.rng = np.random.default_rng(0)
        self.t = 0

    def _obs(self) -> dict[str, np.ndarray]:
        mask = (self.rng.random(4) < 0.5).astype(np.int8)
        mask[self.rng.integers(0, 4)] = 1
        self.mask = mask
        return {"action_mask": mask, "observations": np.ones(1, np.float32)}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        super().reset(seed=seed)
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action: int) -> Any:
        if self.mask[int(action)] != 1:
            raise ValueError(f"illegal action {action} for the mask {self.mask}")
        self.t += 1
        return self._obs(), int(action) / 3.0, False, self.t >= 8, {}


def _best_legal_share(algo: Any) -> float:
    env = PickTheBestLegal()
    obs, _ = env.reset(seed=5)
    hits = 0
    for _ in range(200):
        action = int(algo.compute_single_action(obs, explore=False))
        hits += action == int(np.flatnonzero(env.mask).max())
        obs, *_ = env.step(action)
        if env.t >= 8:
            obs, _ = env.reset()
    return hits / 200


def test_hosted_ppo_learns_the_best_legal_action() -> None:
    config = (
        PPOConfig()
        .environment(PickTheBestLegal)
        .debugging(seed=0)
        .training(train_batch_size=256, minibatch_size=64, num_epochs=4, lr=1e-2, hidden=[16])
    )
    with config.build() as algo:
        for _ in range(8):
            algo.train()
        assert _best_legal_share(algo) > 0.95


def test_hosted_dqn_explores_only_legal_actions() -> None:
    # Epsilon stays near 1 for the whole run: nearly every action is a random legal choice.
    config = (
        DQNConfig()
        .environment(PickTheBestLegal)
        .debugging(seed=0)
        .training(
            learning_starts=64, min_env_steps_per_iteration=400, exploration_steps=100_000,
            hidden=[16],
        )
    )  # fmt: skip
    with config.build() as algo:
        result = algo.train()
        assert result["learners"]["default"]["gradient_steps"] > 0
        _best_legal_share(algo)  # greedy choices are legal too (an illegal one raises)
