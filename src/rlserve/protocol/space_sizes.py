"""The size limits of space descriptions, and the element count of a declared shape.

A description's shape comes from a peer or a file, so its element count is computed with exact
Python integers: ``np.prod`` wraps around in int64, and a shape such as ``[2**32, 2**32]`` would
count as 0 elements and pass the limit. The same bound holds for a whole space's flat width (what
a policy's input or output layer is sized by: a Discrete counts its choices), so that no
description makes a server build a network of billions of weights.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from gymnasium import spaces

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


def flat_width(space: spaces.Space[Any]) -> int:
    """The width of ``space`` flattened and one-hot encoded (gymnasium's ``flatdim``), exact.

    A Box counts its elements, a Discrete its choices, a MultiDiscrete the sum of its choices,
    a MultiBinary its elements; Dict and Tuple add up their parts.
    """
    if isinstance(space, spaces.Discrete):
        return int(space.n)
    if isinstance(space, spaces.MultiDiscrete):
        return sum(int(n) for n in space.nvec.flat)
    if isinstance(space, (spaces.Box, spaces.MultiBinary)):
        return math.prod(int(d) for d in space.shape)
    if isinstance(space, spaces.Dict):
        return sum(flat_width(part) for part in space.spaces.values())
    if isinstance(space, spaces.Tuple):
        return sum(flat_width(part) for part in space.spaces)
    raise SpaceError(f"no flat width for a {type(space).__name__} space")


def check_flat_width(space: spaces.Space[Any]) -> None:
    """Refuse a space whose :func:`flat_width` is over :data:`MAX_SPACE_ELEMENTS`.

    Raises:
        SpaceError: It is; the message names the width and the limit.
    """
    width = flat_width(space)
    if width > MAX_SPACE_ELEMENTS:
        raise SpaceError(
            f"{type(space).__name__} space is {width} values wide flattened (a Discrete counts "
            f"its choices), over the limit of {MAX_SPACE_ELEMENTS}; describe a smaller space"
        )
