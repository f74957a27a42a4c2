"""Why a list of values is not one array: which item breaks the shape (error path only)."""

from __future__ import annotations

from typing import Any

import numpy as np


def ragged_item(value: Any) -> str | None:
    """Which item of a list breaks its shape (numpy only says the list is inhomogeneous)."""
    if not isinstance(value, list | tuple) or not value:
        return None
    try:
        shapes = [np.shape(item) for item in value]
    except ValueError:  # an item ragged itself: numpy cannot shape it either
        return None
    odd = next((i for i, shape in enumerate(shapes) if shape != shapes[0]), None)
    if odd is None:
        return None
    return f"item {odd} has shape {shapes[odd]}, item 0 has shape {shapes[0]}"
