"""The ``info`` map of a step: what travels, the named errors, and its size limit."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from rlserve.errors import DecodeError, LimitExceededError, SpaceError
from rlserve.protocol.codec import decode, encode
from rlserve.protocol.episode_requests import EndEpisode, GetAction, LogAction, LogReturns
from rlserve.protocol.info import MAX_INFO_DEPTH, check_info_size, wire_info
from rlserve.protocol.limits import Limits
from rlserve.protocol.messages import parse_request

WHERE = "log_returns for episode 'e1'"


@dataclasses.dataclass
class Pose:
    x: float


def test_what_a_python_env_returns_becomes_plain_values() -> None:
    info = {
        "pos": (1, 2.5),
        "count": np.int64(3),
        "flag": np.bool_(True),
        "grid": np.arange(4, dtype=np.float32),
        "nested": {"name": "a", "raw": b"\x00", "none": None},
    }
    out = wire_info(info, WHERE)
    assert out["pos"] == [1, 2.5] and out["count"] == 3 and type(out["count"]) is int
    assert out["flag"] is True and out["nested"] == info["nested"]
    back = decode(encode(out))
    np.testing.assert_array_equal(back["grid"], info["grid"])
    assert out is not info


def test_non_string_keys_become_their_json_text() -> None:
    out = wire_info({3: "a", 2.5: "b", True: "c", None: "d", np.int32(7): "e"}, WHERE)
    assert out == {"3": "a", "2.5": "b", "true": "c", "null": "d", "7": "e"}
    assert decode(encode({"info": out}))["info"] == out  # the server's decoder takes it


@pytest.mark.parametrize(
    ("info", "named"),
    [
        ({"seen": {1, 2}}, "info['seen'] is a set"),
        ({"pose": Pose(1.0)}, "info['pose'] is a Pose"),
        ({"deep": {"list": [1, object()]}}, "info['deep']['list'][1] is a object"),
        ({(1, 2): "tuple key"}, "has a key (1, 2) of type tuple"),
        ({"big": 2**70}, "info['big'] is the integer"),
        ({"text": np.array(["a"])}, "info['text'] is a ndarray"),
    ],
)
def test_a_value_that_cannot_travel_is_named_by_its_key(info: dict[Any, Any], named: str) -> None:
    with pytest.raises(SpaceError, match=f"{WHERE}: .*") as caught:
        wire_info(info, WHERE)
    assert named in str(caught.value)


def test_info_must_be_a_map_and_not_too_deep() -> None:
    with pytest.raises(SpaceError, match="info must be a dict"):
        wire_info([1, 2], WHERE)  # type: ignore[arg-type]
    deep: dict[str, Any] = {}
    node = deep
    for _ in range(MAX_INFO_DEPTH + 1):
        node["k"] = {}
        node = node["k"]
    with pytest.raises(SpaceError, match="deeper than"):
        wire_info(deep, WHERE)


def test_the_size_limit_names_the_call_and_the_limit() -> None:
    assert check_info_size({"a": 1}, 100, WHERE) < 100
    with pytest.raises(LimitExceededError, match=f"{WHERE}: info is .* the limit is 100"):
        check_info_size({"a": "x" * 200}, 100, WHERE)


@pytest.mark.parametrize("kind", ["get_action", "log_action", "end_episode", "log_returns"])
def test_episode_calls_carry_an_info_map(kind: str) -> None:
    raw: dict[str, Any] = {
        "type": kind,
        "id": 1,
        "episode_id": "e1",
        "observation": [0.0],
        "action": 0,
        "reward": 1.0,
        "info": {"lives": 3},
    }
    request = parse_request(raw)
    assert isinstance(request, GetAction | LogAction | EndEpisode | LogReturns)
    infos = request.infos if isinstance(request, GetAction) else [request.info]
    assert infos == [{"lives": 3}]
    with pytest.raises(DecodeError, match=f"'{kind}' field 'info' must be a map"):
        parse_request(raw | {"info": [1]})
    small = Limits(max_info_bytes=64)
    with pytest.raises(LimitExceededError, match=f"'{kind}' field 'info': info is"):
        parse_request(raw | {"info": {"a": "x" * 100}}, small)
    absent = parse_request({k: v for k, v in raw.items() if k != "info"})
    assert (absent.infos if isinstance(absent, GetAction) else absent.info) is None  # type: ignore[union-attr]


def test_batched_get_action_carries_one_info_or_nil_per_episode() -> None:
    raw = {
        "type": "get_action",
        "id": 1,
        "episode_ids": ["a", "b"],
        "observations": [[0.0], [1.0]],
        "infos": [None, {"k": 1}],
    }
    request = parse_request(raw)
    assert isinstance(request, GetAction) and request.infos == [None, {"k": 1}]
    with pytest.raises(DecodeError, match="'infos' must be a list of 2 maps or nils"):
        parse_request(raw | {"infos": [None]})
    with pytest.raises(DecodeError, match="field 'infos' must be a map"):
        parse_request(raw | {"infos": [None, 5]})
