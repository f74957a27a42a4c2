"""A remote-mode client's check of one observation, cheap for the common one on every step.

:class:`ObservationCheck` does what ``plain_value(check_value(space, value, "observation"))``
does (or ``plain_value(value)`` when checks are off). An observation that is a numpy array of a
``float32`` or integer Box space's own dtype and shape, within its bounds, costs two comparisons
against bounds prepared once and is sent as it is; anything else takes
:func:`~rlserve.protocol.spaces.check_value`, which casts it or raises its error, word for word.
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np
from gymnasium import spaces

from rlserve.experience.agent_values import plain_value
from rlserve.protocol.spaces import check_value

_BYTES_COMPARED = 1 << 14
"""Values up to which a comparison's result is compared as bytes (beyond: counted)."""

_ge, _le, _count = np.greater_equal, np.less_equal, np.count_nonzero


class ObservationCheck:
    """Checks observations of one space before they are sent.

    Args:
        space: The observation space (the check is for this object: a new welcome's space
            needs a new check).
        enabled: Whether to check (``check_observations``); False only makes values plain.
    """

    def __init__(self, space: spaces.Space[Any], enabled: bool) -> None:
        self.space = space
        self._enabled = enabled
        self._dtype: np.dtype[Any] | None = None
        """The dtype of values that may take the fast path (None: no fast path)."""
        if not isinstance(space, spaces.Box):
            return
        dtype = space.dtype
        if dtype != np.float32 and dtype.kind not in "iu":
            return  # float64 and float16 values need check_value's float32 range check
        self._dtype = dtype
        self._shape = space.shape
        self._size = int(np.prod(space.shape))
        low, high = space.low, space.high
        if dtype.kind == "f":
            # Infinite bounds become the dtype's extremes: the comparisons then refuse NaN and
            # infinity too, as check_value does.
            big = np.finfo(cast(Any, dtype)).max
            low = np.where(np.isfinite(low), low, -big).astype(dtype)
            high = np.where(np.isfinite(high), high, big).astype(dtype)
        self._low = np.ascontiguousarray(low)
        self._high = np.ascontiguousarray(high)
        # A comparison's bool array holds bytes 0 and 1: all True is this many 1 bytes.
        self._all_true = b"\x01" * self._size if self._size <= _BYTES_COMPARED else None

    def __call__(self, value: Any) -> Any:
        """The observation as it is to be sent.

        Raises:
            SpaceError: As :func:`~rlserve.protocol.spaces.check_value` (checks enabled).
        """
        if type(value) is np.ndarray:
            if not self._enabled:
                return value
            if value.dtype is self._dtype and value.shape == self._shape:
                all_true = self._all_true
                if all_true is not None:
                    if (
                        _ge(value, self._low).tobytes() == all_true
                        and _le(value, self._high).tobytes() == all_true
                    ):
                        return value
                elif _count(_ge(value, self._low)) + _count(_le(value, self._high)) == (
                    2 * self._size
                ):
                    return value
        if not self._enabled:
            return plain_value(value)
        return plain_value(check_value(self.space, value, "observation"))
