"""Return and advantage estimation shared by the algorithms (numpy, tested against hand values)."""

from __future__ import annotations

import numpy as np


def gae(
    rewards: np.ndarray,
    values: np.ndarray,
    bootstrap_value: float,
    gamma: float,
    lam: float,
    traces: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Generalised advantage estimation over one fragment of one episode.

    With ``traces`` the lambda trace is cut step by step, as Retrace does for off-policy data:
    ``A[t] = delta[t] + gamma * lam * traces[t + 1] * A[t + 1]``, where
    ``delta[t] = rewards[t] + gamma * values[t + 1] - values[t]``. A trace of 1 everywhere is
    plain GAE; a trace of 0 at step ``t + 1`` makes ``A[t]`` the one-step TD error, so nothing
    of step ``t + 1``'s action (say, one logged from someone else) reaches step ``t``. A step's
    own trace never scales its own ``delta``: its action is the one whose advantage is estimated.

    Args:
        rewards: ``[T]`` reward for each action.
        values: ``[T]`` value estimate of each step's observation.
        bootstrap_value: Value of the observation after the last action; 0.0 when the episode
            terminated there (a truncated or unfinished episode passes its value estimate).
        gamma: Discount factor.
        lam: GAE lambda.
        traces: ``[T]`` trace coefficient of each step, in ``[0, 1]``; None: all 1 (plain GAE).

    Returns:
        ``(advantages, returns)``, each ``[T]`` float32, with ``returns = advantages + values``.
    """
    steps = rewards.shape[0]
    advantages = np.zeros(steps, dtype=np.float32)
    next_value = bootstrap_value
    running = 0.0
    decay = gamma * lam
    if traces is None:
        for t in range(steps - 1, -1, -1):
            delta = rewards[t] + gamma * next_value - values[t]
            running = delta + decay * running
            advantages[t] = running
            next_value = values[t]
    else:
        next_trace = 1.0
        for t in range(steps - 1, -1, -1):
            delta = rewards[t] + gamma * next_value - values[t]
            running = delta + decay * next_trace * running
            advantages[t] = running
            next_value = values[t]
            next_trace = float(traces[t])
    return advantages, (advantages + values).astype(np.float32)
