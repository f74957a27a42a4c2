"""The byte walk and hex dump of scripts/protocol_render.py against hand-checked frames."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from protocol_render import byte_walk, hexdump, notation

from rlserve.protocol.codec import encode
from rlserve.protocol.framing import frame


def test_hexdump_matches_hexdump_c():
    data = frame(encode({"type": "ping", "id": 8}))
    assert hexdump(data) == (
        "00000000  00 00 00 0f 82 a4 74 79  70 65 a4 70 69 6e 67 a2  |......type.ping.|\n"
        "00000010  69 64 08                                          |id.|"
    )


def test_byte_walk_explains_every_byte():
    data = frame(encode({"id": -3, "a": np.array([True, False]), "r": 1.0}))
    lines = byte_walk(data).splitlines()
    assert lines[0].startswith("0000  00 00 00 ") and lines[0].endswith("(u32 big-endian)")
    text = "\n".join(lines)
    for expected in (
        "fixmap, 3 entries",
        "negative fixint -3",
        "fixext 8 (payload of 8 bytes)",
        "dtype code 0 (bool)",
        "element 1 = false (bool)",
        "float 64 (big-endian IEEE 754 follows)",
        "1.0",
    ):
        assert expected in text, expected
    # Every byte of the frame is on exactly one row.
    covered = sum(len(line[6:43].split()) for line in lines)
    assert covered == len(data)


def test_notation_of_arrays_and_nan():
    value = {"x": np.array([1.5, np.nan], np.float32), "n": None, "b": True}
    assert notation(value) == '{"x": ndarray(float32 [2] [1.5, NaN]), "n": null, "b": true}'
    assert notation({"w": np.zeros((4, 4), np.float32)}, elide_over=8) == (
        '{"w": ndarray(float32 [4, 4] …)}'
    )
