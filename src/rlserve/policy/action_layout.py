"""Actions between a space's own form and the flat layout rlserve keeps them in.

The flat layout (``[T]`` choice indices, or ``[T, A]`` float32 columns) is described in
:mod:`rlserve.policy.distribution`: :func:`encode_action` writes an action in it,
:func:`actions_to_space` reads environment-form columns back into the space's form, and
:func:`action_from_wire` gives a decoded msgpack action the space's containers.

Needs numpy and gymnasium only, never torch: the client uses it too.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces

from rlserve.errors import UnsupportedSpaceError


def encode_action(space: spaces.Space[Any], value: Any) -> Any:
    """An action in the space's form (checked) as the learner stores it.

    Returns:
        The choice index (``int``) for a Discrete space; otherwise the ``[A]`` float32 row of
        the flat layout (values minus offsets, Gaussian values as given).
    """
    if isinstance(space, spaces.Discrete):
        return int(value) - int(space.start)
    return np.concatenate(_encode_parts(space, value)).astype(np.float32)


def _encode_parts(space: spaces.Space[Any], value: Any) -> list[np.ndarray]:
    if isinstance(space, spaces.Discrete):
        return [np.array([int(value) - int(space.start)], dtype=np.float64)]
    if isinstance(space, spaces.MultiDiscrete):
        return [(np.asarray(value, dtype=np.int64) - space.start).ravel().astype(np.float64)]
    if isinstance(space, spaces.MultiBinary | spaces.Box):
        return [np.asarray(value, dtype=np.float64).ravel()]
    if isinstance(space, spaces.Dict):
        return [row for key, sub in space.spaces.items() for row in _encode_parts(sub, value[key])]
    if isinstance(space, spaces.Tuple):
        pairs = zip(space.spaces, value, strict=True)
        return [row for sub, v in pairs for row in _encode_parts(sub, v)]
    raise UnsupportedSpaceError(f"{type(space).__name__} actions are not supported")


def actions_to_space(space: spaces.Space[Any], env: np.ndarray) -> Any:
    """Environment-form flat actions in the space's own form, batched.

    Args:
        space: The action space.
        env: ``[N, A]`` actions from :meth:`ActionDistribution.to_env`.

    Returns:
        For Box, MultiDiscrete and MultiBinary an array ``[N, *shape]`` of the space's dtype; for
        Discrete ``[N]`` int64; for Dict and Tuple a list of ``N`` maps or tuples.
    """
    if isinstance(space, spaces.Discrete):
        return np.rint(env.reshape(-1)).astype(np.int64)
    if isinstance(space, spaces.Dict | spaces.Tuple):
        return [_row_to_space(space, row)[0] for row in env]
    return _block(space, env)


def _block(space: spaces.Space[Any], env: np.ndarray) -> np.ndarray:
    n = env.shape[0]
    if isinstance(space, spaces.Box):
        return env.reshape(n, *space.shape).astype(space.dtype)
    assert isinstance(space, spaces.MultiDiscrete | spaces.MultiBinary)
    return np.rint(env).reshape(n, *space.shape).astype(space.dtype)


def _row_to_space(space: spaces.Space[Any], row: np.ndarray) -> tuple[Any, int]:
    """One action from the start of ``row``, and how many columns it used."""
    if isinstance(space, spaces.Discrete):
        return int(np.rint(row[0])), 1
    if isinstance(space, spaces.Box | spaces.MultiDiscrete | spaces.MultiBinary):
        width = int(np.prod(space.shape))
        return _block(space, row[None, :width])[0], width
    used = 0
    if isinstance(space, spaces.Dict):
        out: dict[str, Any] = {}
        for key, sub in space.spaces.items():
            out[key], width = _row_to_space(sub, row[used:])
            used += width
        return out, used
    assert isinstance(space, spaces.Tuple)
    items = []
    for sub in space.spaces:
        item, width = _row_to_space(sub, row[used:])
        items.append(item)
        used += width
    return tuple(items), used


def action_from_wire(space: spaces.Space[Any], value: Any) -> Any:
    """An action as decoded from msgpack in the space's form: a Tuple's list becomes a tuple."""
    if isinstance(space, spaces.Tuple) and isinstance(value, list | tuple):
        return tuple(action_from_wire(s, v) for s, v in zip(space.spaces, value, strict=False))
    if isinstance(space, spaces.Dict) and isinstance(value, dict):
        known = space.spaces
        return {k: action_from_wire(known[k], v) if k in known else v for k, v in value.items()}
    return value
