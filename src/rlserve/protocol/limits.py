"""Named limits on everything that arrives over the wire.

Each limit is checked before the thing it bounds is allocated: a frame's length before its bytes
are buffered, an array's element count before it is materialised, an id's length before it is
stored. The server sends its limits in the ``welcome`` reply so that a client can check before
sending.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

PROTOCOL_VERSION = 1
"""The wire protocol version this package speaks."""

MAX_FRAME_BYTES_CEILING = 1 << 30
"""The largest ``max_frame_bytes`` a server may set (1 GiB): a frame's first byte is then at most
``0x40``, so it never looks like the first letter of an HTTP method, and one port serves both
carriers (``docs/protocol.md`` section 3.6)."""


@dataclass(frozen=True, slots=True)
class Limits:
    """Upper bounds on what a peer may send.

    Attributes:
        max_frame_bytes: Largest frame body (the msgpack message) in bytes.
        max_array_elements: Largest number of elements in one array.
        max_array_ndim: Largest number of dimensions of one array.
        max_container_len: Largest msgpack array or map (entries), e.g. an ``info`` map.
        max_id_length: Longest episode, policy or client id, in characters.
        max_batch_episodes: Most episodes in one batched ``get_action``.
        max_episodes_per_client: Most concurrent episodes one client (connection) may hold.
        max_episodes_per_server: Most concurrent episodes on the whole server.
        max_info_bytes: Largest ``info`` map of one step, in bytes of msgpack (it is kept with
            the step's data).
        max_agents_per_call: Most agents one multi-agent call names.
        max_agents_per_episode: Most agents one multi-agent episode may hold (done ones count).
        max_agents_per_client: Most agents the open multi-agent episodes of one client
            (identity) may hold together, done ones included: one full episode's worth.
        max_agents_per_server: Most agents the open multi-agent episodes of the whole server
            may hold together: four clients at their limit (about 250 MB of bookkeeping at one
            observation each, a few GB once every agent holds a full fragment).
        max_containers_per_frame: Most msgpack maps and arrays in one frame, at any depth (each
            is a Python object and a hook call while decoding: without it, 16 MiB of empty
            arrays were 16M objects, seconds of decoding and a gigabyte). 16 times
            ``max_container_len``: a report with one info map per step still fits.
    """

    max_frame_bytes: int = 16 * 1024 * 1024
    max_array_elements: int = 4_000_000
    max_array_ndim: int = 8
    max_container_len: int = 65_536
    max_id_length: int = 128
    max_batch_episodes: int = 4096
    max_episodes_per_client: int = 10_000
    max_episodes_per_server: int = 100_000
    max_info_bytes: int = 65_536
    max_agents_per_call: int = 4096
    max_agents_per_episode: int = 65_536
    max_agents_per_client: int = 65_536
    max_agents_per_server: int = 262_144
    max_containers_per_frame: int = 1_048_576

    def to_wire(self) -> dict[str, int]:
        """Return the limits as a plain map for the ``welcome`` message."""
        return asdict(self)

    @classmethod
    def from_wire(cls, raw: Mapping[str, Any]) -> Limits:
        """The limits a ``welcome`` sends; ones this package does not know are ignored."""
        return cls(**{k: v for k, v in raw.items() if k in cls.__dataclass_fields__})


DEFAULT_LIMITS = Limits()
"""The limits a server uses unless configured otherwise."""
