"""Unit tests of the length-prefixed frame decoder."""

from __future__ import annotations

import struct

import pytest

from rlserve.errors import FrameTooLargeError, ProtocolError
from rlserve.protocol.framing import FrameDecoder, frame

BODIES = [b"hello", b"", b"x" * 300, bytes(range(256)), b"\x00\x00\x00\x05tricky"]


def _feed_in_pieces(decoder: FrameDecoder, data: bytes, cuts: list[int]) -> list[bytes]:
    out: list[bytes] = []
    start = 0
    for cut in [*cuts, len(data)]:
        out.extend(decoder.feed(data[start:cut]))
        start = cut
    return out


def test_frame_prefixes_big_endian_length() -> None:
    assert frame(b"abc") == b"\x00\x00\x00\x03abc"
    assert frame(b"") == b"\x00\x00\x00\x00"
    assert frame(b"z" * 258)[:4] == b"\x00\x00\x01\x02"


def test_one_whole_frame() -> None:
    decoder = FrameDecoder(1024)
    assert decoder.feed(frame(b"payload")) == [b"payload"]
    assert decoder.buffered == 0


def test_empty_body_frame() -> None:
    decoder = FrameDecoder(1024)
    assert decoder.feed(frame(b"")) == [b""]
    assert decoder.buffered == 0
    # Also when it is not alone in the chunk, and when its header arrives split.
    assert decoder.feed(frame(b"") + frame(b"a") + frame(b"")) == [b"", b"a", b""]
    assert decoder.feed(b"\x00\x00") == []
    assert decoder.feed(b"\x00\x00") == [b""]
    assert decoder.buffered == 0


@pytest.mark.parametrize("body", BODIES, ids=lambda b: f"len{len(b)}")
def test_split_at_every_byte_position(body: bytes) -> None:
    data = frame(body)
    for cut in range(len(data) + 1):
        decoder = FrameDecoder(1024)
        first = decoder.feed(data[:cut])
        second = decoder.feed(data[cut:])
        assert first + second == [body], f"cut at {cut}"
        # Nothing is returned before the frame is complete.
        if cut < len(data):
            assert first == []
        assert decoder.buffered == 0


def test_split_at_every_pair_of_positions_across_several_frames() -> None:
    bodies = [b"hello", b"", b"abcdefgh"]
    data = b"".join(frame(b) for b in bodies)
    for a in range(len(data) + 1):
        for b in range(a, len(data) + 1):
            decoder = FrameDecoder(1024)
            assert _feed_in_pieces(decoder, data, [a, b]) == bodies, (a, b)
            assert decoder.buffered == 0


def test_byte_by_byte() -> None:
    data = b"".join(frame(b) for b in BODIES)
    decoder = FrameDecoder(1024)
    out = _feed_in_pieces(decoder, data, list(range(1, len(data))))
    assert out == BODIES


def test_several_frames_in_one_chunk() -> None:
    decoder = FrameDecoder(1024)
    data = b"".join(frame(b) for b in BODIES)
    assert decoder.feed(data) == BODIES
    assert decoder.buffered == 0


def test_several_frames_and_a_partial_one() -> None:
    decoder = FrameDecoder(1024)
    tail = frame(b"tail-body")
    assert decoder.feed(frame(b"a") + frame(b"b") + tail[:6]) == [b"a", b"b"]
    assert decoder.buffered == 6
    assert decoder.feed(tail[6:]) == [b"tail-body"]
    assert decoder.buffered == 0


def test_frame_exactly_at_limit_is_accepted() -> None:
    decoder = FrameDecoder(10)
    assert decoder.feed(frame(b"0123456789")) == [b"0123456789"]


def test_oversized_prefix_rejected_on_header_alone() -> None:
    decoder = FrameDecoder(10)
    with pytest.raises(FrameTooLargeError, match="11 bytes"):
        decoder.feed(struct.pack(">I", 11))


def test_oversized_prefix_rejected_when_header_arrives_split() -> None:
    decoder = FrameDecoder(1000)
    header = struct.pack(">I", 0xFFFFFFFF)
    assert decoder.feed(header[:1]) == []
    assert decoder.feed(header[1:3]) == []
    with pytest.raises(FrameTooLargeError):
        decoder.feed(header[3:])
    # It never waited for (or buffered) any body bytes.
    assert decoder.buffered <= 4


def test_oversized_frame_after_a_good_one_in_the_same_chunk() -> None:
    decoder = FrameDecoder(100)
    with pytest.raises(FrameTooLargeError):
        decoder.feed(frame(b"ok") + struct.pack(">I", 101) + b"partial body")


def test_oversized_prefix_rejected_after_a_good_frame_completed() -> None:
    decoder = FrameDecoder(100)
    assert decoder.feed(frame(b"ok")) == [b"ok"]
    with pytest.raises(FrameTooLargeError):
        decoder.feed(b"\x7f\x00\x00\x00")


def test_frame_too_large_is_a_protocol_error() -> None:
    assert issubclass(FrameTooLargeError, ProtocolError)
    assert FrameTooLargeError.code == "frame_too_large"


def test_empty_feed_returns_nothing() -> None:
    decoder = FrameDecoder(100)
    assert decoder.feed(b"") == []
    assert decoder.buffered == 0


def test_returned_bodies_are_independent_bytes() -> None:
    decoder = FrameDecoder(100)
    data = bytearray(frame(b"abc") + frame(b"def"))
    bodies = decoder.feed(bytes(data))
    assert all(type(b) is bytes for b in bodies)
    assert bodies == [b"abc", b"def"]
