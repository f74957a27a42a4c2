"""Round trips of the wire forms written once in ``protocol/``.

Every request record's ``to_wire`` parses back to the same record (through the codec, as it
travels), every reply record's ``from_wire`` reads back what ``to_wire`` wrote, and a fragment's
report form reads back as the fragment.
"""

from __future__ import annotations

from dataclasses import fields, is_dataclass, replace
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlserve.errors import DecodeError
from rlserve.protocol.codec import decode, encode
from rlserve.protocol.episode_requests import (
    DEFAULT_POLICY_ID,
    MAX_SEQ,
    EndEpisode,
    GetAction,
    LogAction,
    LogReturns,
    StartEpisode,
    get_action_wire,
)
from rlserve.protocol.fragment import Fragment, read_report, report_wire
from rlserve.protocol.limits import Limits
from rlserve.protocol.messages import REQUEST_TYPES, Request, parse_request
from rlserve.protocol.multi_agent_requests import MapAgents
from rlserve.protocol.replies import (
    EpisodeStarted,
    ErrorReply,
    SamplesAccepted,
    WeightsReply,
    Welcome,
    action_of,
    action_reply,
    actions_of,
    actions_reply,
)
from rlserve.protocol.session_requests import GetWeights, Hello, Ping, ReportSamples

ROUND_TRIPS = settings(
    deadline=None,
    max_examples=150,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)

request_ids = st.integers(0, 2**31)
ids = st.text("abcdefghij0123456789-_", min_size=1, max_size=12)
seqs = st.integers(1, MAX_SEQ)
rewards = st.floats(-1e9, 1e9, allow_nan=False)
infos = st.dictionaries(st.text(max_size=4), st.integers(-5, 5) | st.text(max_size=4), max_size=3)
observations = st.lists(st.floats(-10.0, 10.0, allow_nan=False), min_size=1, max_size=3)


def _unique_ids(min_size: int = 1) -> st.SearchStrategy[list[str]]:
    return st.lists(ids, min_size=min_size, max_size=4, unique=True)


def _per(count: int, values: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """None, or ``count`` of ``values``."""
    return st.none() | st.lists(values, min_size=count, max_size=count)


def _agent_rewards(count: int) -> st.SearchStrategy[np.ndarray | None]:
    listed = st.lists(rewards, min_size=count, max_size=count)
    return st.none() | listed.map(lambda r: np.asarray(r, dtype=np.float64))


@st.composite
def _get_actions(draw: st.DrawFn) -> GetAction:
    request_id, form = draw(request_ids), draw(st.sampled_from(["one", "batch", "agents"]))
    if form == "one":
        reward, seq, info = draw(st.none() | rewards), draw(st.none() | seqs), draw(infos)
        return GetAction(
            request_id,
            [draw(ids)],
            [draw(observations)],
            None if reward is None else [reward],
            seqs=None if seq is None else [seq],
            infos=None if not info else [info],
        )
    if form == "batch":
        episode_ids = draw(_unique_ids())
        n = len(episode_ids)
        return GetAction(
            request_id,
            episode_ids,
            draw(st.lists(observations, min_size=n, max_size=n)),
            draw(_per(n, rewards)),
            batched=True,
            seqs=draw(_per(n, seqs)),
            infos=draw(_per(n, st.none() | infos)),
        )
    agent_ids = draw(_unique_ids())
    n = len(agent_ids)
    seq = draw(st.none() | seqs)
    return GetAction(
        request_id,
        [draw(ids)],
        draw(st.lists(observations, min_size=n, max_size=n)),
        draw(_agent_rewards(n)),
        seqs=None if seq is None else [seq],
        infos=draw(_per(n, st.none() | infos)),
        agent_ids=agent_ids,
        policy_ids=draw(_per(n, st.none() | ids)),
    )


@st.composite
def _log_actions(draw: st.DrawFn) -> LogAction:
    if draw(st.booleans()):
        return LogAction(
            draw(request_ids),
            draw(ids),
            draw(observations),
            draw(st.integers(0, 5)),
            draw(st.none() | rewards),
            draw(st.none() | seqs),
            draw(st.none() | infos),
        )
    agent_ids = draw(_unique_ids())
    n = len(agent_ids)
    return LogAction(
        draw(request_ids),
        draw(ids),
        draw(st.lists(observations, min_size=n, max_size=n)),
        draw(st.lists(st.integers(0, 5), min_size=n, max_size=n)),
        seq=draw(st.none() | seqs),
        agent_ids=agent_ids,
        rewards=draw(_agent_rewards(n)),
        infos=draw(_per(n, st.none() | infos)),
        policy_ids=draw(_per(n, st.none() | ids)),
    )


@st.composite
def _log_returns(draw: st.DrawFn) -> LogReturns:
    if draw(st.booleans()):
        return LogReturns(
            draw(request_ids),
            draw(ids),
            draw(rewards),
            draw(st.none() | infos),
            draw(st.none() | seqs),
        )
    agent_ids = draw(_unique_ids(min_size=0))
    n = len(agent_ids)
    done = draw(st.dictionaries(ids, st.booleans(), min_size=0 if n else 1, max_size=3))
    return LogReturns(
        draw(request_ids),
        draw(ids),
        0.0,
        seq=draw(st.none() | seqs),
        agent_ids=agent_ids,
        rewards=np.asarray(draw(st.lists(rewards, min_size=n, max_size=n)), dtype=np.float64),
        infos=draw(_per(n, st.none() | infos)),
        done=done,
    )


@st.composite
def _end_episodes(draw: st.DrawFn) -> EndEpisode:
    if draw(st.booleans()):
        return EndEpisode(
            draw(request_ids),
            draw(ids),
            draw(observations),
            draw(st.booleans()),
            draw(st.none() | rewards),
            draw(st.none() | seqs),
            draw(st.none() | infos),
        )
    agent_ids = draw(_unique_ids(min_size=0))
    n = len(agent_ids)
    return EndEpisode(
        draw(request_ids),
        draw(ids),
        draw(st.lists(observations, min_size=n, max_size=n)),
        draw(st.booleans()),
        seq=draw(st.none() | seqs),
        agent_ids=agent_ids,
        rewards=draw(_agent_rewards(n)) if n else None,
        infos=draw(_per(n, st.none() | infos)) if n else None,
    )


_fragment_maps = st.lists(st.fixed_dictionaries({"episode_id": ids}), max_size=2)

REQUESTS: dict[str, st.SearchStrategy[Any]] = {
    "hello": st.builds(
        Hello,
        request_ids,
        st.integers(0, 5),
        st.text(max_size=10),
        st.none() | st.text(max_size=10),
        st.sampled_from(["remote", "local"]),
        st.none() | ids,
        st.booleans(),
    ),
    "start_episode": st.builds(
        StartEpisode, request_ids, st.none() | ids, st.booleans(), st.just(DEFAULT_POLICY_ID) | ids
    ),
    "get_action": _get_actions(),
    "log_action": _log_actions(),
    "log_returns": _log_returns(),
    "end_episode": _end_episodes(),
    "ping": st.builds(Ping, request_ids),
    "get_weights": st.builds(
        GetWeights, request_ids, st.just(DEFAULT_POLICY_ID) | ids, st.none() | st.integers(0, 99)
    ),
    "report_samples": st.builds(
        ReportSamples,
        request_ids,
        ids,
        ids,
        _fragment_maps,
        st.lists(st.fixed_dictionaries({"episode_id": ids, "return": rewards}), max_size=2),
    ).filter(lambda report: bool(report.fragments or report.episodes)),
    "map_agents": st.builds(MapAgents, request_ids, ids, _unique_ids()),
}


def _plain(value: Any) -> Any:
    """``value`` with records and arrays spelled out, to compare with ``==``."""
    if isinstance(value, np.ndarray):
        return ("ndarray", value.dtype.str, value.tolist())
    if is_dataclass(value):
        return (type(value).__name__, [_plain(getattr(value, f.name)) for f in fields(value)])
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def test_every_request_type_has_a_strategy() -> None:
    assert set(REQUESTS) == set(REQUEST_TYPES)


@pytest.mark.parametrize("kind", REQUEST_TYPES)
def test_a_request_parses_back_from_its_wire_form(kind: str) -> None:
    @ROUND_TRIPS
    @given(REQUESTS[kind])
    def round_trip(record: Request) -> None:
        wire = record.to_wire()
        assert wire["type"] == kind
        assert list(wire)[-1] == "id"  # a connection numbers a request by setting it in place
        assert _plain(parse_request(decode(encode(wire)))) == _plain(record)

    round_trip()


def test_the_one_episode_get_action_is_the_records_form() -> None:
    record = GetAction(7, ["e1"], [[0.5]], [1.0], seqs=[3], infos=[{"k": 1}])
    assert get_action_wire(7, "e1", [0.5], 3, 1.0, {"k": 1}) == record.to_wire()


def test_the_client_sends_its_fields_in_the_documented_order() -> None:
    assert list(get_action_wire(1, "e", [0.0], 2, 0.5, {})) == [
        "type",
        "episode_id",
        "observation",
        "seq",
        "reward",
        "info",
        "id",
    ]
    hello = Hello(0, 1).to_wire()
    assert hello["token"] is None and hello["client_id"] is None  # sent as nil


# -- replies ---------------------------------------------------------------------------------


def test_a_welcome_reads_back_what_it_wrote() -> None:
    welcome = Welcome(
        1,
        "0.1.0",
        {"default": {"observation_space": {"type": "Discrete", "n": 2}, "action_space": {}}},
        [["a*", "default"]],
        True,
        ["remote", "local"],
        "abc",
        Limits(max_frame_bytes=1024),
    )
    assert Welcome.from_wire(decode(encode(welcome.to_wire()))) == welcome
    told = replace(welcome, map_agents=True)
    assert Welcome.from_wire(decode(encode(told.to_wire()))) == told


def test_a_welcome_ignores_limits_it_does_not_know() -> None:
    wire = Welcome(1, "v", {}, None, False, [], None, Limits()).to_wire()
    wire["limits"] = {"max_id_length": 9, "max_new_thing": 3}
    assert Welcome.from_wire(wire).limits == Limits(max_id_length=9)


@pytest.mark.parametrize(
    "reply",
    [
        EpisodeStarted(3, "e1"),
        WeightsReply(4, "default", 2, unchanged=True),
        WeightsReply(4, "default", 2, False, {"obs_dim": 3}, {"w": np.zeros(2, np.float32)}),
        SamplesAccepted(5, "b1", 10, duplicate=True),
        SamplesAccepted(5, "b1", 10, False, dropped_steps=0, weights_version=3),
    ],
)
def test_a_reply_reads_back_what_it_wrote(reply: Any) -> None:
    assert _plain(type(reply).from_wire(decode(encode(reply.to_wire())))) == _plain(reply)


def test_a_reply_of_another_type_is_refused() -> None:
    with pytest.raises(DecodeError, match="expected a 'weights' reply, got 'error'"):
        WeightsReply.from_wire(ErrorReply(1, "episode_error", "no").to_wire())


def test_an_error_reply_is_told_apart_from_others() -> None:
    error = ErrorReply(None, "capacity", "full")
    assert ErrorReply.of(decode(encode(error.to_wire()))) == error
    assert ErrorReply.of(EpisodeStarted(1, "e").to_wire()) is None


def test_action_replies() -> None:
    assert action_of(action_reply(2, 1)) == 1
    assert actions_of(actions_reply(2, [0, 1])) == [0, 1]
    assert list(action_reply(2, 1)) == ["type", "id", "action"]


# -- the fragment's report form --------------------------------------------------------------


def _fragment(steps: int, infos: list[dict[str, Any] | None] | None) -> Fragment:
    return Fragment(
        "e1",
        "agent0",
        "default",
        np.arange((steps + 1) * 2, dtype=np.float32).reshape(steps + 1, 2),
        np.arange(steps, dtype=np.int64),
        np.ones(steps, np.float32),
        np.full(steps, -0.5, np.float32),
        np.ones(steps, bool),
        np.zeros(steps, np.int64),
        terminated=False,
        truncated=True,
        infos=infos,
    )


@pytest.mark.parametrize("infos", [None, [{"k": 1}, None, {}]])
def test_a_reported_fragment_reads_back_as_the_fragment(
    infos: list[dict[str, Any] | None] | None,
) -> None:
    fragment = _fragment(3, infos)
    wire = report_wire(fragment)
    assert "agent_id" not in wire and "policy_id" not in wire  # the report names the policy
    read = read_report(decode(encode(wire)), Limits(), "r")
    assert read.steps == 3 and read.episode_id == "e1"
    for name in ("obs", "actions", "rewards", "behaviour_logp", "policy_chosen"):
        assert _plain(getattr(read, name)) == _plain(getattr(fragment, name))
    assert (read.terminated, read.truncated, read.infos) == (False, True, infos)
