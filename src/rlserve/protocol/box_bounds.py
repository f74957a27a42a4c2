"""A Box's bounds, prepared once per space, and the per-step test of a value against them.

Every remote step checks an observation against its Box. The full check
(:func:`rlserve.protocol.spaces.check_value`) casts, checks the shape and words every error; the
common observation (a float32 array of the space's own shape, inside its bounds) needs only
the bounds test, done here with bounds prepared the first time a space is seen. A value that
fails it is not refused here: it takes the full check, which finds what is wrong and says so.

This module needs numpy and gymnasium only, never torch: the client uses it too.
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np
from gymnasium import spaces

SMALL_BOX_VALUES = 64
"""Boxes of up to this many values are tested as Python floats (:func:`fits_float32_box`).

For a few values numpy's cost per call is most of the test: a CartPole observation took about
0.5 µs as four Python comparisons against 2.7 µs as two ufunc comparisons, an ``&`` and an
``all`` (``bench/profile_remote_step.py`` times the check in its codec line)."""

_FLOAT32 = np.dtype(np.float32)

_BOX_BOUNDS: dict[int, tuple[spaces.Box, np.ndarray, np.ndarray]] = {}

_Float32Box = tuple[
    spaces.Box, bool, tuple[int, ...], np.ndarray, np.ndarray, list[tuple[float, float]] | None
]

_FLOAT32_BOXES: dict[int, _Float32Box] = {}


def finite_bounds(space: spaces.Box) -> tuple[np.ndarray, np.ndarray]:
    """The Box's bounds with infinities replaced by the dtype's extremes, cached per space.

    With these, one comparison ``low <= x <= high`` also rejects NaN and infinity, so a valid
    value costs a single fused check on the per-step path.
    """
    entry = _BOX_BOUNDS.get(id(space))
    if entry is None or entry[0] is not space:
        low, high = space.low, space.high
        if space.dtype.kind == "f":
            big = np.finfo(cast(Any, space.dtype)).max
            low = np.where(np.isfinite(low), low, -big).astype(space.dtype)
            high = np.where(np.isfinite(high), high, big).astype(space.dtype)
        entry = (space, low, high)
        _BOX_BOUNDS[id(space)] = entry
    return entry[1], entry[2]


def _float32_box(space: spaces.Box) -> _Float32Box:
    """What :func:`fits_float32_box` needs of a Box, cached per space.

    The second item says whether the Box is float32 (other dtypes always take the full check).
    The last is the bounds as ``(low, high)`` Python floats, one pair per value, for a Box of at
    most :data:`SMALL_BOX_VALUES` values (None for a larger one). A float32 converts to a Python
    float exactly, so comparing the floats is comparing the float32 values, and NaN fails both
    comparisons as it fails numpy's.
    """
    low, high = finite_bounds(space)
    pairs = None
    if low.size <= SMALL_BOX_VALUES:
        pairs = list(zip(low.reshape(-1).tolist(), high.reshape(-1).tolist(), strict=True))
    entry = (space, space.dtype == np.float32, space.shape, low, high, pairs)
    _FLOAT32_BOXES[id(space)] = entry
    return entry


def fits_float32_box(space: spaces.Box, value: np.ndarray) -> bool:
    """Whether ``value`` is a float32 array of the float32 Box's shape, inside its bounds.

    True means the value needs no other check (finite, in bounds, of the space's dtype and
    shape); False means only that the full check must decide (another dtype or shape, a value
    out of bounds, NaN, infinity, or a Box that is not float32).
    """
    box = _FLOAT32_BOXES.get(id(space))
    if box is None or box[0] is not space:
        box = _float32_box(space)
    if not box[1] or value.dtype is not _FLOAT32 or value.shape != box[2]:
        return False
    pairs = box[5]
    if pairs is None:
        return bool(((value >= box[3]) & (value <= box[4])).all())
    for x, (low, high) in zip(value.reshape(-1).tolist(), pairs, strict=True):
        if not low <= x <= high:
            return False
    return True
