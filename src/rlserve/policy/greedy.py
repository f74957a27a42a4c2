"""Epsilon-greedy acting over action values (the ``epsilon_greedy`` distribution's arithmetic).

An ``epsilon_greedy`` distribution (the value-based learners') reads its part's outputs as action
values, not logits: it takes the best choice with probability ``1 - epsilon + epsilon / n`` and
each other choice with ``epsilon / n`` (a uniformly random choice with probability ``epsilon``,
else the best); its mode is the best choice. ``epsilon`` travels with the weights (the model
spec's ``epsilon``), as the learner's schedule moves it.

Needs numpy only, never torch: the client uses it too.
"""

from __future__ import annotations

import math

import numpy as np


def epsilon_greedy_choices(
    values: np.ndarray, epsilon: float, rng: np.random.Generator, explore: bool
) -> np.ndarray:
    """``[N]`` int64 choices from ``[N, n]`` action values, epsilon-greedily.

    The best choice, or (exploring) with probability ``epsilon`` a uniformly random one.
    Exploring always draws ``2 N`` numbers from ``rng`` (whatever ``epsilon`` is), so a seeded
    generator gives the same stream for every schedule.
    """
    greedy = values.argmax(axis=1).astype(np.int64)
    if not explore:
        return greedy
    rows, choices = values.shape
    explored = rng.random(rows) < epsilon
    random = rng.integers(0, choices, size=rows)
    return np.where(explored, random, greedy)


def epsilon_greedy_log_prob(values: np.ndarray, epsilon: float, choices: np.ndarray) -> np.ndarray:
    """``[N]`` float32 log-probabilities of ``choices`` under epsilon-greedy over ``values``.

    ``log(1 - epsilon + epsilon / n)`` for the best choice (the first of equal best ones),
    ``log(epsilon / n)`` for any other (``-inf`` when ``epsilon`` is 0).
    """
    n = values.shape[1]
    best = values.argmax(axis=1) == np.asarray(choices).astype(np.int64)
    greedy = math.log(1.0 - epsilon + epsilon / n)
    other = math.log(epsilon / n) if epsilon > 0 else -math.inf
    return np.where(best, greedy, other).astype(np.float32)
