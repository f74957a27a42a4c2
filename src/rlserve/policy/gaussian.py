"""The Gaussian families' arithmetic: the diagonal Gaussian's constant and SAC's squashed Gaussian.

A ``squashed_gaussian`` part (SAC's) reads ``2 * size`` outputs: ``size`` means, then ``size``
log standard deviations (state-dependent, clamped to ``[SQUASHED_LOG_STD_MIN,
SQUASHED_LOG_STD_MAX]``). It samples ``u ~ N(mean, std)``, squashes ``a = tanh(u)`` and scales
to the Box: ``low + (a + 1) / 2 * (high - low)``; its column holds that value, in the space's
units (as the environment takes it), and its log-density is that of the scaled action:
``sum log N(u) - sum log(1 - tanh(u)^2 + SQUASH_EPS) - sum log((high - low) / 2)``. Its mode is
``tanh(mean)``, scaled.

Needs numpy only, never torch: the client uses it too.
"""

from __future__ import annotations

import numpy as np

LOG_2PI = float(np.log(2.0 * np.pi))
"""``log(2 pi)``, in every Gaussian log-density."""

SQUASHED_LOG_STD_MIN = -20.0
"""Lowest log standard deviation of a squashed Gaussian (the actor's output is clamped)."""

SQUASHED_LOG_STD_MAX = 2.0
"""Highest log standard deviation of a squashed Gaussian."""

SQUASH_EPS = 1e-6
"""Added to ``1 - tanh(u)^2`` in a squashed Gaussian's log-density (SAC's convention)."""


def _squashed_params(params: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Means and clamped log standard deviations (float64) of ``[N, 2A]`` actor outputs."""
    half = params.shape[1] // 2
    mean = params[:, :half].astype(np.float64)
    log_std = np.clip(
        params[:, half:].astype(np.float64), SQUASHED_LOG_STD_MIN, SQUASHED_LOG_STD_MAX
    )
    return mean, log_std


def _squashed_logp(
    noise: np.ndarray, log_std: np.ndarray, squashed: np.ndarray, half_range: np.ndarray
) -> np.ndarray:
    """Log-density of scaled actions given the standard noise, the log-std and ``tanh(u)``."""
    gauss = -0.5 * (noise**2).sum(axis=1) - log_std.sum(axis=1) - 0.5 * LOG_2PI * noise.shape[1]
    jacobian = np.log(1.0 - squashed**2 + SQUASH_EPS).sum(axis=1) + np.log(half_range).sum()
    return gauss - jacobian


def squashed_sample(
    params: np.ndarray,
    low: tuple[float, ...],
    high: tuple[float, ...],
    rng: np.random.Generator,
    explore: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """Sample (or take the mode of) a squashed Gaussian.

    Args:
        params: ``[N, 2A]`` actor outputs: means, then log standard deviations (clamped here).
        low: The Box's lower bounds, one per value.
        high: Its upper bounds.
        rng: The sampling generator.
        explore: Sample when True; take ``tanh(mean)`` when False.

    Returns:
        ``[N, A]`` float32 actions in the space's units and their ``[N]`` float32
        log-densities.
    """
    mean, log_std = _squashed_params(params)
    noise = rng.standard_normal(mean.shape) if explore else np.zeros_like(mean)
    squashed = np.tanh(mean + np.exp(log_std) * noise)
    lo, hi = np.asarray(low, dtype=np.float64), np.asarray(high, dtype=np.float64)
    half_range = (hi - lo) / 2.0
    actions = np.clip(lo + (squashed + 1.0) * half_range, lo, hi)
    logp = _squashed_logp(noise, log_std, squashed, half_range)
    return actions.astype(np.float32), logp.astype(np.float32)


def squashed_log_prob(
    params: np.ndarray, low: tuple[float, ...], high: tuple[float, ...], actions: np.ndarray
) -> np.ndarray:
    """Log-density of ``[N, A]`` actions (in the space's units) under a squashed Gaussian.

    Actions are clipped into the Box and their squashed value to ``+-(1 - SQUASH_EPS)`` first,
    so a value on a bound has a finite (very low) density.
    """
    mean, log_std = _squashed_params(params)
    lo, hi = np.asarray(low, dtype=np.float64), np.asarray(high, dtype=np.float64)
    half_range = (hi - lo) / 2.0
    x = np.clip(actions.astype(np.float64), lo, hi)
    squashed = np.clip((x - lo) / half_range - 1.0, -1.0 + SQUASH_EPS, 1.0 - SQUASH_EPS)
    noise = (np.arctanh(squashed) - mean) / np.exp(log_std)
    return _squashed_logp(noise, log_std, squashed, half_range).astype(np.float32)
