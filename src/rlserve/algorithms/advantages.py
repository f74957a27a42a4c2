"""Return and advantage estimation shared by the algorithms (numpy, tested against hand values)."""

from __future__ import annotations

import numpy as np


def gae(
    rewards: np.ndarray,
    values: np.ndarray,
    bootstrap_value: float,
    gamma: float,
    lam: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Generalised advantage estimation over one fragment of one episode.

    Args:
        rewards: ``[T]`` reward for each action.
        values: ``[T]`` value estimate of each step's observation.
        bootstrap_value: Value of the observation after the last action; 0.0 when the episode
            terminated there (a truncated or unfinished episode passes its value estimate).
        gamma: Discount factor.
        lam: GAE lambda.

    Returns:
        ``(advantages, returns)``, each ``[T]`` float32, with ``returns = advantages + values``.
    """
    steps = rewards.shape[0]
    advantages = np.zeros(steps, dtype=np.float32)
    next_value = bootstrap_value
    running = 0.0
    for t in range(steps - 1, -1, -1):
        delta = rewards[t] + gamma * next_value - values[t]
        running = delta + gamma * lam * running
        advantages[t] = running
        next_value = values[t]
    return advantages, (advantages + values).astype(np.float32)
