"""RLlib's SimpleCorridor: a class that takes an ``env_config`` dict, as the trainer creates it.

Check it with ``rlserve check-env examples/corridor.py:SimpleCorridor --env-config
'{"corridor_length": 5}'``.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class SimpleCorridor(gym.Env[np.ndarray, int]):
    """Walk right from cell 0 to the end of a corridor; each step costs 0.1, the end pays 1.

    Args:
        config: ``corridor_length`` (default 10): the cell that ends the episode.
    """

    def __init__(self, config: dict[str, Any] | None = None):
        self.end_pos = int((config or {}).get("corridor_length", 10))
        self.cur_pos = 0
        self.action_space = gym.spaces.Discrete(2)  # 0: left, 1: right
        self.observation_space = gym.spaces.Box(0.0, self.end_pos, (1,), np.float32)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Start at cell 0."""
        super().reset(seed=seed)
        self.cur_pos = 0
        return np.array([self.cur_pos], np.float32), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Move one cell left (not past 0) or right."""
        if action == 0 and self.cur_pos > 0:
            self.cur_pos -= 1
        elif action == 1:
            self.cur_pos += 1
        terminated = self.cur_pos >= self.end_pos
        reward = 1.0 if terminated else -0.1
        return np.array([self.cur_pos], np.float32), reward, terminated, False, {}
