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

from rlserve.policy.action_mask import MASKED_LOGIT


def _legal(values: np.ndarray) -> np.ndarray:
    """The choices a legal-move mask left legal in ``values`` (masked ones are MASKED_LOGIT)."""
    return np.greater(values, MASKED_LOGIT)


def epsilon_greedy_one(
    row: list[float], epsilon: float, rng: np.random.Generator, explore: bool
) -> tuple[int, float]:
    """One epsilon-greedy choice from one row of action values, and its log-probability.

    Exploring draws two numbers from ``rng``, as :func:`epsilon_greedy_choices` does per row.
    Plain floats: for a single decision among few choices they are several times faster than
    numpy calls on 1-element arrays. No legal-move mask (masked values take the array path).
    """
    greedy = row.index(max(row))
    action = greedy
    if explore:
        explored = rng.random() < epsilon
        random = int(rng.integers(0, len(row)))
        action = random if explored else greedy
    n = len(row)
    logp = math.log(1.0 - epsilon + epsilon / n) if action == greedy else math.log(epsilon / n)
    return action, logp


def epsilon_greedy_choices(
    values: np.ndarray,
    epsilon: float,
    rng: np.random.Generator,
    explore: bool,
    masked: bool = False,
) -> np.ndarray:
    """``[N]`` int64 choices from ``[N, n]`` action values, epsilon-greedily.

    The best choice, or (exploring) with probability ``epsilon`` a uniformly random one.
    Exploring always draws ``2 N`` numbers from ``rng`` (whatever ``epsilon`` is), so a seeded
    generator gives the same stream for every schedule. ``masked``: ``values`` went through a
    legal-move mask (illegal choices hold ``MASKED_LOGIT``) and the random choice is uniform
    among each row's legal ones (every row has one).
    """
    greedy = values.argmax(axis=1).astype(np.int64)
    if not explore:
        return greedy
    rows, choices = values.shape
    explored = rng.random(rows) < epsilon
    if not masked:
        random = rng.integers(0, choices, size=rows)
        return np.where(explored, random, greedy)
    allowed = _legal(values)
    count = allowed.sum(axis=1)
    nth = np.minimum((rng.random(rows) * count).astype(np.int64), count - 1)
    # The nth legal choice: the first whose running count of legal choices passes nth.
    random = np.argmax(np.cumsum(allowed, axis=1) > nth[:, None], axis=1)
    return np.where(explored, random, greedy)


def epsilon_greedy_log_prob(
    values: np.ndarray, epsilon: float, choices: np.ndarray, masked: bool = False
) -> np.ndarray:
    """``[N]`` float32 log-probabilities of ``choices`` under epsilon-greedy over ``values``.

    ``log(1 - epsilon + epsilon / n)`` for the best choice (the first of equal best ones),
    ``log(epsilon / n)`` for any other (``-inf`` when ``epsilon`` is 0). ``masked`` (see
    :func:`epsilon_greedy_choices`): ``n`` is the row's number of legal choices, and an illegal
    choice's log-probability is ``-inf``.
    """
    if masked:
        allowed = _legal(values)
        n_legal = allowed.sum(axis=1).astype(np.float64)
        chosen = np.asarray(choices).astype(np.int64)
        is_best = values.argmax(axis=1) == chosen
        with np.errstate(divide="ignore"):
            best_logp = np.log(1.0 - epsilon + epsilon / n_legal)
            other_logp = np.log(epsilon / n_legal)
        logp = np.where(is_best, best_logp, other_logp)
        ok = allowed[np.arange(values.shape[0]), chosen]
        return np.where(ok, logp, -np.inf).astype(np.float32)
    n = values.shape[1]
    best = values.argmax(axis=1) == np.asarray(choices).astype(np.int64)
    greedy = math.log(1.0 - epsilon + epsilon / n)
    other = math.log(epsilon / n) if epsilon > 0 else -math.inf
    return np.where(best, greedy, other).astype(np.float32)
