"""How messages cross a pipe between a supervisor and its children.

Two wires: :data:`CODEC`, rlserve's msgpack codec (maps of plain values and typed arrays, no
pickle; env-runner processes), and :data:`PICKLE`, ``Connection.send`` (any picklable value,
gym spaces included; env sub-processes). Both ends are our own processes on this machine:
nothing comes from the network.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from rlserve.protocol.codec import decode, encode
from rlserve.protocol.limits import Limits

__all__ = ["CODEC", "IPC_LIMITS", "PICKLE", "Wire", "receive", "send"]

IPC_LIMITS = Limits(
    max_frame_bytes=1 << 30,
    max_array_elements=1 << 28,
    max_container_len=1 << 20,
    max_containers_per_frame=1 << 30,
)
"""Decoding limits between our own processes: a round's fragments may be large (any number of
containers: each is at least one byte of a 1 GiB frame)."""


def send(conn: Connection, message: dict[str, Any]) -> None:
    """Send one codec-encoded message."""
    conn.send_bytes(encode(message))


def receive(conn: Connection) -> dict[str, Any]:
    """Receive one message sent with :func:`send`.

    Raises:
        EOFError: The other end closed the pipe.
        DecodeError: The bytes are not a message.
    """
    return decode(conn.recv_bytes(), IPC_LIMITS)


@dataclass(frozen=True)
class Wire:
    """One way of sending messages over a pipe.

    Attributes:
        encode: A message as what :attr:`transmit` sends (done once for several children).
        transmit: Send an encoded message.
        receive: Receive one message; raises ``EOFError``/``OSError`` when the pipe is closed,
            ``DecodeError`` when the bytes are not a message.
    """

    encode: Callable[[Any], Any]
    transmit: Callable[[Connection, Any], None]
    receive: Callable[[Connection], Any]


CODEC = Wire(encode, Connection.send_bytes, receive)
"""Codec-encoded maps, one per ``send_bytes``."""

PICKLE = Wire(lambda message: message, Connection.send, Connection.recv)
"""Pickled values, one per ``Connection.send``."""
