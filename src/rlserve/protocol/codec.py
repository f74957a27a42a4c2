"""Message encoding: msgpack maps with typed binary arrays, and the JSON equivalent.

An array travels in msgpack as extension type 1 (``ndarray``) whose payload is::

    u8 dtype code | u8 ndim | ndim x u32 little-endian dims | raw little-endian element bytes

The dtype codes are in :data:`DTYPE_CODES`. Nothing here executes code on decode: there is no
pickle and no ``msgpack_numpy``; an extension type other than 1 is an error. In JSON an array is a
nested list of numbers.
"""

from __future__ import annotations

import json
import re
import struct
import threading
from collections.abc import Callable
from typing import Any, cast

import msgpack
import numpy as np

from rlserve.errors import DecodeError, LimitExceededError
from rlserve.protocol.limits import DEFAULT_LIMITS, Limits

NDARRAY_EXT = 1
"""msgpack extension type code of an array."""

DTYPE_CODES: dict[int, np.dtype[Any]] = {
    0: np.dtype("bool"),
    1: np.dtype("<i1"),
    2: np.dtype("<u1"),
    3: np.dtype("<i2"),
    4: np.dtype("<u2"),
    5: np.dtype("<i4"),
    6: np.dtype("<u4"),
    7: np.dtype("<i8"),
    8: np.dtype("<u8"),
    9: np.dtype("<f2"),
    10: np.dtype("<f4"),
    11: np.dtype("<f8"),
}
"""Wire dtype code -> numpy dtype (always little-endian)."""

_CODE_OF: dict[str, int] = {dt.str.lstrip("<|="): code for code, dt in DTYPE_CODES.items()}
_CODE_OF["b1"] = 0


def _dtype_code(dtype: np.dtype[Any]) -> int:
    key = dtype.newbyteorder("<").str.lstrip("<|=") if dtype.byteorder == ">" else dtype.str
    key = key.lstrip("<|=")
    try:
        return _CODE_OF[key]
    except KeyError:
        raise DecodeError(
            f"arrays of dtype {dtype} cannot be sent; use one of "
            f"{sorted(str(d) for d in DTYPE_CODES.values())}"
        ) from None


def pack_array(array: np.ndarray) -> msgpack.ExtType:
    """Wrap a numpy array as the ``ndarray`` msgpack extension.

    Args:
        array: Any numeric or boolean array.

    Returns:
        The extension value, ready for ``msgpack.packb``.
    """
    # Hot path (every fragment logged or sent): little-endian dtypes are looked up directly.
    code = _CODE_OF_DTYPE.get(array.dtype)
    if code is None:
        code = _dtype_code(array.dtype)
        array = array.astype(array.dtype.newbyteorder("<"))
    return msgpack.ExtType(NDARRAY_EXT, _shape_header(code, array.shape) + array.tobytes())


def _shape_header(code: int, shape: tuple[int, ...]) -> bytes:
    ndim = len(shape)
    layout = _SHAPE_LAYOUTS[ndim] if ndim < len(_SHAPE_LAYOUTS) else struct.Struct(f"<BB{ndim}I")
    return layout.pack(code, ndim, *shape)


_SHAPE_LAYOUTS = tuple(struct.Struct(f"<BB{ndim}I") for ndim in range(9))
_CODE_OF_DTYPE: dict[np.dtype[Any], int] = {dtype: code for code, dtype in DTYPE_CODES.items()}


_DIMS_LAYOUTS = tuple(struct.Struct(f"<{ndim}I") for ndim in range(256))


def unpack_array(payload: bytes, limits: Limits = DEFAULT_LIMITS) -> np.ndarray:
    """Decode an ``ndarray`` extension payload, checking it against ``limits`` first.

    Args:
        payload: The extension's bytes.
        limits: Bounds on dimensions and element count.

    Returns:
        A read-only array viewing ``payload``.

    Raises:
        DecodeError: The payload is malformed (unknown dtype, wrong length).
        LimitExceededError: Too many dimensions or elements.
    """
    if len(payload) < 2:
        raise DecodeError("ndarray payload is shorter than its 2-byte header")
    code, ndim = payload[0], payload[1]
    dtype = DTYPE_CODES.get(code)
    if dtype is None:
        raise DecodeError(f"unknown ndarray dtype code {code}; valid codes are 0-11")
    if ndim > limits.max_array_ndim:
        raise LimitExceededError(
            f"array has {ndim} dimensions; the limit is {limits.max_array_ndim}"
        )
    header_len = 2 + 4 * ndim
    if len(payload) < header_len:
        raise DecodeError(f"ndarray payload ends inside its shape ({ndim} dimensions)")
    shape = _DIMS_LAYOUTS[ndim].unpack_from(payload, 2)
    count = 1
    for dim in shape:
        count *= dim
    if count > limits.max_array_elements:
        raise LimitExceededError(
            f"array of shape {shape} has {count} elements; the limit is {limits.max_array_elements}"
        )
    expected = header_len + count * dtype.itemsize
    if len(payload) != expected:
        raise DecodeError(
            f"ndarray of shape {shape} and dtype {dtype} needs {expected - header_len} data "
            f"bytes, got {len(payload) - header_len}"
        )
    return np.frombuffer(payload, dtype=dtype, count=count, offset=header_len).reshape(shape)


def _default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return pack_array(obj)
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"cannot encode {type(obj).__name__} on the wire")


_packer_default = _default


def encode(message: dict[str, Any]) -> bytes:
    """Encode a message map as msgpack bytes (without the frame prefix).

    Args:
        message: A map of plain values, numpy arrays and scalars.

    Returns:
        The msgpack bytes.
    """
    packer = getattr(_PACKERS, "packer", None)
    if packer is None:
        # msgpack.packb makes a Packer per call; one per thread is reused (a Packer is not
        # thread-safe, and it resets itself after each pack, an error included).
        packer = _PACKERS.packer = msgpack.Packer(default=_packer_default, use_bin_type=True)
    return cast(bytes, packer.pack(message))


_PACKERS = threading.local()


_TIMESTAMPS = "msgpack timestamps (extension type -1) are not part of the protocol"


def _refuse_timestamps_in_map(obj: dict[str, Any]) -> dict[str, Any]:
    # msgpack turns extension type -1 into a Timestamp without calling ext_hook.
    for value in obj.values():
        if type(value) is msgpack.Timestamp:
            raise DecodeError(_TIMESTAMPS)
    return obj


def _refuse_timestamps_in_list(obj: list[Any]) -> list[Any]:
    # map(type, ...) keeps the scan of a long list (agent ids, rewards) in C.
    if msgpack.Timestamp in map(type, obj):
        raise DecodeError(_TIMESTAMPS)
    return obj


_UNPACKERS: dict[int, tuple[Limits, Callable[[bytes], Any]]] = {}


def _unpacker(limits: Limits) -> Callable[[bytes], Any]:
    """``msgpack.unpackb`` with the protocol's hooks and ``limits``, made once per limits.

    Frames of at most ``max_containers_per_frame`` bytes are decoded with it (nearly all of
    them): binding the hooks and keywords once saves building them per message, and such a
    frame cannot hold more maps and arrays than that, as each takes at least one byte.
    """
    entry = _UNPACKERS.get(id(limits))
    if entry is not None and entry[0] is limits:
        return entry[1]
    unpack = _make_unpacker(limits, _refuse_timestamps_in_map, _refuse_timestamps_in_list)
    if len(_UNPACKERS) >= 64:  # a server has one or two limits; tests make many
        _UNPACKERS.clear()
    _UNPACKERS[id(limits)] = (limits, unpack)
    return unpack


def _counting_unpacker(limits: Limits) -> Callable[[bytes], Any]:
    """An unpacker for one larger frame, that counts its maps and arrays as they are decoded.

    msgpack bounds each container (``max_container_len``) but not how many there are: 16 MiB of
    empty arrays are 16M Python objects. The hooks run once per map and array, so they stop the
    decoding past ``max_containers_per_frame``. Made per frame (the count is the frame's).
    """
    left = limits.max_containers_per_frame
    timestamp = msgpack.Timestamp

    def count_map(obj: dict[str, Any]) -> dict[str, Any]:
        nonlocal left
        left -= 1
        if left < 0:
            raise LimitExceededError(_budget_message(limits))
        for value in obj.values():
            if type(value) is timestamp:
                raise DecodeError(_TIMESTAMPS)
        return obj

    def count_list(obj: list[Any]) -> list[Any]:
        nonlocal left
        left -= 1
        if left < 0:
            raise LimitExceededError(_budget_message(limits))
        if timestamp in map(type, obj):
            raise DecodeError(_TIMESTAMPS)
        return obj

    return _make_unpacker(limits, count_map, count_list)


def _make_unpacker(
    limits: Limits,
    object_hook: Callable[[dict[str, Any]], Any],
    list_hook: Callable[[list[Any]], Any],
) -> Callable[[bytes], Any]:
    def ext_hook(code: int, payload: bytes) -> Any:
        if code != NDARRAY_EXT:
            raise DecodeError(f"unknown msgpack extension type {code}; only 1 (ndarray) exists")
        return unpack_array(payload, limits)

    unpackb = msgpack.unpackb
    longest, most = limits.max_frame_bytes, limits.max_container_len

    # Keywords spelled out in the call: measured a little faster than a functools.partial.
    def unpack(data: bytes) -> Any:
        return unpackb(
            data,
            ext_hook=ext_hook,
            object_hook=object_hook,
            list_hook=list_hook,
            raw=False,
            strict_map_key=True,
            use_list=True,
            max_str_len=longest,
            max_bin_len=longest,
            max_array_len=most,
            max_map_len=most,
            max_ext_len=longest,
        )

    return unpack


def decode(data: bytes, limits: Limits = DEFAULT_LIMITS) -> dict[str, Any]:
    """Decode one msgpack message, enforcing ``limits`` while unpacking.

    Args:
        data: A frame body.
        limits: Bounds on containers, strings and arrays.

    Returns:
        The message map.

    Raises:
        DecodeError: The bytes are not one msgpack map.
        LimitExceededError: A container or array is over its limit, or the message holds more
            than ``max_containers_per_frame`` maps and arrays.
    """
    try:
        if len(data) <= limits.max_containers_per_frame:
            message = _unpacker(limits)(data)
        else:
            message = _counting_unpacker(limits)(data)
    except (DecodeError, LimitExceededError):
        raise
    except msgpack.StackError as exc:
        raise DecodeError(
            "msgpack maps and arrays nest deeper than 1024 levels (msgpack's own limit); "
            "nest them less deeply"
        ) from exc
    except ValueError as exc:
        # msgpack signals its own size limits with ValueError("... exceeds max_...").
        if "exceeds max" in str(exc):
            raise LimitExceededError(_container_limit_message(str(exc), limits)) from exc
        raise DecodeError(f"not a valid msgpack message: {exc}") from exc
    except Exception as exc:
        raise DecodeError(f"not a valid msgpack message: {exc}") from exc
    if not isinstance(message, dict):
        raise DecodeError(f"a message must be a msgpack map, got {type(message).__name__}")
    return message


def _container_limit_message(text: str, limits: Limits) -> str:
    """Say which of the protocol's limits a msgpack size error broke, in the protocol's terms.

    msgpack words it as ``70000 exceeds max_array_len(65536)``; the protocol's name for the
    limit on maps and arrays is ``max_container_len`` (strings, bins and extension values are
    bounded by ``max_frame_bytes``, so they cannot exceed theirs).
    """
    match = re.search(r"(\d+) exceeds max_(array|map)_len", text)
    if match is None:
        return f"a msgpack value is over the frame's size limits: {text}"
    count, kind = int(match[1]), match[2]
    fix = "send numbers as an ndarray extension value or" if kind == "array" else "send less or"
    return (
        f"a msgpack {kind} of {count} entries is over the limit max_container_len "
        f"({limits.max_container_len}); {fix} split the message"
    )


def _budget_message(limits: Limits) -> str:
    return (
        f"the message holds more than {limits.max_containers_per_frame} maps and arrays in all, "
        "over the limit max_containers_per_frame; send numbers as arrays (binary carrier: "
        "ndarray extension values), nest fewer maps and arrays, or split the message"
    )


def to_jsonable(value: Any) -> Any:
    """Turn arrays and numpy scalars inside ``value`` into lists and Python numbers."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {k: to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_jsonable(v) for v in value]
    return value


def encode_json(message: dict[str, Any]) -> bytes:
    """Encode a message as UTF-8 JSON, arrays as nested lists."""
    return json.dumps(to_jsonable(message), separators=(",", ":"), allow_nan=False).encode()
