"""Length-prefixed framing for the binary carrier.

A frame is a 4-byte big-endian unsigned length followed by that many bytes of msgpack. The
decoder is fed bytes as they arrive (split anywhere) and yields complete frame bodies; it rejects
a length over the limit as soon as the 4 header bytes are in, before buffering the body.
"""

from __future__ import annotations

import struct

from rlserve.errors import FrameTooLargeError

HEADER = struct.Struct(">I")
"""The frame length prefix."""


def frame(body: bytes) -> bytes:
    """Prefix ``body`` with its length."""
    return HEADER.pack(len(body)) + body


class FrameDecoder:
    """Incremental frame parser: ``feed`` bytes, get back complete frame bodies.

    Args:
        max_frame_bytes: Largest accepted body length.
    """

    def __init__(self, max_frame_bytes: int):
        self.max_frame_bytes = max_frame_bytes
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        """Add received bytes and return every frame body they complete.

        Raises:
            FrameTooLargeError: A length prefix is over ``max_frame_bytes``; the stream cannot be
                resynchronised and the connection should be closed.
        """
        # Fast path: the common case is exactly one whole frame per read.
        if not self._buffer and len(data) >= 4:
            (length,) = HEADER.unpack_from(data)
            self._check(length)
            if len(data) == 4 + length:
                return [bytes(data[4:])]
        self._buffer += data
        frames: list[bytes] = []
        buffer = self._buffer
        offset = 0
        while len(buffer) - offset >= 4:
            (length,) = HEADER.unpack_from(buffer, offset)
            self._check(length)
            end = offset + 4 + length
            if len(buffer) < end:
                break
            frames.append(bytes(buffer[offset + 4 : end]))
            offset = end
        if offset:
            del buffer[:offset]
        return frames

    @property
    def buffered(self) -> int:
        """Number of bytes held waiting for the rest of a frame."""
        return len(self._buffer)

    def _check(self, length: int) -> None:
        if length > self.max_frame_bytes:
            raise FrameTooLargeError(
                f"frame of {length} bytes is over the limit of {self.max_frame_bytes} bytes; "
                "send smaller batches or raise the server's max_frame_bytes"
            )
