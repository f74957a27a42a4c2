"""Gymnasium spaces on the wire: a JSON description, validation of values, flattening.

A space is described as a JSON map with a ``type`` (``Box``, ``Discrete``, ``MultiDiscrete``,
``MultiBinary``, ``Dict``, ``Tuple``) and its parameters; ``docs/protocol.md`` lists the fields.
Values from the wire (observations, logged actions) are checked against their space here: shape,
dtype, bounds where the space is bounded, NaN. Every error names the space, what was expected,
what arrived and where (``obs['camera'][2]``) so the sender can fix it.

This module needs numpy and gymnasium only, never torch: the client uses it too.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from gymnasium import spaces

from rlserve.errors import SpaceError, UnsupportedSpaceError
from rlserve.protocol.box_bounds import finite_bounds, fits_float32_box
from rlserve.protocol.ragged import ragged_item
from rlserve.protocol.space_sizes import MAX_SPACE_DEPTH, check_flat_width, element_count
from rlserve.protocol.values import FLOAT32_MAX, check_float32, short_repr


def _bound_to_wire(bound: np.ndarray) -> Any:
    if bound.size and np.all(bound == bound.flat[0]):
        value = bound.flat[0].item()
        return _finite_or_none(value)
    return [_finite_or_none(v) for v in bound.ravel().tolist()]


def _finite_or_none(value: float) -> float | None:
    # JSON has no infinity: an unbounded side is written as null.
    return None if value in (float("inf"), float("-inf")) else value


def describe(space: spaces.Space[Any]) -> dict[str, Any]:
    """Describe ``space`` as a JSON-compatible map.

    Args:
        space: A Box, Discrete, MultiDiscrete, MultiBinary, Dict or Tuple space.

    Returns:
        The description; :func:`from_description` turns it back into an equal space.

    Raises:
        UnsupportedSpaceError: Any other space type.
    """
    if isinstance(space, spaces.Box):
        return {
            "type": "Box",
            "shape": list(space.shape),
            "dtype": str(space.dtype),
            "low": _bound_to_wire(space.low),
            "high": _bound_to_wire(space.high),
        }
    if isinstance(space, spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, spaces.MultiDiscrete):
        return {
            "type": "MultiDiscrete",
            "nvec": space.nvec.tolist(),
            "start": space.start.tolist(),
            "dtype": str(space.dtype),
        }
    if isinstance(space, spaces.MultiBinary):
        n: Any = space.n
        return {"type": "MultiBinary", "n": int(n) if np.ndim(n) == 0 else [int(v) for v in n]}
    if isinstance(space, spaces.Dict):
        return {"type": "Dict", "spaces": {k: describe(s) for k, s in space.spaces.items()}}
    if isinstance(space, spaces.Tuple):
        return {"type": "Tuple", "spaces": [describe(s) for s in space.spaces]}
    raise UnsupportedSpaceError(
        f"{type(space).__name__} spaces cannot be described on the wire; use Box, Discrete, "
        "MultiDiscrete, MultiBinary, Dict or Tuple"
    )


def _int_range(dtype: np.dtype[Any]) -> tuple[int, int]:
    info = np.iinfo(dtype.type)
    return int(info.min), int(info.max)


def _bound_from_wire(
    value: Any, shape: tuple[int, ...], side: str, dtype: np.dtype[Any]
) -> np.ndarray:
    count = math.prod(shape)
    if value is None or isinstance(value, int | float):
        flat = [value] * count
    elif isinstance(value, list):
        flat = value
        if len(flat) != count:
            raise SpaceError(f"Box {side} has {len(flat)} values; shape {shape} needs {count}")
    else:
        raise SpaceError(f"Box {side} must be a number, null or a list, got {type(value).__name__}")
    if dtype.kind in "iub":
        # Integer bounds stay integers: int64's extremes do not survive a trip through float64.
        lo, hi = (0, 1) if dtype.kind == "b" else _int_range(dtype)
        unbounded = lo if side == "low" else hi
        ints = [unbounded if v is None else min(max(int(v), lo), hi) for v in flat]
        return np.array(ints, dtype=dtype).reshape(shape)
    unbounded_f = -np.inf if side == "low" else np.inf
    floats = [unbounded_f if v is None else float(v) for v in flat]
    return np.asarray(floats, dtype=np.float64).reshape(shape).astype(dtype)


def from_description(desc: Any, _depth: int = 0) -> spaces.Space[Any]:
    """Build the Gymnasium space a description (from :func:`describe`) stands for.

    Raises:
        SpaceError: The description is malformed or over the size limits (its nesting, a
            part's elements, or the whole space's flat width: ``space_sizes``).
    """
    space = _space_from_description(desc, _depth)
    if _depth == 0:
        check_flat_width(space)
    return space


def _space_from_description(desc: Any, _depth: int) -> spaces.Space[Any]:
    """:func:`from_description` without the whole-space width check (done once, at the top)."""
    if _depth > MAX_SPACE_DEPTH:
        raise SpaceError(f"space description nested deeper than {MAX_SPACE_DEPTH} levels")
    if not isinstance(desc, dict) or not isinstance(desc.get("type"), str):
        raise SpaceError("a space description must be a map with a string 'type'")
    kind = desc["type"]
    try:
        if kind == "Box":
            shape = tuple(int(d) for d in desc["shape"])
            element_count(shape, "Box")
            dtype = np.dtype(desc.get("dtype", "float32"))
            if dtype.kind not in "biuf":
                raise SpaceError(f"Box dtype must be numeric, got {dtype}")
            low = _bound_from_wire(desc.get("low"), shape, "low", dtype)
            high = _bound_from_wire(desc.get("high"), shape, "high", dtype)
            return spaces.Box(low, high, shape=shape, dtype=dtype)
        if kind == "Discrete":
            return spaces.Discrete(int(desc["n"]), start=int(desc.get("start", 0)))
        if kind == "MultiDiscrete":
            nvec = np.asarray(desc["nvec"], dtype=np.int64)
            element_count(nvec.shape, "MultiDiscrete")
            start = desc.get("start")
            return spaces.MultiDiscrete(
                nvec,
                dtype=desc.get("dtype", "int64"),
                start=None if start is None else np.asarray(start, dtype=np.int64),
            )
        if kind == "MultiBinary":
            n = desc["n"]
            n_value: Any = [int(v) for v in n] if isinstance(n, list) else int(n)
            element_count(n_value if isinstance(n_value, list) else [n_value], "MultiBinary")
            return spaces.MultiBinary(n_value)
        if kind == "Dict":
            items = desc["spaces"]
            if not isinstance(items, dict):
                raise SpaceError("Dict 'spaces' must be a map")
            return spaces.Dict({k: from_description(v, _depth + 1) for k, v in items.items()})
        if kind == "Tuple":
            items = desc["spaces"]
            if not isinstance(items, list):
                raise SpaceError("Tuple 'spaces' must be a list")
            return spaces.Tuple([from_description(v, _depth + 1) for v in items])
    except SpaceError:
        raise
    except (KeyError, TypeError, ValueError, AssertionError, OverflowError) as exc:
        raise SpaceError(f"malformed {kind} space description: {exc!r}") from exc
    raise UnsupportedSpaceError(
        f"unknown space type '{kind}'; known: Box, Discrete, MultiDiscrete, MultiBinary, Dict, "
        "Tuple"
    )


def _as_array(value: Any, dtype: np.dtype[Any], where: str, space: spaces.Space[Any]) -> np.ndarray:
    try:
        array = np.asarray(value)
    except (ValueError, TypeError) as exc:
        ragged = ragged_item(value)
        if ragged is not None:
            raise SpaceError(f"{where}: {ragged}; {space} takes shape {space.shape}") from exc
        raise SpaceError(f"{where}: cannot be read as an array for {space}: {exc}") from exc
    if array.dtype.kind not in "biuf":
        if array.dtype.kind == "O":
            array = _big_integers(array, dtype, where, space)
        if array.dtype.kind not in "biuf":
            raise SpaceError(f"{where}: expected numbers for {space}, got {array.dtype} values")
    if array.dtype == dtype:
        return array  # the usual case, on every step: nothing to cast or range-check
    if dtype.kind in "iu" and array.dtype.kind in "iub":
        # Any integers may stand for an integer space (JSON has only one integer type), but
        # they must fit the dtype: a narrowing cast would wrap silently.
        lo, hi = _int_range(dtype)
        if array.size and (array.min() < lo or array.max() > hi):
            raise SpaceError(
                f"{where}: values {array.min()}..{array.max()} do not fit dtype {dtype} of "
                f"{space} (range {lo}..{hi})"
            )
        return array.astype(dtype, copy=False)
    if not np.can_cast(array.dtype, dtype, casting="same_kind"):
        raise SpaceError(
            f"{where}: values of dtype {array.dtype} cannot stand for {space} (dtype {dtype}); "
            f"send {dtype} values"
        )
    try:
        with np.errstate(over="raise"):
            return array.astype(dtype, copy=False)
    except FloatingPointError:
        # A finite value that overflows the space's dtype: name it as sent, with its index.
        check_float32(array, where)
        raise SpaceError(
            f"{where}: values {array.min()}..{array.max()} overflow dtype {dtype} of {space}"
        ) from None


def _big_integers(
    array: np.ndarray, dtype: np.dtype[Any], where: str, space: spaces.Space[Any]
) -> np.ndarray:
    """Integers beyond int64 (JSON allows any) as float64, for a float space's range checks.

    An integer space cannot hold them at all: that is said at once.
    """
    if not all(type(item) is int for item in array.flat):
        return array  # not numbers alone: refused as they are
    if dtype.kind in "iu":
        lo, hi = _int_range(dtype)
        index, value = next(
            (i, v) for i, v in enumerate(array.flat) if not lo <= v <= hi
        )  # numpy made an object array: one of them is beyond int64/uint64
        raise SpaceError(
            f"{where}: value {short_repr(value)} at flat index {index} does not fit dtype "
            f"{dtype} of {space} (range {lo}..{hi})"
        )
    try:
        return array.astype(np.float64)
    except OverflowError:
        raise SpaceError(
            f"{where}: an integer beyond the float64 range (over 308 digits)"
        ) from None


def check_value(space: spaces.Space[Any], value: Any, where: str = "value") -> Any:
    """Check one value against ``space`` and return it in canonical form.

    Box values become arrays of the space's dtype; Discrete values become ints; Dict and Tuple
    recurse.

    Args:
        space: The declared space.
        value: What arrived (array, list, number, map).
        where: A path for the error message, e.g. ``observation``.

    Returns:
        The canonical value.

    Raises:
        SpaceError: Wrong shape, dtype, NaN, out of bounds, missing or extra keys.
    """
    if isinstance(space, spaces.Box):
        _refuse_reset_pair(value, where)
        array = _as_array(value, space.dtype, where, space)
        if array.shape != space.shape:
            raise SpaceError(
                f"{where}: shape {array.shape} does not fit {space}; expected shape {space.shape}"
            )
        _check_box_values(space, array[None], where, batched=False)
        if array.dtype.kind == "f" and array.dtype != np.float32:
            # Finite in float64 is not enough: the server stores float32 (1e39 is inf there).
            check_float32(array, where)
        return array
    if isinstance(space, spaces.Discrete):
        if isinstance(value, np.ndarray) and value.size != 1:
            raise SpaceError(
                f"{where}: {space} needs one integer, got an array of shape {value.shape}"
            )
        item = value.item() if isinstance(value, np.ndarray | np.generic) else value
        if isinstance(item, bool) or not isinstance(item, int):
            raise SpaceError(f"{where}: {space} needs an integer, got {item!r}")
        if not space.start <= item < space.start + space.n:
            raise SpaceError(
                f"{where}: {item} is outside {space}; valid values are "
                f"{space.start}..{space.start + space.n - 1}"
            )
        return item
    if isinstance(space, spaces.MultiDiscrete | spaces.MultiBinary):
        array = _as_array(value, space.dtype, where, space)
        if array.shape != space.shape:
            raise SpaceError(f"{where}: shape {array.shape} does not fit {space}")
        if not space.contains(array):
            raise SpaceError(f"{where}: {array.tolist()} is outside {space}")
        return array
    if isinstance(space, spaces.Dict):
        if not isinstance(value, dict):
            raise SpaceError(f"{where}: {space} needs a map, got {type(value).__name__}")
        missing = set(space.spaces) - set(value)
        extra = set(value) - set(space.spaces)
        if missing or extra:
            raise SpaceError(
                f"{where}: keys do not match the Dict space; missing {sorted(missing)}, "
                f"unexpected {sorted(map(str, extra))}"
            )
        return {k: check_value(s, value[k], f"{where}[{k!r}]") for k, s in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        if not isinstance(value, list | tuple) or len(value) != len(space.spaces):
            raise SpaceError(f"{where}: {space} needs a list of {len(space.spaces)} values")
        return tuple(
            check_value(s, v, f"{where}[{i}]")
            for i, (s, v) in enumerate(zip(space.spaces, value, strict=True))
        )
    raise UnsupportedSpaceError(f"{where}: {type(space).__name__} spaces are not supported")


def _check_box_values(space: spaces.Box, batch: np.ndarray, where: str, batched: bool) -> None:
    """Check a ``[count, *shape]`` batch against the Box's bounds and finiteness.

    ``batched`` says whether the sender sent the batch: an error then gives the index into it;
    otherwise the sender sent one value (``batch`` is it with an axis added) and the index is
    into that value.
    """
    low, high = finite_bounds(space)
    if ((batch >= low) & (batch <= high)).all():
        return

    def first(mask: np.ndarray) -> tuple[Any, str]:
        idx = tuple(np.argwhere(mask)[0].tolist())
        shown = idx if batched else idx[1:]
        return idx, f" at index {shown}" if shown else ""

    if space.dtype.kind == "f" and not np.isfinite(batch).all():
        idx, at = first(~np.isfinite(batch))
        raise SpaceError(
            f"{where}: contains {batch[idx]!s}{at}; values must be finite in {space.dtype} (the "
            f"server stores float32: |x| <= {FLOAT32_MAX:.8g})"
        )
    below = batch < space.low
    if below.any():
        idx, at = first(below)
        raise SpaceError(
            f"{where}: value {batch[idx]!s}{at} is below the space's low bound "
            f"{space.low[idx[1:]]!s}; clip it or widen the space"
        )
    idx, at = first(batch > space.high)
    raise SpaceError(
        f"{where}: value {batch[idx]!s}{at} is above the space's high bound "
        f"{space.high[idx[1:]]!s}; clip it or widen the space"
    )


def check_one(space: spaces.Space[Any], value: Any, where: str) -> np.ndarray:
    """Check one observation and return it flattened to a float32 ``[1, D]`` batch.

    The single-value counterpart of :func:`check_batch`: errors speak of the value as it was
    sent (its shape against the space's, an index into it), not of a batch of one.

    Args:
        space: The observation space.
        value: The observation as sent (array, list, number, map).
        where: A path for error messages, e.g. ``observation``.

    Raises:
        SpaceError: The value does not fit the space.
    """
    if (
        type(value) is np.ndarray
        and isinstance(space, spaces.Box)
        and fits_float32_box(space, value)
    ):
        # The common case, every remote step: nothing more to check (box_bounds).
        return value.reshape(1, -1)
    if isinstance(space, spaces.Box):
        array = check_value(space, value, where)
        flat = array.reshape(1, -1)
        if flat.dtype == np.float32:
            return flat  # already checked finite by the bounds check
        return check_float32(flat, where)  # integers: always within float32's range
    row = np.asarray(spaces.flatten(space, check_value(space, value, where)))
    return check_float32(row.reshape(1, -1), where)


def _refuse_reset_pair(value: Any, where: str) -> None:
    """Name the common mistake of passing ``env.reset()``'s ``(obs, info)`` as an observation."""
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], dict):
        raise SpaceError(
            f"{where}: got a pair of a value and a dict, as env.reset() returns (obs, info); "
            "pass the observation alone (obs, info = env.reset())"
        )


def batch_of_one(space: spaces.Space[Any], value: Any, where: str = "observation") -> Any:
    """One value of ``space`` as a batch of one (an array for a Box, else a list).

    A Box value that is not an array of the space's shape is checked first with
    :func:`check_value`, so a wrong one is told as one value (its shape against the space's),
    never as a batch or by numpy.

    Raises:
        SpaceError: A Box value that cannot be read as an array of the space's shape (its
            values are left to :func:`check_batch`).
    """
    if not isinstance(space, spaces.Box):
        return [value]
    if type(value) is np.ndarray and value.shape == space.shape:
        return value[None]  # the common case: its values are checked with the batch
    _refuse_reset_pair(value, where)
    array = _as_array(value, space.dtype, where, space)
    if array.shape != space.shape:
        raise SpaceError(
            f"{where}: shape {array.shape} does not fit {space}; expected shape {space.shape}"
        )
    return array[None]  # its values are checked with the batch


def check_batch(space: spaces.Space[Any], values: Any, count: int, where: str) -> np.ndarray:
    """Check ``count`` observations and return them flattened to a float32 ``[count, D]`` batch.

    A Box space takes the fast path: one stacked array is checked as a whole. Other spaces are
    checked value by value and flattened with ``gymnasium.spaces.flatten``.

    Args:
        space: The observation space.
        values: A stacked array ``[count, *shape]`` or a list of ``count`` values.
        count: How many values are expected.
        where: A path for error messages.

    Raises:
        SpaceError: A value does not fit, or the count is wrong.
    """
    if isinstance(space, spaces.Box):
        array = _as_array(values, space.dtype, where, space)
        if array.shape != (count, *space.shape):
            if array.ndim == 0 or array.shape[1:] != space.shape:
                raise SpaceError(
                    f"{where}: a batch of {count} observation{'s' * (count != 1)} of shape "
                    f"{space.shape} must "
                    f"have shape {(count, *space.shape)}, got {array.shape}"
                )
            raise SpaceError(f"{where}: {array.shape[0]} values for {count} episodes")
        _check_box_values(space, array, where, batched=True)
        flat = array.reshape(count, -1)
        if flat.dtype == np.float32:
            return flat  # already checked finite by the bounds check
        return check_float32(flat, where)
    if not isinstance(values, list) or len(values) != count:
        raise SpaceError(f"{where}: expected a list of {count} values")
    rows: list[np.ndarray] = [
        np.asarray(spaces.flatten(space, check_value(space, v, f"{where}[{i}]")))
        for i, v in enumerate(values)
    ]
    # Checked after the cast: a float64 1e39 is finite but becomes infinite in float32.
    return check_float32(np.stack(rows), where)


def flat_dim(space: spaces.Space[Any]) -> int:
    """Length of a value of ``space`` once flattened for a network."""
    return int(spaces.flatdim(space))
