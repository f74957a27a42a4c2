"""Frame stacking of a hosted env: an observation made of its last ``n`` frames.

The layout, the refusals and the first frame's copies are :mod:`rlserve.policy.frame_stacking`'s
(channels concatenated for an image, oldest first; a new first axis for a vector). The
``frame_stack`` training setting stacks the same way without a wrapper, for external clients too.
"""

from __future__ import annotations

from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np

from rlserve.policy.frame_stacking import FrameStacker, stacked_space

__all__ = ["FrameStack", "FrameStacker", "stacked_space"]


class FrameStack(gym.Wrapper[np.ndarray, Any, Any, Any]):
    """A Box-observation env whose observations are its last ``n`` frames, stacked.

    Use it in a creator for a hosted env, e.g.
    ``PPOConfig().environment(lambda config: FrameStack(gym.make("MyImageEnv-v0"), 4))``.

    Raises:
        ConfigError: As :func:`stacked_space`.
    """

    def __init__(self, env: gym.Env[Any, Any], n: int) -> None:
        super().__init__(env)
        self._stacker = FrameStacker(env.observation_space, n)
        self.observation_space = self._stacker.space

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Reset the env and fill the stack with its first frame."""
        obs, info = self.env.reset(seed=seed, options=options)
        return self._stacker.reset(obs), info

    def step(self, action: Any) -> tuple[np.ndarray, SupportsFloat, bool, bool, dict[str, Any]]:
        """Step the env and push its frame."""
        obs, reward, terminated, truncated, info = self.env.step(action)
        return self._stacker.push(obs), reward, terminated, truncated, info
