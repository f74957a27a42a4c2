"""JSON bodies: parsed inline or in the worker, held to the binary carrier's decode limits."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from rlserve.errors import DecodeError, LimitExceededError
from rlserve.protocol.codec import decode
from rlserve.protocol.limits import DEFAULT_LIMITS, Limits
from rlserve.server import json_body
from rlserve.server.json_body import OFF_LOOP_BODY_BYTES, parse_body

PAD = b'"pad": "' + b"a" * OFF_LOOP_BODY_BYTES + b'"'
"""Makes a body large enough for the worker process."""


@pytest.fixture(autouse=True)
def _stop_the_worker() -> Iterator[None]:
    yield
    json_body.shutdown()


def _parse(body: bytes, limits: Limits = DEFAULT_LIMITS, arrays_for_obs: bool = True) -> Any:
    return asyncio.run(parse_body(body, arrays_for_obs, limits))


def _list(entries: int, item: bytes) -> bytes:
    return b"[" + b",".join([item] * entries) + b"]"


@pytest.mark.parametrize("pad", [b"", PAD + b","], ids=["inline", "worker"])
def test_an_array_over_max_container_len_is_refused_in_json_terms(pad: bytes) -> None:
    body = b"{" + pad + b'"id": 3, "info": ' + _list(70_000, b"{}") + b"}"
    with pytest.raises(LimitExceededError) as caught:
        _parse(body)
    assert str(caught.value) == (
        "a JSON array of 70000 entries is over the limit max_container_len (65536); send less "
        "or split the message"
    )


def test_an_object_over_max_container_len_is_refused_in_json_terms() -> None:
    entries = b",".join(b'"k%d": 1' % i for i in range(5))
    with pytest.raises(LimitExceededError, match=r"^a JSON object of 5 entries is over the limit"):
        _parse(b'{"info": {' + entries + b"}}", Limits(max_container_len=4))


@pytest.mark.parametrize("pad", [b"", PAD + b","], ids=["inline", "worker"])
def test_objects_and_arrays_in_all_are_bounded_by_max_containers_per_frame(pad: bytes) -> None:
    """Each array within max_container_len, but too many of them (15 MB of them used to cost
    the event loop seconds when the parsed body came back from the worker)."""
    body = b"{" + pad + b'"info": ' + _list(20, _list(1_000, b"[]")) + b"}"
    limits = Limits(max_containers_per_frame=10_000)
    with pytest.raises(LimitExceededError) as caught:
        _parse(body, limits)
    assert str(caught.value) == (
        "the body holds more than 10000 JSON objects and arrays in all, over the limit "
        "max_containers_per_frame; nest fewer objects and arrays, or split the message"
    )
    assert _parse(body, Limits(max_containers_per_frame=20_022))["info"][19][999] == []


def test_the_worker_answers_with_checked_msgpack_bytes() -> None:
    """One bytes object crosses back from the worker (no pickled object graph to rebuild on the
    event loop), and only for a body within the limits."""
    packed = json_body._checked_body(b'{"observation": [0.5, 1]}', True, DEFAULT_LIMITS)
    assert type(packed) is bytes
    assert decode(packed)["observation"].tolist() == [0.5, 1.0]
    with pytest.raises(LimitExceededError):
        json_body._checked_body(
            b'{"x": ' + _list(10, b"[]") + b"}", True, Limits(max_containers_per_frame=5)
        )


def test_a_body_is_the_same_message_as_before_with_arrays_for_the_observations() -> None:
    body = b'{"id": 1, "episode_id": "e", "observation": [0.5, -1], "reward": 1.5, "seq": 2}'
    out = _parse(body)
    assert {k: v for k, v in out.items() if k != "observation"} == {
        "id": 1,
        "episode_id": "e",
        "reward": 1.5,
        "seq": 2,
    }
    assert out["observation"].dtype == np.float64 and out["observation"].tolist() == [0.5, -1.0]


def test_an_integer_beyond_64_bits_is_read_as_a_double() -> None:
    out = _parse(b'{"a": 18446744073709551616, "b": -1' + b"0" * 400 + b', "c": NaN}')
    assert out["a"] == 2.0**64 and out["b"] == -math.inf and math.isnan(out["c"])


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (b'{"s": "\\ud800"}', "surrogates not allowed"),
        (b'{"x": ' + b"[" * 5_000 + b"]" * 5_000 + b"}", "nested too deeply"),
        (b"[1, 2]", "must be a JSON object"),
    ],
    ids=["lone surrogate", "deep", "not an object"],
)
def test_bodies_that_cannot_be_a_message_are_decode_errors(body: bytes, match: str) -> None:
    with pytest.raises(DecodeError, match=match):
        _parse(body)
