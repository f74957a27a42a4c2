"""RequestFramer: byte for byte the frames of the generic encoder, ``frame(encode(message))``."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

from rlserve.errors import DecodeError
from rlserve.protocol.codec import decode, encode
from rlserve.protocol.episode_requests import (
    EndEpisode,
    GetAction,
    LogAction,
    LogReturns,
    StartEpisode,
    get_action_wire,
)
from rlserve.protocol.framing import frame
from rlserve.protocol.request_frames import RequestFramer
from rlserve.protocol.session_requests import Hello, Ping

RNG = np.random.default_rng(0)

OBSERVATIONS: list[Any] = [
    RNG.uniform(-1, 1, 4).astype(np.float32),
    RNG.uniform(-1, 1, (2, 3)).astype(np.float32)[:, ::2],  # not contiguous
    np.zeros((0, 3), np.float32),
    np.float32(1.5) * np.ones((), np.float32),  # 0-d
    RNG.integers(0, 255, (84, 84, 4), dtype=np.uint8),  # an extension of 32-bit size
    np.ones(10, np.uint8),  # payloads of 16, 8 and 4 bytes: msgpack's fixext forms
    np.ones(2, np.uint8),
    np.ones((), np.float16),
    np.ones(2, np.dtype(">f8")),  # big-endian: converted by the codec
    np.array([True, False]),
    np.arange(3, dtype=np.int64),
    3,
    [0.5, 0.25],
    {"camera": np.ones((2, 2), np.uint8), "speed": 1.0},
    [1, [np.ones(2, np.float32), 2.5]],
    None,
]


def _same_as_generic(framer: RequestFramer, message: dict[str, Any]) -> bytes:
    want = frame(encode(message))
    got = framer.frame(message)
    assert got == want, message
    return got


@pytest.mark.parametrize("observation", OBSERVATIONS, ids=range(len(OBSERVATIONS)))
def test_every_layout_of_a_get_action_is_the_generic_encoders_bytes(observation: Any) -> None:
    framer = RequestFramer()
    options: dict[str, list[Any]] = {
        "seq": [1, 127, 128, 255, 256, 65_536, 2**32, 2**53],
        "reward": [0.0, -0.0, 1.0, -1e9, 1 / 3],
        "info": [{}, {"pos": np.ones(3, np.float32), "label": "x", "n": [1, 2.5, None]}],
    }
    for size in range(4):
        for names in itertools.combinations(options, size):
            for values in itertools.product(*(options[name] for name in names)):
                fields = dict(zip(names, values, strict=True))
                for request_id, episode_id in [(0, "e"), (1_000_000, "x" * 40), (7, "é" * 300)]:
                    message = get_action_wire(request_id, episode_id, observation, **fields)
                    _same_as_generic(framer, message)
                    # Twice: the second time with the array's header cached.
                    _same_as_generic(framer, message)


def test_a_frame_decodes_to_the_message() -> None:
    observation = np.arange(4, dtype=np.float32)
    message = get_action_wire(9, "e1", observation, 3, 0.5, {"k": 1})
    body = RequestFramer().frame(message)[4:]
    decoded = decode(body)
    np.testing.assert_array_equal(decoded.pop("observation"), observation)
    want = {"type": "get_action", "episode_id": "e1", "seq": 3, "reward": 0.5, "info": {"k": 1}}
    assert decoded == {**want, "id": 9}


@pytest.mark.parametrize(
    "message",
    [
        StartEpisode(3, "e1", False, "other").to_wire(),
        EndEpisode(4, "e1", np.ones(4, np.float32), True, 1.0, 7, {"a": 1}).to_wire(),
        LogReturns(5, "e1", 2.0, None, 8).to_wire(),
        LogAction(6, "e1", np.ones(4, np.float32), 1, 0.5, 9).to_wire(),
        GetAction(7, ["a", "b"], np.ones((2, 4), np.float32), [0.0, 1.0], True, [1, 2]).to_wire(),
        GetAction(8, ["e1"], [np.ones(4, np.float32)], None, agent_ids=["p1"], seqs=[3]).to_wire(),
        Hello(0, 1, "python", None, "remote", "c" * 32, False).to_wire(),
        Ping(11).to_wire(),
        # A get_action's keys in another order, and another type with a get_action's keys.
        {"episode_id": "e1", "type": "get_action", "observation": np.ones(2), "id": 1},
        {"type": "end_episode", "episode_id": "e1", "observation": np.ones(2), "id": 1},
    ],
)
def test_other_messages_are_the_generic_encoders_bytes(message: dict[str, Any]) -> None:
    _same_as_generic(RequestFramer(), message)


def test_an_array_that_cannot_travel_is_refused_as_the_codec_refuses_it() -> None:
    message = get_action_wire(1, "e1", np.ones(2, np.complex64), 1)
    with pytest.raises(DecodeError) as generic:
        encode(message)
    with pytest.raises(DecodeError) as framed:
        RequestFramer().frame(message)
    assert str(framed.value) == str(generic.value)


def test_many_array_layouts_keep_the_frames_right() -> None:
    framer = RequestFramer()
    for round_ in range(2):
        for length in range(100):  # more layouts than the framer keeps
            observation = np.full(length, round_, np.float32)
            _same_as_generic(framer, get_action_wire(length, "e", observation, length + 1))
