"""Where each part of an observation lies once flattened: the columns of a network's input.

The server, the clients and the ONNX export flatten observations with
``gymnasium.spaces.flatten`` (:func:`rlserve.protocol.spaces.check_batch`). :func:`flat_columns`
walks a space in that function's order and measures each part with ``gymnasium.spaces.flatdim``,
so that an engine feeding an exported policy (``policy.onnx.json``'s ``inputs.obs.columns``) can
fill the columns of each key itself. Needs numpy and gymnasium only.
"""

from __future__ import annotations

from typing import Any

from gymnasium import spaces

from rlserve.errors import UnsupportedSpaceError


def flat_columns(space: spaces.Space[Any]) -> list[dict[str, Any]]:
    """Each leaf of ``space`` (a part that is no Dict or Tuple) with its flattened columns.

    In column order; each entry is JSON-able:

    * ``key``: the path of Dict keys and Tuple indexes to the leaf, joined by ``/``
      (``"sensors/lidar"``, ``"pair/0"``); ``""`` when ``space`` itself is the leaf;
    * ``start``, ``stop``: its columns, ``obs[:, start:stop]``;
    * ``type``: the leaf's space (``Box``, ``Discrete``, ``MultiDiscrete``, ``MultiBinary``);
    * ``encoding``: ``values`` (Box, MultiBinary: the values in C order of ``shape``),
      ``one_hot`` (Discrete: ``n`` columns, the one at ``start + value - value_start`` is 1 and
      the others 0) or ``one_hot_each`` (MultiDiscrete: one such block per element in C order,
      ``nvec`` columns each, with the element's ``value_start``).

    Raises:
        UnsupportedSpaceError: A part is none of those spaces (none can travel on the wire).
    """
    columns: list[dict[str, Any]] = []

    def walk(part: spaces.Space[Any], path: tuple[str, ...], start: int) -> int:
        if isinstance(part, spaces.Dict):
            for key, child in part.spaces.items():
                start = walk(child, (*path, str(key)), start)
            return start
        if isinstance(part, spaces.Tuple):
            for index, child in enumerate(part.spaces):
                start = walk(child, (*path, str(index)), start)
            return start
        stop = start + int(spaces.flatdim(part))
        columns.append({"key": "/".join(path), "start": start, "stop": stop, **_leaf(part)})
        return stop

    walk(space, (), 0)
    return columns


def _leaf(space: spaces.Space[Any]) -> dict[str, Any]:
    """How ``gymnasium.spaces.flatten`` writes a value of the leaf ``space``."""
    if isinstance(space, spaces.Box):
        return {"type": "Box", "encoding": "values", "shape": list(space.shape)}
    if isinstance(space, spaces.MultiBinary):
        return {"type": "MultiBinary", "encoding": "values", "shape": list(space.shape)}
    if isinstance(space, spaces.Discrete):
        return {
            "type": "Discrete",
            "encoding": "one_hot",
            "n": int(space.n),
            "value_start": int(space.start),
        }
    if isinstance(space, spaces.MultiDiscrete):
        return {
            "type": "MultiDiscrete",
            "encoding": "one_hot_each",
            "nvec": space.nvec.reshape(-1).tolist(),
            "value_start": space.start.reshape(-1).tolist(),
        }
    raise UnsupportedSpaceError(
        f"{type(space).__name__} spaces have no flat layout here; use Box, Discrete, "
        "MultiDiscrete, MultiBinary, Dict or Tuple"
    )
