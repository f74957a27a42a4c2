"""Stack the observations of vectorised copies into one batch, cast to the space's dtype.

Environments often return ``float64`` observations for a ``float32`` ``Box`` (RLlib accepts
them), so observations are cast rather than rejected. Array spaces take a fast path
(``np.stack`` with the dtype); the others (``Dict``, ``Tuple``) go through Gymnasium's
``concatenate``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector.utils import concatenate, create_empty_array

__all__ = ["ObsStacker"]

_ARRAY_SPACES = (
    gym.spaces.Box,
    gym.spaces.Discrete,
    gym.spaces.MultiDiscrete,
    gym.spaces.MultiBinary,
)


class ObsStacker:
    """Stacks single observations of ``space`` into a new ``[N, ...]`` batch each call.

    Args:
        space: The observation space of one copy.
    """

    def __init__(self, space: gym.Space[Any]) -> None:
        self.space = space
        self._dtype = space.dtype if isinstance(space, _ARRAY_SPACES) else None
        self._float = self._dtype is not None and self._dtype.kind == "f"

    def stack(self, items: Sequence[Any]) -> Any:
        """A fresh batch of ``items`` (never a view of a reused buffer)."""
        if self._float:
            # np.array builds the batch in C; for a float dtype it casts as np.stack would.
            return np.array(items, dtype=self._dtype)
        if self._dtype is not None:
            return np.stack(items, dtype=self._dtype)
        out: Any = create_empty_array(self.space, n=len(items))
        return concatenate(self.space, items, out)

    def cast(self, obs: Any) -> Any:
        """One observation in the space's dtype (array spaces only; others as they are)."""
        if self._dtype is not None:
            return np.asarray(obs, dtype=self._dtype)
        return obs
