"""Text renderings of protocol messages for docs/protocol.md: hex dumps, byte walks, notation.

Everything here is a pure function of bytes or decoded values; nothing talks to a server.
"""

from __future__ import annotations

import json
import math
import struct
from typing import Any

import numpy as np

from rlserve.protocol.codec import DTYPE_CODES

ROW_BYTES = 12
"""Bytes per row of a byte walk (longer strings continue on rows without text)."""

HEX_WIDTH = 37
"""Width of the hex column of a byte walk."""


# -- hex dumps --------------------------------------------------------------------------------


def _hexdump_line(offset: int, chunk: bytes) -> str:
    parts = [f"{b:02x}" for b in chunk]
    left, right = " ".join(parts[:8]), " ".join(parts[8:])
    text = "".join(chr(b) if 0x20 <= b < 0x7F else "." for b in chunk)
    return f"{offset:08x}  {left:<23}  {right:<23}  |{text}|"


def hexdump(data: bytes, head: int | None = None, tail: int = 0) -> str:
    """``hexdump -C`` style lines; with ``head``, only that many first and ``tail`` last lines."""
    lines = [_hexdump_line(i, data[i : i + 16]) for i in range(0, len(data), 16)]
    if head is None or len(lines) <= head + tail + 1:
        return "\n".join(lines)
    left_out = len(lines) - head - tail
    middle = f"...       ({len(data)} bytes in all; {left_out} lines left out)"
    return "\n".join([*lines[:head], middle, *lines[len(lines) - tail :]])


# -- notation of decoded values ---------------------------------------------------------------


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return repr(float(value))


def _element(value: Any) -> str:
    if isinstance(value, bool | np.bool_):
        return "true" if value else "false"
    if isinstance(value, float | np.floating):
        return _number(float(value))
    return str(int(value))


def _nested(array: np.ndarray) -> str:
    if array.ndim == 0:
        return _element(array.item())
    if array.ndim == 1:
        return "[" + ", ".join(_element(v) for v in array.tolist()) + "]"
    return "[" + ", ".join(_nested(row) for row in array) + "]"


def notation(value: Any, elide_over: int | None = None) -> str:
    """A decoded message in JSON notation, arrays as ``ndarray(dtype [shape] [elements])``.

    Args:
        value: The decoded value.
        elide_over: Arrays with more elements than this are written with ``…`` for their elements.
    """
    if isinstance(value, np.ndarray):
        shape = "[" + ", ".join(str(d) for d in value.shape) + "]"
        if elide_over is not None and value.size > elide_over:
            return f"ndarray({value.dtype} {shape} …)"
        return f"ndarray({value.dtype} {shape} {_nested(value)})"
    if isinstance(value, dict):
        inner = ", ".join(f"{json.dumps(k)}: {notation(v, elide_over)}" for k, v in value.items())
        return "{" + inner + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(notation(v, elide_over) for v in value) + "]"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return _number(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def compact_json(value: Any, cut: bool = False) -> str:
    """JSON text as the HTTP carrier writes it; with ``cut``, long lists end in ``…``.

    With ``cut``, a list of lists keeps its first 2 rows and a list of numbers its first 4.
    """
    if isinstance(value, dict):
        return (
            "{"
            + ",".join(f"{json.dumps(k)}:{compact_json(v, cut)}" for k, v in value.items())
            + "}"
        )
    if isinstance(value, list):
        items = value
        more = False
        if cut:
            keep = 2 if items and isinstance(items[0], list) else 4
            more = len(items) > keep
            items = items[:keep]
        parts = [compact_json(v, cut) for v in items] + (["…"] if more else [])
        return "[" + ",".join(parts) + "]"
    return json.dumps(value, ensure_ascii=False)


# -- byte walks -------------------------------------------------------------------------------


class _Walker:
    """Explains every byte of one frame, one msgpack item per line, indented by nesting."""

    def __init__(self, data: bytes, keep_elements: int | None):
        self.data = data
        self.keep = keep_elements
        self.lines: list[str] = []

    def row(self, offset: int, raw: bytes, indent: int, text: str) -> None:
        for i in range(0, max(len(raw), 1), ROW_BYTES):
            hex_part = " ".join(f"{b:02x}" for b in raw[i : i + ROW_BYTES])
            label = " " * indent + text if i == 0 else ""
            self.lines.append(f"{offset + i:04x}  {hex_part:<{HEX_WIDTH}}{label}".rstrip())

    def take(self, pos: int, n: int) -> bytes:
        return self.data[pos : pos + n]

    def frame(self) -> list[str]:
        (length,) = struct.unpack_from(">I", self.data)
        self.row(0, self.data[:4], 0, f"frame length = {length} (u32 big-endian)")
        end = self.item(4, 0)
        if end != len(self.data):
            raise ValueError(f"frame has {len(self.data) - end} bytes after its value")
        return self.lines

    def item(self, pos: int, indent: int) -> int:
        b = self.data[pos]
        if b <= 0x7F:
            self.row(pos, bytes([b]), indent, f"positive fixint {b}")
            return pos + 1
        if b >= 0xE0:
            self.row(pos, bytes([b]), indent, f"negative fixint {b - 256}")
            return pos + 1
        if 0x80 <= b <= 0x8F:
            return self.map(pos, 1, b & 0x0F, indent, "fixmap")
        if 0x90 <= b <= 0x9F:
            return self.array(pos, 1, b & 0x0F, indent, "fixarray")
        if 0xA0 <= b <= 0xBF:
            n = b & 0x1F
            self.row(pos, bytes([b]), indent, f"fixstr, {n} bytes")
            return self.string(pos + 1, n, indent)
        if b in (0xC0, 0xC2, 0xC3):
            self.row(pos, bytes([b]), indent, {0xC0: "nil", 0xC2: "false", 0xC3: "true"}[b])
            return pos + 1
        if b in (0xD9, 0xDA, 0xDB):
            size = {0xD9: 1, 0xDA: 2, 0xDB: 4}[b]
            n = int.from_bytes(self.take(pos + 1, size), "big")
            self.row(pos, self.take(pos, 1 + size), indent, f"str {8 * size}, {n} bytes")
            return self.string(pos + 1 + size, n, indent)
        if b in (0xCC, 0xCD, 0xCE, 0xCF, 0xD0, 0xD1, 0xD2, 0xD3):
            size = 1 << (b & 0x03)
            signed = b >= 0xD0
            value = int.from_bytes(self.take(pos + 1, size), "big", signed=signed)
            name = f"{'int' if signed else 'uint'} {8 * size}"
            self.row(pos, self.take(pos, 1 + size), indent, f"{name} {value}")
            return pos + 1 + size
        if b in (0xCA, 0xCB):
            size, fmt = (4, ">f") if b == 0xCA else (8, ">d")
            self.row(pos, bytes([b]), indent, f"float {8 * size} (big-endian IEEE 754 follows)")
            (value,) = struct.unpack(fmt, self.take(pos + 1, size))
            self.row(pos + 1, self.take(pos + 1, size), indent, _number(value))
            return pos + 1 + size
        if b in (0xDC, 0xDD):
            size = 2 if b == 0xDC else 4
            n = int.from_bytes(self.take(pos + 1, size), "big")
            return self.array(pos, 1 + size, n, indent, f"array {8 * size}")
        if b in (0xDE, 0xDF):
            size = 2 if b == 0xDE else 4
            n = int.from_bytes(self.take(pos + 1, size), "big")
            return self.map(pos, 1 + size, n, indent, f"map {8 * size}")
        if 0xD4 <= b <= 0xD8:
            n = 1 << (b - 0xD4)
            self.row(pos, bytes([b]), indent, f"fixext {n} (payload of {n} bytes)")
            return self.ext(pos + 1, n, indent)
        if b in (0xC7, 0xC8, 0xC9):
            size = {0xC7: 1, 0xC8: 2, 0xC9: 4}[b]
            n = int.from_bytes(self.take(pos + 1, size), "big")
            self.row(pos, bytes([b]), indent, f"ext {8 * size}")
            order = "" if size == 1 else " (big-endian)"
            self.row(pos + 1, self.take(pos + 1, size), indent, f"payload length {n}{order}")
            return self.ext(pos + 1 + size, n, indent)
        raise ValueError(f"byte {b:#04x} at {pos:#x} is not used by this protocol")

    def string(self, pos: int, n: int, indent: int) -> int:
        raw = self.take(pos, n)
        self.row(pos, raw, indent, json.dumps(raw.decode(), ensure_ascii=False))
        return pos + n

    def map(self, pos: int, header: int, n: int, indent: int, name: str) -> int:
        self.row(pos, self.take(pos, header), indent, f"{name}, {n} {_plural(n, 'entry')}")
        pos += header
        for _ in range(n):
            pos = self.item(pos, indent + 2)
            pos = self.item(pos, indent + 4)
        return pos

    def array(self, pos: int, header: int, n: int, indent: int, name: str) -> int:
        self.row(pos, self.take(pos, header), indent, f"{name}, {n} {_plural(n, 'item')}")
        pos += header
        for _ in range(n):
            pos = self.item(pos, indent + 2)
        return pos

    def ext(self, pos: int, n: int, indent: int) -> int:
        code = self.data[pos]
        if code != 1:
            self.row(
                pos, bytes([code]), indent, f"extension type {code} (not part of the protocol)"
            )
            self.row(pos + 1, self.take(pos + 1, n), indent, "payload")
            return pos + 1 + n
        self.row(pos, bytes([code]), indent, "extension type 1 (ndarray)")
        start, inner = pos + 1, indent + 2
        dtype = DTYPE_CODES[self.data[start]]
        ndim = self.data[start + 1]
        self.row(
            start, bytes([self.data[start]]), inner, f"dtype code {self.data[start]} ({dtype})"
        )
        self.row(start + 1, bytes([ndim]), inner, f"ndim {ndim}")
        shape = struct.unpack_from(f"<{ndim}I", self.data, start + 2)
        for i, dim in enumerate(shape):
            at = start + 2 + 4 * i
            self.row(at, self.take(at, 4), inner, f"dim[{i}] = {dim} (u32 little-endian)")
        elements = np.frombuffer(
            self.data, dtype=dtype, count=int(np.prod(shape)), offset=start + 2 + 4 * ndim
        )
        at, size = start + 2 + 4 * ndim, dtype.itemsize
        order = "" if size == 1 else " little-endian"
        shown = len(elements) if self.keep is None or len(elements) <= self.keep else self.keep
        for i in range(shown):
            text = f"element {i} = {_element(elements[i])} ({dtype}{order})"
            self.row(at + i * size, self.take(at + i * size, size), inner, text)
        if shown < len(elements):
            rest = len(elements) - shown
            self.lines.append(
                f"{at + shown * size:04x}  {'..':<{HEX_WIDTH}}{' ' * inner}... elements "
                f"{shown}..{len(elements) - 1} ({rest * size} bytes) left out"
            )
        return start + n


def _plural(n: int, word: str) -> str:
    if n == 1:
        return word
    return word[:-1] + "ies" if word.endswith("y") else word + "s"


def byte_walk(frame_bytes: bytes, keep_elements: int | None = None) -> str:
    """Every byte of a frame explained, one msgpack item per line.

    Args:
        frame_bytes: The length prefix and the body.
        keep_elements: Show only this many first elements of each longer array.
    """
    return "\n".join(_Walker(frame_bytes, keep_elements).frame())
