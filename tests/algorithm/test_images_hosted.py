"""Image observations in hosted training: PPO's and SAC's conv encoders learn where the lit
pixel is."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from rlserve import PPOConfig, SACConfig
from rlserve.errors import ConfigError

pytestmark = pytest.mark.timeout(300)


class LitSide(gym.Env[np.ndarray, int]):
    """An 8x8 uint8 image with one lit pixel; action 0 pays 1 when it is in the left half, 1 when
    in the right. One step per episode."""

    observation_space = gym.spaces.Box(0, 255, (8, 8, 1), np.uint8)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, config: Any = None) -> None:
        self.rng = np.random.default_rng(0)

    def _obs(self) -> np.ndarray:
        image = np.zeros((8, 8, 1), np.uint8)
        row, column = self.rng.integers(0, 8, 2)
        image[row, column, 0] = 255
        self.side = int(column >= 4)
        return image

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        super().reset(seed=seed)
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        return self._obs(), {}

    def step(self, action: int) -> Any:
        reward = float(int(action) == self.side)
        return self._obs(), reward, True, False, {}


def _accuracy(algo: Any) -> float:
    env = LitSide()
    obs, _ = env.reset(seed=11)
    hits = 0
    for _ in range(200):
        side = env.side
        hits += int(algo.compute_single_action(obs, explore=False)) == side
        obs, *_ = env.step(0)
    return hits / 200


def test_hosted_ppo_with_a_conv_encoder_learns_the_lit_side() -> None:
    config = (
        PPOConfig()
        .environment(LitSide)
        .debugging(seed=0)
        .training(
            train_batch_size=256,
            minibatch_size=64,
            num_epochs=4,
            lr=3e-3,
            hidden=[16],
            model={"conv_filters": [[8, 2, 2], [16, 2, 2]]},
        )
    )
    with config.build() as algo:
        result = algo.train()  # 16 updates of 256 steps
        assert _accuracy(algo) > 0.95
        assert result["episode_return_mean"] > 0.8


def test_filters_that_shrink_the_image_are_refused_at_build() -> None:
    config = PPOConfig().environment(LitSide).training(conv_filters=[[8, 9, 1]])
    with pytest.raises(ConfigError, match=r"shrink the \(8, 8, 1\) image"):
        config.build()


class LitColumn(LitSide):
    """LitSide with a continuous action: it pays minus its distance to the lit pixel's column,
    ``column / 3.5 - 1`` in ``[-1, 1]``."""

    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)  # type: ignore[assignment]

    def _obs(self) -> np.ndarray:
        image = super()._obs()
        self.target = float(np.argmax(image.max(axis=(0, 2)))) / 3.5 - 1.0
        return image

    def step(self, action: Any) -> Any:
        reward = -abs(float(np.asarray(action).reshape(-1)[0]) - self.target)
        return self._obs(), reward, True, False, {}


def test_hosted_sac_with_conv_encoders_points_at_the_lit_column() -> None:
    config = (
        SACConfig()
        .environment(LitColumn)
        .debugging(seed=0)
        .training(
            min_env_steps_per_iteration=640,
            learning_starts=128,
            batch_size=64,
            gamma=0.0,
            lr=1e-3,
            hidden=[32],
            model={"conv_filters": [[8, 2, 1], [16, 2, 1]]},
        )
    )
    with config.build() as algo:
        for _ in range(3):  # 1,920 steps
            algo.train()
        env = LitColumn()
        obs, _ = env.reset(seed=11)
        errors = []
        for _ in range(100):
            action = algo.compute_single_action(obs, explore=False)
            errors.append(abs(float(action[0]) - env.target))
            obs, *_ = env.step(action)
    # Blind to the image, the best constant action (the middle) misses by 0.57 on average.
    assert float(np.mean(errors)) < 0.25


def test_sac_filters_that_shrink_the_image_are_refused_at_build() -> None:
    config = SACConfig().environment(LitColumn).training(conv_filters=[[8, 9, 1]])
    with pytest.raises(ConfigError, match=r"shrink the \(8, 8, 1\) image"):
        config.build()
