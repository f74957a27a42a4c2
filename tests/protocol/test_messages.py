"""Unit tests of request validation (``parse_request``)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from rlserve.errors import DecodeError, LimitExceededError, ProtocolError, SpaceError
from rlserve.protocol.codec import decode, encode
from rlserve.protocol.episode_requests import (
    DEFAULT_POLICY_ID,
    EndEpisode,
    GetAction,
    LogAction,
    LogReturns,
    StartEpisode,
)
from rlserve.protocol.limits import DEFAULT_LIMITS, Limits
from rlserve.protocol.messages import REQUEST_TYPES, parse_request
from rlserve.protocol.multi_agent_requests import MapAgents
from rlserve.protocol.replies import AgentsMapped, ErrorReply, Welcome
from rlserve.protocol.session_requests import GetWeights, Hello, Ping, ReportSamples

VALID: dict[str, dict[str, Any]] = {
    "hello": {"type": "hello", "id": 1, "protocol_version": 1},
    "start_episode": {"type": "start_episode", "id": 2},
    "get_action": {"type": "get_action", "id": 3, "episode_id": "e", "observation": [0.0]},
    "log_action": {
        "type": "log_action",
        "id": 4,
        "episode_id": "e",
        "observation": [0.0],
        "action": 1,
    },
    "log_returns": {"type": "log_returns", "id": 5, "episode_id": "e", "reward": 1.0},
    "end_episode": {"type": "end_episode", "id": 6, "episode_id": "e", "observation": [0.0]},
    "ping": {"type": "ping", "id": 7},
    "get_weights": {"type": "get_weights", "id": 8, "have_version": 3},
    "report_samples": {
        "type": "report_samples",
        "id": 9,
        "batch_id": "b1",
        "fragments": [{"episode_id": "e"}],
    },
    "map_agents": {"type": "map_agents", "id": 10, "episode_id": "e", "agent_ids": ["a", "b"]},
}


def _with(kind: str, **changes: Any) -> dict[str, Any]:
    raw = dict(VALID[kind])
    raw.update(changes)
    return raw


def _without(kind: str, name: str) -> dict[str, Any]:
    raw = dict(VALID[kind])
    del raw[name]
    return raw


def test_every_request_type_has_a_valid_example() -> None:
    assert set(VALID) == set(REQUEST_TYPES)


# -- each type -------------------------------------------------------------------------------


def test_hello() -> None:
    req = parse_request(
        {
            "type": "hello",
            "id": 1,
            "protocol_version": 1,
            "client_name": "sim-3",
            "token": "s3cret",
            "inference_mode": "local",
        }
    )
    assert req == Hello(1, 1, "sim-3", "s3cret", "local")


def test_hello_and_welcome_say_map_agents_only_when_true() -> None:
    """Section 7.1: a hello or welcome without ``map_agents`` is byte for byte as before."""
    assert "map_agents" not in Hello(1, 1).to_wire()
    said = Hello(1, 1, inference_mode="local", map_agents=True)
    assert said.to_wire()["map_agents"] is True
    assert parse_request(said.to_wire()) == said
    with pytest.raises(DecodeError, match="map_agents"):
        parse_request({**said.to_wire(), "map_agents": "yes"})
    welcome = Welcome(1, "x", {}, [], True, ["remote"], "i", DEFAULT_LIMITS, map_agents=True)
    assert welcome.to_wire()["map_agents"] is True
    assert Welcome.from_wire(welcome.to_wire()).map_agents
    old = {k: v for k, v in welcome.to_wire().items() if k != "map_agents"}
    assert "policies" in old and not Welcome.from_wire(old).map_agents


def test_map_agents_and_its_reply() -> None:
    request = parse_request(decode(encode(VALID["map_agents"])))
    assert request == MapAgents(10, "e", ["a", "b"])
    assert parse_request(request.to_wire()) == request
    reply = AgentsMapped(10, ["red", "blue"])
    assert AgentsMapped.from_wire(decode(encode(reply.to_wire())), 2) == reply
    with pytest.raises(DecodeError, match="2 strings"):
        AgentsMapped.from_wire({"type": "agents_mapped", "id": 1, "policy_ids": ["red"]}, 2)


@pytest.mark.parametrize(
    ("changes", "error", "match"),
    [
        ({"agent_ids": []}, DecodeError, "non-empty list"),
        ({"agent_ids": ["a", "a"]}, DecodeError, "more than once"),
        ({"agent_ids": ["a", 3]}, DecodeError, "agent_ids"),
        ({"agent_ids": ["x" * 129]}, LimitExceededError, "max_id_length|128"),
        ({"agent_ids": [f"a{i}" for i in range(4097)]}, LimitExceededError, "max_agents_per_call"),
        ({"episode_id": ""}, LimitExceededError, "episode_id"),
    ],
)
def test_map_agents_is_checked_against_the_limits(
    changes: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        parse_request(_with("map_agents", **changes))
    with pytest.raises(DecodeError, match="agent_ids"):
        parse_request(_without("map_agents", "agent_ids"))


def test_hello_defaults() -> None:
    assert parse_request(VALID["hello"]) == Hello(1, 1, "client", None, "remote")


def test_start_episode() -> None:
    req = parse_request(
        {
            "type": "start_episode",
            "id": 2,
            "episode_id": "ep-1",
            "training_enabled": False,
            "policy_id": "blue",
        }
    )
    assert req == StartEpisode(2, "ep-1", False, "blue")


def test_start_episode_defaults() -> None:
    assert parse_request(VALID["start_episode"]) == StartEpisode(2, None, True, DEFAULT_POLICY_ID)


def test_get_action_single() -> None:
    req = parse_request(_with("get_action", reward=2))
    assert isinstance(req, GetAction)
    assert req.episode_ids == ["e"]
    assert req.observations == [[0.0]]
    assert req.rewards == [2.0]
    assert isinstance(req.rewards[0], float)
    assert req.batched is False


def test_get_action_single_without_reward() -> None:
    req = parse_request(VALID["get_action"])
    assert isinstance(req, GetAction)
    assert req.rewards is None


def test_get_action_batched() -> None:
    obs = np.zeros((3, 2), np.float32)
    req = parse_request(
        {
            "type": "get_action",
            "id": 9,
            "episode_ids": ["a", "b", "c"],
            "observations": obs,
            "rewards": [1, 0.5, -2.0],
        }
    )
    assert isinstance(req, GetAction)
    assert req.id == 9
    assert req.episode_ids == ["a", "b", "c"]
    assert req.observations is obs
    assert req.rewards == [1.0, 0.5, -2.0]
    assert req.batched is True


def test_get_action_batched_rewards_as_array() -> None:
    req = parse_request(
        {
            "type": "get_action",
            "episode_ids": ["a", "b"],
            "observations": [[0], [1]],
            "rewards": np.array([0.5, 1.5], np.float32),
        }
    )
    assert isinstance(req, GetAction)
    assert req.rewards == [0.5, 1.5]


def test_get_action_batched_through_the_codec() -> None:
    raw = decode(
        encode(
            {
                "type": "get_action",
                "id": 1,
                "episode_ids": ["a", "b"],
                "observations": np.ones((2, 4), np.float32),
                "rewards": np.array([0.0, 1.0], np.float64),
            }
        )
    )
    req = parse_request(raw)
    assert isinstance(req, GetAction)
    assert req.rewards == [0.0, 1.0]
    np.testing.assert_array_equal(req.observations, np.ones((2, 4), np.float32))


def test_log_action() -> None:
    req = parse_request(_with("log_action", reward=-1.5))
    assert req == LogAction(4, "e", [0.0], 1, -1.5)


def test_log_action_null_observation_and_action_are_present() -> None:
    # Presence is what is checked here; the space check comes later.
    req = parse_request(_with("log_action", observation=None, action=None))
    assert isinstance(req, LogAction)
    assert req.observation is None
    assert req.action is None


def test_log_returns() -> None:
    req = parse_request(_with("log_returns", reward=3, info={"k": 1}))
    assert req == LogReturns(5, "e", 3.0, {"k": 1})


def test_end_episode() -> None:
    req = parse_request(_with("end_episode", truncated=True, reward=0.25))
    assert req == EndEpisode(6, "e", [0.0], True, 0.25)
    assert parse_request(VALID["end_episode"]) == EndEpisode(6, "e", [0.0], False, None)


def test_ping() -> None:
    assert parse_request(VALID["ping"]) == Ping(7)


def test_id_defaults_to_zero() -> None:
    assert parse_request({"type": "ping"}) == Ping(0)


# -- nil is absent ---------------------------------------------------------------------------

BATCHED = {"type": "get_action", "id": 3, "episode_ids": ["a", "b"], "observations": [[0], [1]]}

OPTIONAL_FIELDS: list[tuple[dict[str, Any], str]] = [
    *((VALID[kind], "id") for kind in REQUEST_TYPES),
    *(
        (VALID["hello"], name)
        for name in ("client_name", "token", "inference_mode", "client_id", "map_agents")
    ),
    *((VALID["start_episode"], name) for name in ("episode_id", "training_enabled", "policy_id")),
    *(
        (VALID["get_action"], name)
        for name in ("reward", "seq", "episode_ids", "observations", "rewards", "seqs")
    ),
    *((BATCHED, name) for name in ("rewards", "seqs", "episode_id", "observation")),
    *((VALID["log_action"], name) for name in ("reward", "seq")),
    *((VALID["log_returns"], name) for name in ("info", "seq")),
    *((VALID["end_episode"], name) for name in ("truncated", "reward", "seq")),
    *((VALID["get_weights"], name) for name in ("policy_id", "have_version")),
    *((VALID["report_samples"], name) for name in ("policy_id", "episodes")),
]
"""Every optional field of every request (section 7), with a valid message to put it in."""


@pytest.mark.parametrize(
    ("raw", "name"), OPTIONAL_FIELDS, ids=[f"{raw['type']}.{name}" for raw, name in OPTIONAL_FIELDS]
)
def test_nil_is_the_same_as_absent(raw: dict[str, Any], name: str) -> None:
    """Section 3.2: C# and C++ serialisers write nil for unset members."""
    absent = {k: v for k, v in raw.items() if k != name}
    assert parse_request({**raw, name: None}) == parse_request(absent)


def test_nil_everywhere_at_once() -> None:
    raw = {"type": "hello", "protocol_version": 1}
    nils = {"id": None, "client_name": None, "token": None, "inference_mode": None}
    assert parse_request({**raw, **nils, "client_id": None}) == Hello(0, 1)


@pytest.mark.parametrize(
    ("kind", "name"),
    [("hello", "protocol_version"), ("log_returns", "reward"), ("get_action", "episode_id")],
)
def test_a_required_field_sent_as_nil_is_missing(kind: str, name: str) -> None:
    with pytest.raises(DecodeError, match=f"'{kind}' needs the field '{name}'"):
        parse_request(_with(kind, **{name: None}))


# -- missing fields --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "name"),
    [
        ("hello", "protocol_version"),
        ("get_action", "episode_id"),
        ("get_action", "observation"),
        ("log_action", "episode_id"),
        ("log_action", "observation"),
        ("log_action", "action"),
        ("log_returns", "episode_id"),
        ("log_returns", "reward"),
        ("end_episode", "episode_id"),
        ("end_episode", "observation"),
    ],
)
def test_missing_field(kind: str, name: str) -> None:
    with pytest.raises(DecodeError, match=f"'{kind}' needs the field '{name}'"):
        parse_request(_without(kind, name))


def test_batched_get_action_needs_observations() -> None:
    with pytest.raises(DecodeError, match="observations"):
        parse_request({"type": "get_action", "episode_ids": ["a"]})


@pytest.mark.parametrize("raw", [{}, {"id": 1}, {"type": None}, {"type": 3}], ids=str)
def test_missing_or_non_string_type(raw: dict[str, Any]) -> None:
    with pytest.raises(DecodeError, match="string 'type'"):
        parse_request(raw)


# -- wrong types -----------------------------------------------------------------------------


@pytest.mark.parametrize("value", [-1, 1.0, "1", True, [1], {"a": 1}], ids=repr)
def test_request_id_must_be_non_negative_int(value: Any) -> None:
    with pytest.raises(DecodeError, match="'id' must be a non-negative integer"):
        parse_request(_with("ping", id=value))


@pytest.mark.parametrize(
    ("kind", "name", "value", "expected"),
    [
        ("hello", "protocol_version", "1", "a non-negative integer"),
        ("hello", "protocol_version", True, "a non-negative integer"),
        ("hello", "client_name", 5, "a string"),
        ("hello", "token", 123, "a string"),
        ("hello", "inference_mode", 5, "a string"),
        ("start_episode", "episode_id", 5, "a string"),
        ("start_episode", "training_enabled", 1, "true or false"),
        ("start_episode", "training_enabled", "yes", "true or false"),
        ("start_episode", "policy_id", ["p"], "a string"),
        ("get_action", "episode_id", 1, "a string"),
        ("get_action", "reward", "1.0", "a number"),
        ("get_action", "reward", True, "a number"),
        ("log_action", "reward", [1.0], "a number"),
        ("log_returns", "reward", "x", "a number"),
        ("log_returns", "info", [1, 2], "a map"),
        ("log_returns", "episode_id", b"e", "a string"),
        ("end_episode", "truncated", 0, "true or false"),
        ("end_episode", "reward", {"r": 1}, "a number"),
    ],
)
def test_wrong_field_type(kind: str, name: str, value: Any, expected: str) -> None:
    with pytest.raises(DecodeError, match=f"field '{name}' must be {expected}"):
        parse_request(_with(kind, **{name: value}))


@pytest.mark.parametrize(
    ("value", "shown"), [(-5, "got int -5"), (1.5, "got float 1.5"), ("1", "got str")]
)
def test_a_wrong_number_is_shown_with_its_type(value: Any, shown: str) -> None:
    with pytest.raises(DecodeError, match=f"'id' must be a non-negative integer, {shown}$"):
        parse_request(_with("ping", id=value))
    with pytest.raises(DecodeError, match=r"got int -10{28}\.\.\. \(402 characters\)$"):
        parse_request(_with("ping", id=-(10**400)))  # a huge one is cut, with a mark


@pytest.mark.parametrize("ids", [[], "abc", ["a", 2], {"a": 1}], ids=repr)
def test_batched_episode_ids_must_be_non_empty_list_of_strings(ids: Any) -> None:
    with pytest.raises(DecodeError, match="episode_ids"):
        parse_request({"type": "get_action", "episode_ids": ids, "observations": []})


@pytest.mark.parametrize(
    "rewards",
    [[1.0], [1.0, 2.0, 3.0], "12", 1.0, [1.0, "2"], [True, 1.0], [[1.0], [2.0]]],
    ids=repr,
)
def test_batched_rewards_must_be_a_number_per_episode(rewards: Any) -> None:
    with pytest.raises(DecodeError, match="rewards"):
        parse_request(
            {
                "type": "get_action",
                "episode_ids": ["a", "b"],
                "observations": [[0], [1]],
                "rewards": rewards,
            }
        )


# -- limits ----------------------------------------------------------------------------------


def test_id_at_max_length_is_accepted() -> None:
    eid = "x" * DEFAULT_LIMITS.max_id_length
    req = parse_request(_with("log_returns", episode_id=eid))
    assert isinstance(req, LogReturns)
    assert req.episode_id == eid


@pytest.mark.parametrize(
    ("kind", "name"),
    [
        ("get_action", "episode_id"),
        ("log_action", "episode_id"),
        ("log_returns", "episode_id"),
        ("end_episode", "episode_id"),
        ("start_episode", "episode_id"),
        ("start_episode", "policy_id"),
        ("hello", "client_name"),
        ("hello", "inference_mode"),
    ],
)
def test_id_too_long(kind: str, name: str) -> None:
    too_long = "x" * (DEFAULT_LIMITS.max_id_length + 1)
    with pytest.raises(LimitExceededError, match=name):
        parse_request(_with(kind, **{name: too_long}))


def test_id_limit_is_configurable() -> None:
    limits = Limits(max_id_length=4)
    assert parse_request(_with("log_returns", episode_id="abcd"), limits)
    with pytest.raises(LimitExceededError, match="1 to 4 characters, got 5"):
        parse_request(_with("log_returns", episode_id="abcde"), limits)


def test_empty_episode_id_is_refused() -> None:
    with pytest.raises(LimitExceededError, match="got 0"):
        parse_request(_with("log_returns", episode_id=""))


def test_batched_id_too_long() -> None:
    raw = {
        "type": "get_action",
        "episode_ids": ["ok", "x" * (DEFAULT_LIMITS.max_id_length + 1)],
        "observations": [[0], [0]],
    }
    with pytest.raises(LimitExceededError):
        parse_request(raw)


def test_batch_over_max_batch_episodes() -> None:
    limits = Limits(max_batch_episodes=3)
    ok = {"type": "get_action", "episode_ids": ["a", "b", "c"], "observations": [0, 0, 0]}
    assert isinstance(parse_request(ok, limits), GetAction)
    too_many = {
        "type": "get_action",
        "episode_ids": ["a", "b", "c", "d"],
        "observations": [0, 0, 0, 0],
    }
    with pytest.raises(LimitExceededError, match="4 episodes; the limit is 3"):
        parse_request(too_many, limits)


def test_duplicate_episode_ids() -> None:
    raw = {"type": "get_action", "episode_ids": ["a", "b", "a"], "observations": [0, 0, 0]}
    with pytest.raises(DecodeError, match="more than once"):
        parse_request(raw)


# -- non-finite rewards ----------------------------------------------------------------------

NON_FINITE = [float("nan"), float("inf"), float("-inf")]


@pytest.mark.parametrize("value", NON_FINITE, ids=repr)
@pytest.mark.parametrize("kind", ["get_action", "log_action", "log_returns", "end_episode"])
def test_non_finite_reward(kind: str, value: float) -> None:
    with pytest.raises(DecodeError, match="must be finite"):
        parse_request(_with(kind, reward=value))


@pytest.mark.parametrize("value", NON_FINITE, ids=repr)
def test_non_finite_batched_reward(value: float) -> None:
    raw = {
        "type": "get_action",
        "episode_ids": ["a", "b"],
        "observations": [[0], [1]],
        "rewards": [0.0, value],
    }
    with pytest.raises(DecodeError, match="finite"):
        parse_request(raw)


@pytest.mark.parametrize("value", NON_FINITE, ids=repr)
def test_non_finite_batched_reward_array(value: float) -> None:
    raw = {
        "type": "get_action",
        "episode_ids": ["a", "b"],
        "observations": [[0], [1]],
        "rewards": np.array([value, 0.0]),
    }
    with pytest.raises(DecodeError, match="finite"):
        parse_request(raw)


def test_json_integer_too_large_for_a_float_is_a_decode_error() -> None:
    # JSON (the HTTP carrier) has unbounded integers; float() of 10**400 raises OverflowError.
    raw = json.loads('{"type": "log_returns", "episode_id": "e", "reward": 1' + "0" * 400 + "}")
    with pytest.raises(DecodeError):
        parse_request(raw)


# -- unknown type ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["welcome", "GET_ACTION", "", "action", "error"])
def test_unknown_type(kind: str) -> None:
    with pytest.raises(DecodeError, match=f"unknown message type '{kind}'") as info:
        parse_request({"type": kind, "id": 1})
    # The error lists the known types so the sender can fix it.
    assert "get_action" in str(info.value)


def test_every_parse_error_is_a_protocol_error() -> None:
    assert issubclass(DecodeError, ProtocolError)
    assert issubclass(LimitExceededError, ProtocolError)


def test_error_reply() -> None:
    assert ErrorReply(5, "episode_error", "no such episode").to_wire() == {
        "type": "error",
        "id": 5,
        "code": "episode_error",
        "message": "no such episode",
    }


def test_get_weights_defaults() -> None:
    req = parse_request({"type": "get_weights", "id": 1})
    assert req == GetWeights(1, "default", None)


def test_report_samples_needs_fragments_and_a_batch_id() -> None:
    with pytest.raises(DecodeError, match="batch_id"):
        parse_request({"type": "report_samples", "id": 1, "fragments": [{}]})
    with pytest.raises(DecodeError, match="fragments"):
        parse_request({"type": "report_samples", "id": 1, "batch_id": "b"})
    with pytest.raises(DecodeError, match="at least one fragment or episode summary"):
        parse_request({"type": "report_samples", "id": 1, "batch_id": "b", "fragments": []})
    summaries_only = parse_request(
        {
            "type": "report_samples",
            "id": 1,
            "batch_id": "b",
            "fragments": [],
            "episodes": [{"episode_id": "e", "return": 1.0, "length": 1}],
        }
    )
    assert isinstance(summaries_only, ReportSamples)
    with pytest.raises(DecodeError, match="list of maps"):
        parse_request({"type": "report_samples", "id": 1, "batch_id": "b", "fragments": [1]})
    req = parse_request(VALID["report_samples"])
    assert isinstance(req, ReportSamples)
    assert req.batch_id == "b1"
    assert req.episodes == []


def test_report_episodes_sent_as_an_array_is_a_decode_error() -> None:
    raw = {"type": "report_samples", "id": 1, "batch_id": "b", "fragments": [{}]}
    with pytest.raises(DecodeError, match="'episodes' must be a list of maps"):
        parse_request({**raw, "episodes": np.zeros(3)})
    assert parse_request({**raw, "episodes": None}).episodes == []  # type: ignore[union-attr]


@pytest.mark.parametrize("reward", [-1e39, 3e38, 2e9])
def test_rewards_outside_the_trained_range_are_bad_values(reward: float) -> None:
    with pytest.raises(SpaceError, match=r"reward .* is out of range.*float32"):
        parse_request({"type": "log_returns", "id": 1, "episode_id": "e", "reward": reward})
    with pytest.raises(SpaceError, match=r"get_action 'rewards'"):
        parse_request(
            {
                "type": "get_action",
                "id": 1,
                "episode_ids": ["e"],
                "observations": [[0.0]],
                "rewards": [reward],
            }
        )


def test_a_huge_integer_reward_is_refused_without_echoing_all_its_digits() -> None:
    with pytest.raises(DecodeError, match=r"is out of range, got 10{29}\.\.\. \(401 characters\)"):
        parse_request(_with("log_returns", reward=10**400))
    with pytest.raises(DecodeError, match=r"'seq' must be an integer .*got 10{29}\.\.\. \(401"):
        parse_request(_with("log_returns", reward=1.0, seq=10**400))
