"""Checks of observation batches stacked as Gymnasium's vector environments stack them.

A vector source (``get_action`` with one row per env copy) hands a whole batch per step: a
``[count, *shape]`` array for a Box, a Dict of stacked arrays, an array of Discrete values...
:func:`stacked_check` makes, once per space and batch size, the check every step then runs:
a lean one for a Box (:class:`StackedBoxCheck`), else the batch taken apart and checked value
by value with :func:`~rlserve.protocol.spaces.check_batch`.

This module needs numpy and gymnasium only, never torch: the client uses it too.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
from gymnasium import spaces

from rlserve.protocol.box_bounds import finite_bounds
from rlserve.protocol.spaces import check_batch

__all__ = ["StackedBoxCheck", "check_stacked", "stacked_check", "unstack"]


def stacked_check(space: spaces.Space[Any], count: int) -> Callable[[Any], np.ndarray]:
    """The check of a batch of ``count`` observations of ``space``, flattening to ``[count, D]``."""
    if isinstance(space, spaces.Box):
        return StackedBoxCheck(space, count, "observation")
    return partial(check_stacked, space, count)


_FLOAT32 = np.dtype(np.float32)
"""The dtype of native float32 arrays (one object: compared by identity on the fast path)."""

_BROADCAST_BOUNDS = 1 << 14
"""Values per batch up to which :class:`StackedBoxCheck` keeps bounds of the batch's own shape."""

_ge, _le, _count = np.greater_equal, np.less_equal, np.count_nonzero


class StackedBoxCheck:
    """:func:`check_batch` of a stacked ``[count, *shape]`` batch of one Box, for every step.

    A batch already in the space's dtype and shape and within its bounds costs two comparisons
    (and, for a small batch, two bytes compares); anything else goes through
    :func:`check_batch`, which casts it or raises its error.

    Args:
        space: The observation space.
        count: How many values each batch holds.
        where: A path for error messages.
    """

    def __init__(self, space: spaces.Box, count: int, where: str) -> None:
        self.space = space
        self.count = count
        self.where = where
        self._shape = (count, *space.shape)
        self._size = count * int(np.prod(space.shape))
        low, high = finite_bounds(space)
        if self._size <= _BROADCAST_BOUNDS:
            # Bounds of the whole batch: a comparison that broadcasts costs several times one
            # that does not, at a small batch's size.
            low = np.ascontiguousarray(np.broadcast_to(low, self._shape))
            high = np.ascontiguousarray(np.broadcast_to(high, self._shape))
            # A comparison's bool array holds bytes 0 and 1: all True is this many 1 bytes.
            self._all_true: bytes | None = b"\x01" * self._size
        else:
            self._all_true = None
        self._low, self._high = low, high
        self._fast = space.dtype == np.float32

    def __call__(self, values: Any) -> np.ndarray:
        """The checked batch flattened to float32 ``[count, D]``.

        Raises:
            SpaceError: As :func:`check_batch`.
        """
        if (
            self._fast
            and type(values) is np.ndarray
            and values.dtype is _FLOAT32
            and values.shape == self._shape
        ):
            # Not .all(): a ufunc reduction costs more than the comparisons at this size. NaN
            # fails both comparisons.
            all_true = self._all_true
            if all_true is not None:
                if (
                    _ge(values, self._low).tobytes() == all_true
                    and _le(values, self._high).tobytes() == all_true
                ):
                    return values.reshape(self.count, -1)
            elif _count(_ge(values, self._low)) + _count(_le(values, self._high)) == 2 * self._size:
                return values.reshape(self.count, -1)
        return check_batch(self.space, values, self.count, self.where)


def check_stacked(space: spaces.Space[Any], count: int, observations: Any) -> np.ndarray:
    """:func:`~rlserve.protocol.spaces.check_batch` of a stacked batch of a space other than Box.

    A vector source stacks such observations as Gymnasium's vector environments do (a Dict of
    stacked arrays, an array of Discrete values...); ``check_batch`` takes them one by one.
    """
    if not isinstance(observations, list):
        observations = unstack(space, observations, count)
    return check_batch(space, observations, count, "observation")


def unstack(space: spaces.Space[Any], batch: Any, count: int) -> list[Any]:
    """The ``count`` single observations of a batch stacked as Gymnasium stacks them."""
    if isinstance(space, spaces.Dict) and isinstance(batch, dict):
        parts = {key: unstack(sub, batch.get(key), count) for key, sub in space.spaces.items()}
        return [{key: part[i] for key, part in parts.items()} for i in range(count)]
    if isinstance(space, spaces.Tuple) and isinstance(batch, tuple):
        columns = [unstack(sub, b, count) for sub, b in zip(space.spaces, batch, strict=True)]
        return [tuple(column[i] for column in columns) for i in range(count)]
    return list(np.asarray(batch))
