"""A client's request frames: ``frame(encode(message))``, byte for byte, with less work per step.

:func:`~rlserve.protocol.codec.encode` makes a msgpack packer for every message and wraps every
array in an extension value through a Python callback. A :class:`RequestFramer` keeps one packer,
and writes the single-episode ``get_action`` of a client's every step from preencoded parts: the
map header and keys of each field layout :func:`~rlserve.protocol.episode_requests.get_action_wire`
writes, and the observation array's extension header (cached per dtype and shape), so that the
step packs only its few numbers and copies the array's bytes. Any other message goes through the
packer as :func:`~rlserve.protocol.codec.encode` would.
"""

from __future__ import annotations

from itertools import combinations
from typing import Any

import msgpack
import numpy as np

from rlserve.protocol.codec import DTYPE_CODES, _default
from rlserve.protocol.framing import HEADER

_OPTIONAL = ("seq", "reward", "info")
"""The optional fields of a single-episode ``get_action``, in the order they are written."""

_KEY_BYTES = {
    key: msgpack.packb(key) for key in ("type", "episode_id", "observation", *_OPTIONAL, "id")
}


def _skeletons() -> dict[tuple[str, ...], tuple[bytes, tuple[tuple[str, bytes], ...]]]:
    """Each layout of a single-episode ``get_action`` -> (bytes up to the episode id, the rest).

    The first part is the map header, ``type: get_action`` and the ``episode_id`` key; the rest
    names each field after the observation with its key's bytes.
    """
    table = {}
    for size in range(len(_OPTIONAL) + 1):
        for chosen in combinations(_OPTIONAL, size):
            layout = ("type", "episode_id", "observation", *chosen, "id")
            head = (
                bytes([0x80 | len(layout)])  # a fixmap: up to 15 entries
                + _KEY_BYTES["type"]
                + msgpack.packb("get_action")
                + _KEY_BYTES["episode_id"]
            )
            table[layout] = (head, tuple((key, _KEY_BYTES[key]) for key in layout[3:]))
    return table


_GET_ACTION_SKELETONS = _skeletons()
_OBSERVATION_KEY = _KEY_BYTES["observation"]
_EXT_HEADS_KEPT = 64
"""Array layouts (dtype, shape) whose extension header a framer keeps."""
_WIRE_DTYPES = frozenset(DTYPE_CODES.values())
"""Dtypes whose elements travel as they are (the codec converts any other byte order)."""


class RequestFramer:
    """Writes a client's requests as frames, the same bytes as ``frame(encode(message))``.

    One per connection: its packer holds a buffer, so it must not be shared between threads.
    """

    def __init__(self) -> None:
        self._pack = msgpack.Packer(default=_default, use_bin_type=True, autoreset=True).pack
        self._ext_heads: dict[tuple[np.dtype[Any], tuple[int, ...]], bytes] = {}

    def frame(self, message: dict[str, Any]) -> bytes:
        """The frame (length prefix and msgpack body) of ``message``."""
        skeleton = _GET_ACTION_SKELETONS.get(tuple(message))
        if skeleton is None or message["type"] != "get_action":
            body = self._pack(message)
            return HEADER.pack(len(body)) + body
        observation = message["observation"]
        pack = self._pack
        observed = None
        if type(observation) is np.ndarray:
            layout = (observation.dtype, observation.shape)
            ext_head = self._ext_heads.get(layout)
            if ext_head is None and layout[0] in _WIRE_DTYPES:
                ext_head = self._ext_head(layout)
            if ext_head is not None:
                observed = ext_head + observation.tobytes()
        if observed is None:
            observed = pack(observation)
        head, rest = skeleton
        parts = [head, pack(message["episode_id"]), _OBSERVATION_KEY, observed]
        for key, key_bytes in rest:
            parts += key_bytes, pack(message[key])
        body = b"".join(parts)
        return HEADER.pack(len(body)) + body

    def _ext_head(self, layout: tuple[np.dtype[Any], tuple[int, ...]]) -> bytes:
        """The bytes before an array's elements: msgpack's extension header and the shape's."""
        array = np.zeros(layout[1], layout[0])
        packed = self._pack(array)  # the generic encoder's: extension size, dtype code, shape
        head = packed[: len(packed) - array.nbytes]
        if len(self._ext_heads) >= _EXT_HEADS_KEPT:
            self._ext_heads.clear()
        self._ext_heads[layout] = head
        return head
