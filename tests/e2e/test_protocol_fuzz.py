"""Property tests against the LIVE server over raw TCP: garbage never hangs or kills it.

Every input gets error replies or a clean disconnect within a timeout. The last test checks that
the server still serves a normal client after all of it.
"""

from __future__ import annotations

import socket
import struct
import threading
from typing import Any

import msgpack
import numpy as np
import pytest
from e2e_support import RawSocket, play_cartpole
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from rlserve import PolicyClient
from rlserve.protocol.codec import encode, pack_array
from rlserve.protocol.messages import REQUEST_TYPES

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

REPLY_TIMEOUT = 10.0
"""Seconds an input may take to be answered (or the connection closed) before it is a hang."""

MAX_FRAME = 65_536

# Shrinking replays examples against the live server for minutes; failures are reported as
# generated. Add Phase.shrink locally to minimise one.
FUZZ = settings(
    max_examples=100,
    derandomize=True,
    deadline=None,
    database=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

GOOD = np.array([0.01, -0.02, 0.03, 0.04], dtype=np.float32)

FIELDS = [
    "type",
    "id",
    "episode_id",
    "episode_ids",
    "observation",
    "observations",
    "reward",
    "rewards",
    "action",
    "truncated",
    "training_enabled",
    "policy_id",
    "protocol_version",
    "token",
    "client_name",
    "inference_mode",
    "info",
]


@pytest.fixture(scope="module")
def server(module_launcher: Any) -> Any:
    handle = module_launcher("--max-frame-bytes", str(MAX_FRAME), "--seed", "9")
    handle.wait_for_weights()
    return handle


# -- strategies -------------------------------------------------------------------------------

ndarrays = st.one_of(
    hnp.arrays(
        dtype=st.sampled_from([np.float32, np.float64, np.int64, np.uint8, np.bool_, np.float16]),
        shape=hnp.array_shapes(min_dims=0, max_dims=3, max_side=5),
    ),
    hnp.arrays(np.float32, (4,), elements=st.floats(width=32)),
).map(pack_array)

ext_values = st.one_of(
    st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=40)),
    st.builds(  # ndarray extensions with arbitrary headers
        lambda code, dims, data: msgpack.ExtType(
            1, bytes([code, len(dims)]) + struct.pack(f"<{len(dims)}I", *dims) + data
        ),
        st.integers(0, 255),
        st.lists(st.integers(0, 2**32 - 1), max_size=4),
        st.binary(max_size=64),
    ),
    ndarrays,
)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(),
    st.text(max_size=20),
    st.binary(max_size=20),
    st.sampled_from(REQUEST_TYPES),
    ext_values,
)

values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=5)
        | st.dictionaries(st.text(max_size=8) | st.sampled_from(FIELDS), children, max_size=5)
    ),
    max_leaves=20,
)

keys = st.one_of(
    st.sampled_from(FIELDS), st.text(max_size=12), st.integers(), st.binary(max_size=4)
)

maps = st.dictionaries(keys, values, max_size=8).flatmap(
    lambda m: st.one_of(
        st.just(m),
        st.sampled_from(REQUEST_TYPES).map(lambda t: {**m, "type": t}),
        st.integers(0, 2**32).map(lambda i: {**m, "id": i}),
    )
)


# -- checks -----------------------------------------------------------------------------------


def _check_reply(reply: Any, sent: Any = None) -> None:
    assert isinstance(reply, dict), reply
    assert isinstance(reply.get("type"), str), reply
    assert "id" in reply, reply
    if reply["type"] == "error":
        assert isinstance(reply.get("code"), str) and reply["code"], reply
        assert isinstance(reply.get("message"), str) and reply["message"], reply
    if isinstance(sent, dict):
        sent_id = sent.get("id")
        if type(sent_id) is int and sent_id >= 0:
            # The id is echoed, unless the message could not even be decoded to read it.
            assert reply["id"] in (sent_id, None), (sent, reply)
            if reply["id"] is None:
                assert reply["type"] == "error", (sent, reply)
                assert reply["code"] in ("decode_error", "limit_exceeded"), (sent, reply)


def _read_to_eof(raw: RawSocket) -> list[dict[str, Any]]:
    """Every reply until the server closes; a TimeoutError here is a hang."""
    replies = []
    while True:
        reply = raw.receive(REPLY_TIMEOUT)
        if reply is None:
            return replies
        replies.append(reply)


def _encodable(message: Any) -> bytes | None:
    try:
        return msgpack.packb(message, use_bin_type=True)
    except (TypeError, ValueError, OverflowError):
        return None


# -- properties -------------------------------------------------------------------------------


@FUZZ
@given(data=st.binary(max_size=300), say_hello=st.booleans())
def test_random_bytes(server: Any, data: bytes, say_hello: bool) -> None:
    """Random bytes, then end of input: error replies, then a clean close; never a hang."""
    with RawSocket(server.address, timeout=REPLY_TIMEOUT) as raw:
        if say_hello:
            raw.hello()
        raw.send_bytes(data)
        raw.sock.shutdown(socket.SHUT_WR)
        for reply in _read_to_eof(raw):
            _check_reply(reply)


@FUZZ
@given(data=st.binary(min_size=1, max_size=200))
def test_random_frame_bodies(server: Any, data: bytes) -> None:
    """A well-framed body of random bytes gets exactly one reply; the connection lives on."""
    with RawSocket(server.address, timeout=REPLY_TIMEOUT) as raw:
        raw.hello()
        raw.send_body(data)
        reply = raw.receive()
        assert reply is not None, "connection closed instead of an error reply"
        _check_reply(reply)
        assert raw.request({"type": "ping", "id": 77}) == {"type": "pong", "id": 77}


@FUZZ
@given(messages=st.lists(maps, min_size=1, max_size=4), say_hello=st.booleans())
def test_random_msgpack_maps(server: Any, messages: list[dict[Any, Any]], say_hello: bool) -> None:
    """Pipelined random maps: one reply each, in order, echoing valid ids; then a ping works."""
    bodies = [_encodable(m) for m in messages]
    with RawSocket(server.address, timeout=REPLY_TIMEOUT) as raw:
        if say_hello:
            raw.hello()
        raw.send_bytes(b"".join(struct.pack(">I", len(b)) + b for b in bodies if b is not None))
        may_close = False
        authenticated = say_hello
        for message, body in zip(messages, bodies, strict=True):
            if body is None:
                continue
            may_close = may_close or message.get("type") == "hello" or len(body) > MAX_FRAME
            reply = raw.receive()
            if reply is None:
                # Only a failed hello or an oversized frame may close the connection.
                assert may_close, messages
                return
            _check_reply(reply, message)
            authenticated = authenticated or reply["type"] == "welcome"
        if any(m.get("type") == "hello" for m in messages):
            return  # a failed hello closes; it may or may not have been answered yet
        reply = raw.request({"type": "ping", "id": 78})
        if authenticated:
            assert reply == {"type": "pong", "id": 78}
        else:
            assert reply["type"] == "error" and reply["code"] == "unauthorized", reply


def _templates(episode_id: str) -> dict[str, dict[str, Any]]:
    return {
        "get_action": {"type": "get_action", "episode_id": episode_id, "observation": GOOD},
        "get_action_batched": {
            "type": "get_action",
            "episode_ids": [episode_id],
            "observations": GOOD[None],
            "rewards": [0.5],
        },
        "log_action": {
            "type": "log_action",
            "episode_id": episode_id,
            "observation": GOOD,
            "action": 1,
            "reward": 1.0,
        },
        "log_returns": {"type": "log_returns", "episode_id": episode_id, "reward": 1.0},
        "end_episode": {
            "type": "end_episode",
            "episode_id": episode_id,
            "observation": GOOD,
            "truncated": True,
            "reward": 1.0,
        },
        "start_episode": {"type": "start_episode", "training_enabled": False},
        "ping": {"type": "ping"},
    }


observations = st.one_of(
    hnp.arrays(np.float32, st.sampled_from([(4,), (3,), (1, 4), (2, 4), (0,), ()])),
    hnp.arrays(np.float64, (4,), elements=st.floats(-10, 10)),
    st.lists(st.floats(), min_size=0, max_size=6),
    values,
)


@FUZZ
@given(data=st.data())
def test_mutated_valid_messages(server: Any, data: st.DataObject) -> None:
    """Valid messages with a field dropped, replaced, added or retyped, after a valid hello."""
    with RawSocket(server.address, timeout=REPLY_TIMEOUT) as raw:
        raw.hello()
        started = raw.request({"type": "start_episode", "id": 1})
        assert started["type"] == "episode_started", started
        episode_id = started["episode_id"]
        acted = raw.request(
            {"type": "get_action", "id": 2, "episode_id": episode_id, "observation": GOOD}
        )
        assert acted["type"] == "action", acted

        name = data.draw(st.sampled_from(sorted(_templates(episode_id))), label="template")
        message = dict(_templates(episode_id)[name])
        message["id"] = 3
        for _ in range(data.draw(st.integers(1, 3), label="mutations")):
            mutation = data.draw(
                st.sampled_from(["drop", "replace", "add", "observation", "retype"]),
                label="mutation",
            )
            if mutation == "drop" and message:
                del message[data.draw(st.sampled_from(sorted(message)), label="dropped")]
            elif mutation == "replace" and message:
                field = data.draw(st.sampled_from(sorted(message)), label="replaced")
                message[field] = data.draw(values, label="value")
            elif mutation == "add":
                message[data.draw(st.sampled_from(FIELDS), label="added")] = data.draw(values)
            elif mutation == "observation":
                key = "observations" if "observations" in message else "observation"
                message[key] = data.draw(observations, label="observation")
            else:
                message["type"] = data.draw(st.sampled_from(REQUEST_TYPES), label="type")
        body = _encodable(message)
        if body is None:
            return
        raw.send_body(body)
        reply = raw.receive()
        if reply is None:
            assert message.get("type") == "hello" or len(body) > MAX_FRAME, message
            return
        _check_reply(reply, message)
        if reply["type"] == "error" and reply["code"] in ("version_mismatch", "unauthorized"):
            assert message.get("type") == "hello", (message, reply)
            assert raw.receive() is None  # a refused hello closes the connection
            return
        # The connection and the episode still work.
        assert raw.request({"type": "ping", "id": 4}) == {"type": "pong", "id": 4}
        end = raw.request(
            {"type": "end_episode", "id": 5, "episode_id": episode_id, "observation": GOOD}
        )
        _check_reply(end)
        assert end["type"] == "ok" or end["code"] == "episode_error", end


def test_deep_pipeline_is_answered_in_order(server: Any) -> None:
    """Thousands of pipelined requests all come back, in order.

    get_action replies wait for their forward pass, so the backlog grows past the point where the
    server pauses reading; it must resume and answer everything.
    """
    with RawSocket(server.address, timeout=60) as raw:
        raw.hello()
        messages: list[dict[str, Any]] = [{"type": "start_episode", "episode_id": "deep"}]
        for i in range(200):
            step: dict[str, Any] = {"type": "get_action", "episode_id": "deep", "observation": GOOD}
            if i:
                step["reward"] = 1.0
            messages.append(step)
        messages.append({"type": "end_episode", "episode_id": "deep", "observation": GOOD})
        messages += [{"type": "ping"} for _ in range(3000)]
        for i, message in enumerate(messages):
            message["id"] = i + 1
        payload = b"".join(struct.pack(">I", len(b)) + b for b in map(encode, messages))
        sender = threading.Thread(target=raw.send_bytes, args=(payload,))
        sender.start()
        expected = {
            "start_episode": "episode_started",
            "get_action": "action",
            "end_episode": "ok",
            "ping": "pong",
        }
        for message in messages:
            reply = raw.receive()
            assert reply is not None, f"closed before answering {message}"
            assert reply["id"] == message["id"], (message, reply)
            assert reply["type"] == expected[message["type"]], (message, reply)
        sender.join(30)
        assert not sender.is_alive()


def test_oversized_frame_gets_an_error_and_a_close(server: Any) -> None:
    with RawSocket(server.address) as raw:
        raw.hello()
        raw.send_bytes(struct.pack(">I", MAX_FRAME + 1) + b"\x80" * 100)
        reply = raw.receive()
        assert reply is not None
        assert reply["type"] == "error" and reply["code"] == "frame_too_large", reply
        assert raw.receive() is None


def test_many_simultaneous_connections(server: Any) -> None:
    sockets = [RawSocket(server.address) for _ in range(100)]
    try:
        for raw in sockets:
            raw.send({"type": "hello", "id": 1, "protocol_version": 1})
        for raw in sockets:
            reply = raw.receive()
            assert reply is not None and reply["type"] == "welcome", reply
        for i, raw in enumerate(sockets):
            raw.send({"type": "ping", "id": i})
        for i, raw in enumerate(sockets):
            assert raw.receive() == {"type": "pong", "id": i}
    finally:
        for raw in sockets:
            raw.close()


def test_server_still_serves_after_fuzzing(server: Any) -> None:
    """Runs after the properties above (file order): the server is alive and answers normally."""
    assert server.alive(), server.log()
    with PolicyClient(server.address, inference_mode="remote", timeout=30) as client:
        result = play_cartpole(client, seed=123)
    assert result.length > 0
    metrics = server.metrics()
    assert metrics["episodes/completed"] >= 1
    assert "Traceback" not in server.log(), server.log()
