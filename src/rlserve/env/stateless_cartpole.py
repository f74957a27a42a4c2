"""CartPole without its velocities: a task a policy can only solve with memory.

Gymnasium's ``CartPole-v1`` observes cart position, cart velocity, pole angle and pole angular
velocity. :class:`StatelessCartPole` keeps the two positions alone, so one observation cannot
tell which way the pole is moving; a policy has to infer the velocities from the last few
observations (``use_lstm=True``, or stacked frames). RLlib's examples call this task
``StatelessCartPole``; this is the same task written over Gymnasium's env (the 500-step limit,
rewards and termination of ``CartPole-v1`` unchanged). Needs gymnasium and numpy only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np
from gymnasium import spaces

__all__ = ["KEPT", "StatelessCartPole"]

KEPT = (0, 2)
"""The entries of CartPole's observation that are kept: cart position and pole angle."""


class StatelessCartPole(gym.Env[np.ndarray, int]):
    """``CartPole-v1`` observing ``[cart position, pole angle]`` (a ``Box`` of shape ``(2,)``).

    Hosted: ``PPOConfig().environment(StatelessCartPole).training(use_lstm=True)``; from the
    command line: ``rlserve train --env rlserve.env:StatelessCartPole``.

    Args:
        config: The ``env_config`` dict (RLlib style): its keys are passed to
            ``gym.make("CartPole-v1", ...)``, e.g. ``{"max_episode_steps": 200}``.
        render_mode: Gymnasium's render mode, passed on.
    """

    # An env of its own that holds CartPole, not a wrapper: a wrapper's spec would tell
    # gym.make to rebuild it around an env, which this constructor does not take.
    def __init__(
        self, config: Mapping[str, Any] | None = None, render_mode: str | None = None
    ) -> None:
        self._env = gym.make("CartPole-v1", render_mode=render_mode, **dict(config or {}))
        self.metadata = self._env.metadata
        self.render_mode = render_mode
        self.action_space = self._env.action_space
        full = self._env.observation_space
        assert isinstance(full, spaces.Box)
        index = list(KEPT)
        self.observation_space = spaces.Box(full.low[index], full.high[index], dtype=np.float32)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Reset CartPole; its first observation without the velocities."""
        super().reset(seed=seed)
        obs, info = self._env.reset(seed=seed, options=options)
        return _stateless(obs), info

    def step(self, action: int) -> tuple[np.ndarray, SupportsFloat, bool, bool, dict[str, Any]]:
        """Step CartPole; its observation without the velocities."""
        obs, reward, terminated, truncated, info = self._env.step(action)
        return _stateless(obs), reward, terminated, truncated, info

    def render(self) -> Any:
        """CartPole's rendering (it shows the whole state)."""
        return self._env.render()

    def close(self) -> None:
        """Close CartPole."""
        self._env.close()


def _stateless(observation: np.ndarray) -> np.ndarray:
    """The full observation's cart position and pole angle."""
    return np.asarray(observation, dtype=np.float32)[list(KEPT)]
