"""The size limits of space descriptions, and the element count of a declared shape.

A description's shape comes from a peer or a file, so its element count is computed with exact
Python integers: ``np.prod`` wraps around in int64, and a shape such as ``[2**32, 2**32]`` would
count as 0 elements and pass the limit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from rlserve.errors import SpaceError

MAX_SPACE_DEPTH = 8
"""Deepest nesting of Dict/Tuple spaces accepted in a description."""

MAX_SPACE_ELEMENTS = 4_000_000
"""Largest number of elements in one Box or MultiDiscrete/MultiBinary description."""


def element_count(dims: Sequence[int], kind: str) -> int:
    """The number of elements of a declared shape, checked against :data:`MAX_SPACE_ELEMENTS`.

    Args:
        dims: The shape, as Python or numpy integers.
        kind: The space's type, for the error message.

    Raises:
        SpaceError: A dimension is negative, or the count is over the limit.
    """
    sizes = [int(d) for d in dims]
    if any(d < 0 for d in sizes):
        raise SpaceError(f"{kind} of shape {tuple(sizes)} has a negative dimension; use sizes >= 0")
    count = math.prod(sizes)
    if count > MAX_SPACE_ELEMENTS:
        raise SpaceError(
            f"{kind} of shape {tuple(sizes)} has {count} elements, over the limit of "
            f"{MAX_SPACE_ELEMENTS}; describe a smaller space"
        )
    return count
