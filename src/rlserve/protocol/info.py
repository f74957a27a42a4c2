"""The ``info`` map a client may log with a step's reward: what can travel, and how big.

RLlib's clients pass ``log_returns(episode_id, reward, info=info)`` on every step, with whatever
their environment returned as ``info``. Such a map travels with the next call of its episode (no
round trip of its own), is recorded with the step the reward belongs to, and is kept with the
episode's data (a :class:`~rlserve.protocol.fragment.Fragment`'s ``infos`` and the experience log).

What travels is what msgpack and JSON both carry: maps with string keys, lists, strings, numbers,
booleans and nil, plus bytes and numeric numpy arrays in msgpack. :func:`wire_info` turns what a
Python user usually has into that (tuples into lists, numpy scalars into numbers, and ``int``,
``float``, ``bool`` or ``None`` keys into their JSON text, as ``json.dumps`` does) and names the
key of anything else (a set, a dataclass, an object). :func:`check_info_size` bounds one map's
encoded size by the server's ``max_info_bytes``. numpy and msgpack only: the client imports this.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from rlserve.errors import LimitExceededError, SpaceError
from rlserve.protocol.codec import encode

MAX_INFO_DEPTH = 32
"""Deepest nesting of maps and lists inside one ``info`` map."""

_INT_RANGE = (-(2**63), 2**64 - 1)


def wire_info(info: Mapping[Any, Any], where: str) -> dict[str, Any]:
    """A copy of ``info`` made of values that travel, or a clear error naming the bad key.

    Args:
        info: The user's map.
        where: The call, for messages (e.g. ``log_returns for episode 'e1'``).

    Returns:
        A new map with string keys, lists for tuples and Python numbers for numpy scalars.

    Raises:
        SpaceError: ``info`` is not a map, or holds a value that cannot travel (named by its
            path of keys, e.g. ``info['pos'][2]``), or nests deeper than :data:`MAX_INFO_DEPTH`.
    """
    if not isinstance(info, Mapping):
        raise SpaceError(
            f"{where}: info must be a dict (or None), got {type(info).__name__}; pass the "
            "environment's info dict"
        )
    return _map(info, where, "info", 0)


def _key(key: Any, where: str, path: str) -> str:
    if isinstance(key, str):
        return key
    if isinstance(key, bool | int | float) or key is None:
        return json.dumps(key)
    if isinstance(key, np.generic) and key.dtype.kind in "biuf":
        return _key(key.item(), where, path)
    raise SpaceError(
        f"{where}: {path} has a key {key!r} of type {type(key).__name__}; info keys must be "
        "strings (int, float, bool and None keys are turned into their text): use str(key)"
    )


def _map(info: Mapping[Any, Any], where: str, path: str, depth: int) -> dict[str, Any]:
    if depth >= MAX_INFO_DEPTH:
        raise SpaceError(
            f"{where}: {path} nests maps and lists deeper than {MAX_INFO_DEPTH} levels; flatten it"
        )
    out: dict[str, Any] = {}
    for key, value in info.items():
        name = _key(key, where, path)
        out[name] = _value(value, where, f"{path}[{name!r}]", depth + 1)
    return out


def _value(value: Any, where: str, path: str, depth: int) -> Any:
    if value is None or isinstance(value, bool | str | bytes | float):
        return value
    if isinstance(value, int):
        if not _INT_RANGE[0] <= value <= _INT_RANGE[1]:
            raise SpaceError(
                f"{where}: {path} is the integer {value}, outside the 64-bit range msgpack "
                "carries; send it as a string or a float"
            )
        return value
    if isinstance(value, Mapping):
        return _map(value, where, path, depth)
    if isinstance(value, list | tuple):
        if depth >= MAX_INFO_DEPTH:
            raise SpaceError(
                f"{where}: {path} nests maps and lists deeper than {MAX_INFO_DEPTH} levels; "
                "flatten it"
            )
        return [_value(v, where, f"{path}[{i}]", depth + 1) for i, v in enumerate(value)]
    if isinstance(value, np.generic) and value.dtype.kind in "biuf":
        return value.item()
    if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
        return value
    raise SpaceError(
        f"{where}: {path} is a {type(value).__name__}, which cannot travel in info; use "
        "numbers, strings, booleans, None, lists, dicts with string keys, bytes or numeric "
        "numpy arrays (e.g. list(...) for a set, dataclasses.asdict(...) for a dataclass)"
    )


def check_info_size(info: dict[str, Any], max_bytes: int, where: str) -> int:
    """Check that ``info`` encodes to at most ``max_bytes`` bytes of msgpack; return its size.

    Raises:
        LimitExceededError: It is larger (code ``limit_exceeded``).
        SpaceError: It holds something msgpack cannot encode (a number out of range).
    """
    try:
        size = len(encode(info))
    except (TypeError, ValueError, OverflowError) as exc:
        raise SpaceError(f"{where}: info cannot be encoded: {exc}") from exc
    if size > max_bytes:
        raise LimitExceededError(
            f"{where}: info is {size} bytes encoded; the limit is {max_bytes} "
            "(max_info_bytes): log less per step"
        )
    return size


def merged_info(
    kept: dict[str, Any] | None, info: dict[str, Any], max_bytes: int | None, where: str
) -> dict[str, Any]:
    """``info`` merged into the info ``kept`` for the same step so far (later keys win).

    Each map was checked on its own when it was logged; only a merge can grow past
    ``max_bytes``, so only a merge is measured. The server checks the infos of the calls it
    reads, a client the ones it keeps for its next call, so that the call that merges is the
    one refused.

    Raises:
        LimitExceededError: The merged map is over ``max_bytes`` (None: not checked) encoded;
            the message starts with ``where``. Nothing is kept.
    """
    if kept is None or not info:
        return info if kept is None else kept
    merged = {**kept, **info}
    if max_bytes is not None:
        size = len(encode(merged))
        if size > max_bytes:
            raise LimitExceededError(
                f"{where}: the info maps logged for one step merge to {size} bytes encoded; "
                f"the limit is {max_bytes} (max_info_bytes): log less per step (the infos sent "
                "before the next action are kept together, later keys replacing earlier ones)"
            )
    return merged
