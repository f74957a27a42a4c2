"""The one range rule for numbers that are stored and trained on (float32).

Everything a client sends that reaches the learner (observations, continuous actions, rewards,
behaviour log-probabilities) is stored as float32. A float64 value of 1e39 is finite where it is
checked but infinite once cast, and a finite float32 such as a reward of 3e38 still turns the
learner's loss into NaN (discounted sums and squares overflow). So values are checked *after* the
cast to float32, against a per-field bound:

* observations and continuous actions: finite in float32 (``|x| <= 3.4028235e38``) and within the
  space's bounds (checked in :mod:`rlserve.protocol.spaces`);
* rewards: ``|r| <= MAX_ABS_REWARD`` (1e9): a return of up to ``r / (1 - gamma)`` and its square
  in the value loss then stay far inside float32 for any discount below 0.99999;
* behaviour log-probabilities: ``|logp| <= MAX_ABS_LOGP`` (1e4): no sampled action has a
  probability below e^-10000; anything beyond is not a log-probability but an attempt to blow up
  the importance ratio.

Every refusal is a :class:`~rlserve.errors.SpaceError` (wire code ``bad_value``) that names the
field, the offending value and the allowed range. numpy only: the client may import this.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlserve.errors import SpaceError

FLOAT32_MAX = float(np.finfo(np.float32).max)
"""Largest finite float32 (about 3.4028235e38)."""

MAX_ABS_REWARD = 1e9
"""Largest accepted reward magnitude (one ``reward`` value or one fragment step)."""

MAX_ABS_LOGP = 1e4
"""Largest accepted magnitude of a reported behaviour log-probability."""


def _range_text(limit: float) -> str:
    if limit >= FLOAT32_MAX:
        return f"finite float32 values (-{FLOAT32_MAX:.8g}..{FLOAT32_MAX:.8g})"
    return f"-{limit:g}..{limit:g} (the range accepted in float32)"


def within(array: np.ndarray, limit: float) -> bool:
    """Whether every element of a float array is finite and of magnitude at most ``limit``."""
    if array.size == 0:
        return True
    # Two reductions and no temporary array; a NaN anywhere makes min and max NaN (False).
    return bool(-limit <= array.min() and array.max() <= limit)


def indices_within(values: np.ndarray, highest: int) -> bool:
    """Whether every element of a non-empty integer array is in ``0..highest``."""
    if values.dtype == np.int64:
        # Viewed as unsigned, a negative value is at least 2**63: one reduction checks both ends.
        return bool(values.view(np.uint64).max() <= highest)
    return bool(values.min() >= 0 and values.max() <= highest)


def check_float32(values: Any, field: str, limit: float = FLOAT32_MAX) -> np.ndarray:
    """Cast ``values`` to float32 and check that every element is finite and within ``limit``.

    NaN entries are refused too; a caller that allows NaN (a logged action's unknown
    log-probability) passes only the entries that must be numbers.

    Args:
        values: A number or an array of numbers.
        field: The field's name for the error message, e.g. ``report_samples 'b1'.rewards``.
        limit: Largest accepted magnitude (default: the float32 range).

    Returns:
        The values as a float32 array (``values`` itself when it already is one).

    Raises:
        SpaceError: A value is NaN, infinite once cast, or over ``limit`` (code ``bad_value``).
    """
    array = np.asarray(values)
    if array.dtype != np.float32:
        with np.errstate(over="ignore", invalid="ignore"):
            array = array.astype(np.float32)
    if within(array, limit):
        return array
    index = np.argwhere(~(np.abs(array) <= limit))[0]  # NaN compares False
    source = np.asarray(values)
    original = (source[tuple(index)] if source.ndim else source).item()
    where = f" at index {tuple(index.tolist())}" if array.ndim else ""
    raise SpaceError(
        f"{field}: value {original!r}{where} is out of range; it is stored as float32 and must "
        f"be {_range_text(limit)}"
    )


def check_reward(value: float, field: str) -> float:
    """Check one reward (see :data:`MAX_ABS_REWARD`) and return it unchanged.

    Raises:
        SpaceError: The reward is not finite or its magnitude is over the bound.
    """
    if not -MAX_ABS_REWARD <= value <= MAX_ABS_REWARD:
        raise SpaceError(
            f"{field}: reward {value!r} is out of range; it must be {_range_text(MAX_ABS_REWARD)}"
        )
    return value


def short_repr(value: Any) -> str:
    """``repr(value)`` for an error message, cut with a mark when long (a 400-digit integer)."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:30]}... ({len(text)} characters)"
