"""Property tests: whatever bytes arrive, decoding and validation fail only with ProtocolError."""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlserve.errors import ProtocolError, SpaceError
from rlserve.protocol.codec import DTYPE_CODES, NDARRAY_EXT, decode, encode
from rlserve.protocol.framing import FrameDecoder, frame
from rlserve.protocol.limits import Limits
from rlserve.protocol.messages import REQUEST_TYPES, parse_request

FUZZ = settings(
    deadline=None,
    max_examples=300,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)

SMALL_LIMITS = Limits(
    max_frame_bytes=4096,
    max_array_elements=64,
    max_array_ndim=3,
    max_container_len=16,
    max_id_length=8,
    max_batch_episodes=4,
)

pytestmark = pytest.mark.timeout(60)


def _decode_and_parse(data: bytes, limits: Limits) -> None:
    """Run the server's path for one frame body; any non-protocol exception escapes.

    A SpaceError (``bad_value``) is a protocol answer too: a reward outside the float32 range.
    """
    try:
        raw = decode(data, limits)
        parse_request(raw, limits)
    except (ProtocolError, SpaceError):
        pass


# -- strategies ------------------------------------------------------------------------------

_arrays = st.builds(
    lambda code, shape, seed: (
        np.random.default_rng(seed).integers(0, 2, size=shape).astype(DTYPE_CODES[code])
    ),
    st.sampled_from(sorted(DTYPE_CODES)),
    st.lists(st.integers(0, 3), max_size=3).map(tuple),
    st.integers(0, 2**16),
)

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
    | st.binary(max_size=12)
    | _arrays
    | st.sampled_from(["e", "a", "b", "default", *REQUEST_TYPES])
)

values = st.recursive(
    _scalars,
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5)
    ),
    max_leaves=12,
)

FIELD_NAMES = [
    "id",
    "episode_id",
    "episode_ids",
    "observation",
    "observations",
    "action",
    "reward",
    "rewards",
    "truncated",
    "training_enabled",
    "policy_id",
    "protocol_version",
    "client_name",
    "token",
    "inference_mode",
    "info",
]


@st.composite
def valid_messages(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from(REQUEST_TYPES))
    rid = draw(st.integers(0, 2**32))
    eid = draw(st.text(min_size=1, max_size=8))
    obs = draw(st.sampled_from([[0.0, 1.0], np.zeros(2, np.float32), {"a": 1}, 3]))
    base: dict[str, Any] = {"type": kind, "id": rid}
    if kind == "hello":
        base.update(protocol_version=1, client_name="c", token="t", inference_mode="remote")
    elif kind == "start_episode":
        base.update(episode_id=eid, training_enabled=True, policy_id="default")
    elif kind == "get_action":
        if draw(st.booleans()):
            ids = draw(st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=4))
            ids = list(dict.fromkeys(ids))
            base.update(
                episode_ids=ids,
                observations=np.zeros((len(ids), 2), np.float32),
                rewards=[0.5] * len(ids),
            )
        else:
            base.update(episode_id=eid, observation=obs, reward=1.0)
    elif kind == "log_action":
        base.update(episode_id=eid, observation=obs, action=1, reward=0.0)
    elif kind == "log_returns":
        base.update(episode_id=eid, reward=2.5, info={"k": "v"})
    elif kind == "end_episode":
        base.update(episode_id=eid, observation=obs, truncated=False, reward=1.0)
    elif kind == "get_weights":
        base.update(policy_id="default", have_version=draw(st.integers(0, 10)))
    elif kind == "report_samples":
        base.update(batch_id=eid, fragments=[{"episode_id": eid}], episodes=[])
    elif kind == "map_agents":
        ids = draw(st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=4))
        base.update(episode_id=eid, agent_ids=list(dict.fromkeys(ids)))
    return base


@st.composite
def mutated_messages(draw: st.DrawFn) -> dict[str, Any]:
    message = draw(valid_messages())
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["set", "set", "delete", "set", "retype"]))
        if op == "set":
            message[draw(st.sampled_from(FIELD_NAMES))] = draw(values)
        elif op == "delete":
            if message:
                message.pop(draw(st.sampled_from(sorted(message))))
        else:
            message["type"] = draw(
                st.sampled_from(REQUEST_TYPES) | st.sampled_from(REQUEST_TYPES) | values
            )
    return message


@st.composite
def mutated_bytes(draw: st.DrawFn) -> bytes:
    data = bytearray(encode(draw(valid_messages())))
    for _ in range(draw(st.integers(1, 2))):
        op = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate"]))
        if not data:
            break
        pos = draw(st.integers(0, len(data) - 1))
        if op == "flip":
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif op == "set":
            data[pos] = draw(st.integers(0, 255))
        elif op == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete":
            del data[pos : pos + draw(st.integers(1, 8))]
        else:
            del data[pos:]
    return bytes(data)


@st.composite
def forged_ndarrays(draw: st.DrawFn) -> bytes:
    """A message whose ndarray ext has an arbitrary header and a data length near the right one."""
    code = draw(st.integers(0, 11) | st.integers(0, 255))
    dims = draw(st.lists(st.integers(0, 4) | st.integers(0, 2**32 - 1), max_size=10))
    header = bytes([code, len(dims)]) + b"".join(d.to_bytes(4, "little") for d in dims)
    header = header[: draw(st.integers(0, len(header)))] if draw(st.booleans()) else header
    count = 1
    for d in dims:
        count *= d
    itemsize = DTYPE_CODES[code].itemsize if code in DTYPE_CODES else 1
    # Mostly the right data length, sometimes off by a little, sometimes arbitrary.
    size = min(count * itemsize, 512) + draw(st.sampled_from([0, 0, 0, -1, 1]))
    body = b"\x01" * max(size, 0) if draw(st.booleans()) else draw(st.binary(max_size=80))
    ext_code = draw(st.integers(0, 127)) if draw(st.integers(0, 9)) == 9 else NDARRAY_EXT
    return msgpack.packb(
        {
            "type": "get_action",
            "episode_id": "e",
            "observation": msgpack.ExtType(ext_code, header + body),
        }
    )


# -- properties ------------------------------------------------------------------------------


@FUZZ
@given(data=st.binary(max_size=256))
def test_random_bytes_raise_only_protocol_errors(data: bytes) -> None:
    _decode_and_parse(data, SMALL_LIMITS)


@FUZZ
@given(data=st.binary(max_size=256))
def test_random_bytes_with_default_limits(data: bytes) -> None:
    _decode_and_parse(data, Limits())


@FUZZ
@given(data=mutated_bytes())
def test_mutated_encoded_messages_raise_only_protocol_errors(data: bytes) -> None:
    _decode_and_parse(data, SMALL_LIMITS)


@FUZZ
@given(message=mutated_messages())
def test_mutated_message_fields_raise_only_protocol_errors(message: dict[str, Any]) -> None:
    _decode_and_parse(encode(message), SMALL_LIMITS)
    _decode_and_parse(encode(message), Limits())


@FUZZ
@given(data=forged_ndarrays())
def test_forged_ndarray_headers_raise_only_protocol_errors(data: bytes) -> None:
    _decode_and_parse(data, SMALL_LIMITS)


@FUZZ
@given(message=valid_messages())
def test_valid_messages_parse(message: dict[str, Any]) -> None:
    # The generators above start from messages that really are valid; otherwise the mutations
    # would only ever exercise the first check.
    request = parse_request(decode(encode(message)))
    assert request.id == message["id"]


@FUZZ
@given(
    bodies=st.lists(st.binary(max_size=40), max_size=6),
    cuts=st.lists(st.integers(0, 400), max_size=8),
)
def test_framing_reassembles_any_split(bodies: list[bytes], cuts: list[int]) -> None:
    data = b"".join(frame(b) for b in bodies)
    decoder = FrameDecoder(64)
    out: list[bytes] = []
    start = 0
    for cut in [*sorted(c for c in cuts if c <= len(data)), len(data)]:
        out.extend(decoder.feed(data[start:cut]))
        start = cut
    assert out == bodies
    assert decoder.buffered == 0


@FUZZ
@given(data=st.binary(max_size=300), chunk=st.integers(1, 50))
def test_framing_random_stream_raises_only_frame_errors(data: bytes, chunk: int) -> None:
    decoder = FrameDecoder(32)
    try:
        for i in range(0, len(data), chunk):
            for body in decoder.feed(data[i : i + chunk]):
                assert len(body) <= 32
                _decode_and_parse(body, SMALL_LIMITS)
    except ProtocolError:
        pass
    # Never buffers more than one maximal frame plus the next chunk.
    assert decoder.buffered <= 4 + 32 + chunk
