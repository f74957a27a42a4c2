"""Unit tests of the msgpack/JSON codec and its ``ndarray`` extension."""

from __future__ import annotations

import json
import struct

import msgpack
import numpy as np
import pytest

from rlserve.errors import DecodeError, LimitExceededError, ProtocolError
from rlserve.protocol.codec import (
    DTYPE_CODES,
    NDARRAY_EXT,
    decode,
    encode,
    encode_json,
    pack_array,
    to_jsonable,
    unpack_array,
)
from rlserve.protocol.limits import Limits

ALL_CODES = sorted(DTYPE_CODES)


def _sample(dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    rng = np.random.default_rng(1234)
    count = int(np.prod(shape))
    if dtype.kind == "b":
        flat = rng.integers(0, 2, size=count).astype(bool)
    elif dtype.kind in "iu":
        info = np.iinfo(dtype)
        # Include both extremes so sign and width errors show up.
        flat = rng.integers(info.min, info.max, size=count, endpoint=True, dtype=dtype)
        if count >= 2:
            flat[0], flat[1] = info.min, info.max
    else:
        flat = (rng.standard_normal(count) * 1000).astype(dtype)
        if count >= 2:
            flat[0], flat[1] = np.finfo(dtype).min, np.finfo(dtype).max
    return flat.reshape(shape)


def _ext_payload(array: np.ndarray) -> bytes:
    ext = pack_array(array)
    assert ext.code == NDARRAY_EXT
    return ext.data


def _header(code: int, shape: tuple[int, ...]) -> bytes:
    return struct.pack(f"<BB{len(shape)}I", code, len(shape), *shape)


def _message_with_ext(code: int, payload: bytes) -> bytes:
    return msgpack.packb({"type": "ping", "x": msgpack.ExtType(code, payload)})


# -- round trips -----------------------------------------------------------------------------


@pytest.mark.parametrize("code", ALL_CODES)
@pytest.mark.parametrize("shape", [(2, 3), (5,), (), (0,), (3, 0, 2)], ids=str)
def test_ndarray_round_trip_every_dtype(code: int, shape: tuple[int, ...]) -> None:
    dtype = DTYPE_CODES[code]
    array = _sample(dtype, shape)
    out = decode(encode({"a": array}))["a"]
    assert isinstance(out, np.ndarray)
    assert out.dtype == dtype
    assert out.shape == shape
    np.testing.assert_array_equal(out, array)
    # The payload starts with the documented dtype code and ndim.
    payload = _ext_payload(array)
    assert payload[0] == code
    assert payload[1] == len(shape)


def test_decoded_array_is_read_only() -> None:
    out = decode(encode({"a": np.arange(4, dtype=np.float32)}))["a"]
    assert not out.flags.writeable


def test_zero_d_array_keeps_zero_dims() -> None:
    out = decode(encode({"a": np.array(2.5, dtype=np.float64)}))["a"]
    assert out.ndim == 0
    assert out.item() == 2.5


def test_payload_layout_matches_documentation() -> None:
    array = np.array([[1, -2, 3], [4, 5, -6]], dtype=np.int16)
    expected = (
        bytes([3, 2])
        + struct.pack("<II", 2, 3)
        + struct.pack("<6h", 1, -2, 3, 4, 5, -6)  # little-endian, C order
    )
    assert _ext_payload(array) == expected


@pytest.mark.parametrize("dtype", [">i2", ">u4", ">i8", ">f2", ">f4", ">f8", ">u8"])
def test_big_endian_input_is_sent_little_endian(dtype: str) -> None:
    big = np.arange(6).astype(dtype).reshape(2, 3)
    assert big.dtype.byteorder == ">"
    little = big.astype(big.dtype.newbyteorder("<"))
    payload = _ext_payload(big)
    assert payload == _ext_payload(little)
    assert payload[2 + 4 * 2 :] == little.tobytes()
    out = decode(encode({"a": big}))["a"]
    assert out.dtype == little.dtype
    np.testing.assert_array_equal(out, np.arange(6).reshape(2, 3))


def test_non_contiguous_input_round_trips() -> None:
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    view = base[::2, 1::2].T  # strided and transposed
    out = decode(encode({"a": view}))["a"]
    np.testing.assert_array_equal(out, view)


def test_numpy_scalars_become_plain_values() -> None:
    out = decode(encode({"f": np.float32(1.5), "i": np.int64(-3), "b": np.bool_(True)}))
    assert out == {"f": 1.5, "i": -3, "b": True}


def test_unsupported_dtype_is_refused_on_encode() -> None:
    with pytest.raises(ProtocolError, match="cannot be sent"):
        encode({"a": np.zeros(2, dtype=np.complex64)})


def test_unencodable_object_is_refused() -> None:
    with pytest.raises(TypeError, match="cannot encode object"):
        encode({"a": object()})


def test_nested_message_round_trip() -> None:
    message = {
        "type": "get_action",
        "id": 7,
        "episode_ids": ["a", "b"],
        "observations": [{"cam": np.ones((2, 2), np.uint8), "pos": [1.0, 2.0]}, None],
    }
    out = decode(encode(message))
    assert out["episode_ids"] == ["a", "b"]
    np.testing.assert_array_equal(out["observations"][0]["cam"], np.ones((2, 2), np.uint8))
    assert out["observations"][0]["pos"] == [1.0, 2.0]
    assert out["observations"][1] is None


# -- array limits and malformed payloads -----------------------------------------------------


def test_too_many_dimensions() -> None:
    shape = (1,) * 9  # default limit is 8
    with pytest.raises(LimitExceededError, match="9 dimensions"):
        decode(_message_with_ext(NDARRAY_EXT, _header(10, shape) + b"\x00" * 4))


def test_dimension_limit_is_configurable_and_inclusive() -> None:
    limits = Limits(max_array_ndim=2)
    ok = np.zeros((1, 2), np.float32)
    assert decode(encode({"a": ok}), limits)["a"].shape == (1, 2)
    with pytest.raises(LimitExceededError):
        decode(encode({"a": np.zeros((1, 1, 1), np.float32)}), limits)


def test_too_many_elements_checked_before_data_length() -> None:
    # 1000 * 1000 * 10 elements declared, no data at all: the element limit must fire first.
    payload = _header(11, (1000, 1000, 10))
    with pytest.raises(LimitExceededError, match="10000000 elements"):
        decode(_message_with_ext(NDARRAY_EXT, payload))


def test_element_limit_is_inclusive() -> None:
    limits = Limits(max_array_elements=6)
    assert decode(encode({"a": np.zeros((2, 3), np.int8)}), limits)["a"].size == 6
    with pytest.raises(LimitExceededError):
        decode(encode({"a": np.zeros(7, np.int8)}), limits)


def test_huge_dims_overflowing_u32_product_are_limited() -> None:
    payload = _header(2, (0xFFFFFFFF, 0xFFFFFFFF))
    with pytest.raises(LimitExceededError):
        unpack_array(payload)


@pytest.mark.parametrize("delta", [-1, 1, -4])
def test_wrong_data_length(delta: int) -> None:
    good = _ext_payload(np.arange(4, dtype=np.float32))
    bad = good[:delta] if delta < 0 else good + b"\x00" * delta
    with pytest.raises(DecodeError, match="needs 16 data bytes"):
        decode(_message_with_ext(NDARRAY_EXT, bad))


def test_payload_shorter_than_header() -> None:
    with pytest.raises(DecodeError, match="2-byte header"):
        unpack_array(b"\x0a")
    with pytest.raises(DecodeError, match="2-byte header"):
        decode(_message_with_ext(NDARRAY_EXT, b""))


def test_payload_ending_inside_shape() -> None:
    with pytest.raises(DecodeError, match="ends inside its shape"):
        unpack_array(bytes([10, 2]) + struct.pack("<I", 3))


@pytest.mark.parametrize("code", [12, 13, 100, 255])
def test_unknown_dtype_code(code: int) -> None:
    payload = bytes([code, 1]) + struct.pack("<I", 1) + b"\x00" * 8
    with pytest.raises(DecodeError, match=f"unknown ndarray dtype code {code}"):
        decode(_message_with_ext(NDARRAY_EXT, payload))


@pytest.mark.parametrize("code", [0, 2, 42, 127])
def test_unknown_ext_type(code: int) -> None:
    with pytest.raises(DecodeError, match=f"unknown msgpack extension type {code}"):
        decode(_message_with_ext(code, _ext_payload(np.zeros(1, np.float32))))


def test_timestamp_ext_type_minus_one_is_refused() -> None:
    # Extension type -1 (msgpack's timestamp) is an extension other than 1, which the codec
    # promises to refuse; msgpack decodes it to a Timestamp without calling ext_hook.
    # fixext4, type -1, 4 zero bytes = Timestamp(0)
    data = b"\x82\xa4type\xa4ping\xa1x\xd6\xff\x00\x00\x00\x00"
    with pytest.raises(DecodeError):
        decode(data)


# -- message-level errors --------------------------------------------------------------------


@pytest.mark.parametrize("top", [[1, 2], 5, "ping", None, 1.5, b"\x01"], ids=repr)
def test_top_level_must_be_a_map(top: object) -> None:
    with pytest.raises(DecodeError, match="must be a msgpack map"):
        decode(msgpack.packb(top, use_bin_type=True))


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xc1",  # never-used msgpack byte
        b"\x81",  # map of 1 with nothing in it
        b"\x82\xa4type",  # truncated map
        b"\xa5abc",  # truncated string
        b"\x81\x01\x02",  # integer map key (strict_map_key)
        msgpack.packb({"type": "ping"}) + b"\x00",  # trailing bytes
        b"\xff\xff\xff\xff",
    ],
    ids=repr,
)
def test_garbage_bytes_raise_decode_error(data: bytes) -> None:
    with pytest.raises(DecodeError):
        decode(data)


@pytest.mark.parametrize(
    "value", [list(range(5)), {str(i): i for i in range(5)}, {"k": list(range(5))}], ids=str
)
def test_container_over_max_container_len(value: object) -> None:
    limits = Limits(max_container_len=4)
    data = msgpack.packb({"type": "ping", "v": value})
    with pytest.raises(LimitExceededError):
        decode(data, limits)


@pytest.mark.parametrize(
    ("value", "kind"), [(list(range(5)), "array"), ({str(i): i for i in range(5)}, "map")]
)
def test_container_limit_error_names_max_container_len(value: object, kind: str) -> None:
    """The limit is called by its protocol name (welcome.limits), not msgpack's."""
    data = msgpack.packb({"type": "ping", "v": value})
    with pytest.raises(LimitExceededError) as caught:
        decode(data, Limits(max_container_len=4))
    assert str(caught.value).startswith(
        f"a msgpack {kind} of 5 entries is over the limit max_container_len (4); "
    )
    assert "max_array_len" not in str(caught.value) and "max_map_len" not in str(caught.value)


def test_container_at_max_container_len_is_accepted() -> None:
    limits = Limits(max_container_len=4)
    out = decode(msgpack.packb({"type": "ping", "v": [1, 2, 3, 4]}), limits)
    assert out["v"] == [1, 2, 3, 4]


def test_top_level_map_over_max_container_len() -> None:
    limits = Limits(max_container_len=2)
    with pytest.raises(LimitExceededError):
        decode(msgpack.packb({"a": 1, "b": 2, "c": 3}), limits)


# -- max_containers_per_frame ------------------------------------------------------------------


def test_a_frame_of_many_small_containers_is_over_max_containers_per_frame() -> None:
    """Every container is within max_container_len, but there are 16M of them in 16 MiB: the
    decoding stops at the budget instead of building them all (seconds and a gigabyte)."""
    data = msgpack.packb({"type": "ping", "id": 1, "x": [[[]] * 65_535] * 250})
    assert len(data) < Limits().max_frame_bytes
    with pytest.raises(LimitExceededError) as caught:
        decode(data)
    assert str(caught.value) == (
        "the message holds more than 1048576 maps and arrays in all, over the limit "
        "max_containers_per_frame; send numbers as arrays (binary carrier: ndarray extension "
        "values), nest fewer maps and arrays, or split the message"
    )


@pytest.mark.parametrize(
    "value",
    [[[]] * 20, [{}] * 20, {"a": [[[[]]]] * 5}, [{"k": [1]}] * 10],
    ids=repr,
)
def test_maps_and_arrays_count_at_any_depth(value: object) -> None:
    limits = Limits(max_containers_per_frame=12)
    data = msgpack.packb({"type": "ping", "v": value})
    with pytest.raises(LimitExceededError, match="max_containers_per_frame"):
        decode(data, limits)


def test_a_frame_at_max_containers_per_frame_is_accepted() -> None:
    # The top-level map, the list and 10 maps: 12 containers.
    value = {"type": "ping", "v": [{"k": 1}] * 10}
    data = msgpack.packb(value)
    assert decode(data, Limits(max_containers_per_frame=12)) == value
    with pytest.raises(LimitExceededError):
        decode(data, Limits(max_containers_per_frame=11))


def test_a_frame_no_longer_than_the_budget_cannot_exceed_it() -> None:
    """Each container takes at least a byte: a frame of at most max_containers_per_frame bytes
    is decoded without counting (the hot path), and every one of its containers fits."""
    data = msgpack.packb({"type": "ping", "v": [[]] * 20})
    assert decode(data, Limits(max_containers_per_frame=len(data)))["v"] == [[]] * 20


def test_the_largest_report_with_an_info_per_step_fits_the_default_budget() -> None:
    """A report of 15.6 MiB (330,000 CartPole steps, one info map each) holds 333,302 maps and
    arrays: within the default, with room for nested infos."""
    steps = 200
    fragment = {
        "episode_id": "e" * 12,
        "policy_id": "default",
        "obs": np.zeros((steps + 1, 4), np.float32),
        "actions": np.zeros(steps, np.int64),
        "rewards": np.ones(steps, np.float32),
        "behaviour_logp": np.zeros(steps, np.float32),
        "policy_chosen": np.ones(steps, bool),
        "weights_version": np.zeros(steps, np.int64),
        "terminated": False,
        "truncated": False,
        "infos": [{"step": s} for s in range(steps)],
    }
    data = encode(
        {"type": "report_samples", "id": 1, "batch_id": "b", "fragments": [fragment] * 1650}
    )
    assert 15 * 2**20 < len(data) < Limits().max_frame_bytes
    assert len(decode(data)["fragments"]) == 1650


def test_maps_and_arrays_deeper_than_msgpack_allows_are_a_clear_decode_error() -> None:
    with pytest.raises(DecodeError, match="nest deeper than 1024 levels"):
        decode(b"\x81\xa1v" + b"\x91" * 1100 + b"\xc0")


def test_string_over_frame_limit() -> None:
    limits = Limits(max_frame_bytes=10)
    with pytest.raises(LimitExceededError):
        decode(msgpack.packb({"type": "x" * 11}), limits)


# -- JSON ------------------------------------------------------------------------------------


def test_encode_json_turns_arrays_into_lists() -> None:
    message = {
        "type": "action",
        "id": 3,
        "actions": np.array([[1.5, -2.0], [0.25, 4.0]], dtype=np.float32),
        "nested": [{"a": np.arange(3, dtype=np.int64)}, (np.int32(7), np.float64(0.5))],
        "flag": np.bool_(False),
        "scalar": np.array(9, dtype=np.uint8),
    }
    out = json.loads(encode_json(message))
    assert out == {
        "type": "action",
        "id": 3,
        "actions": [[1.5, -2.0], [0.25, 4.0]],
        "nested": [{"a": [0, 1, 2]}, [7, 0.5]],
        "flag": False,
        "scalar": 9,
    }
    assert isinstance(out["nested"][0]["a"][0], int)


def test_encode_json_is_compact_and_decodes_as_utf8() -> None:
    data = encode_json({"a": [1, 2], "b": "é"})
    assert data.startswith(b'{"a":[1,2],"b":')
    assert json.loads(data.decode("utf-8")) == {"a": [1, 2], "b": "é"}


def test_encode_json_refuses_non_finite() -> None:
    with pytest.raises(ValueError):
        encode_json({"x": np.array([np.nan])})


def test_to_jsonable_leaves_plain_values() -> None:
    value = {"a": 1, "b": [1.5, "s", None, True]}
    assert to_jsonable(value) == value
