"""Limits the service checks across calls: the merged info of one step, the agents of a client."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from rlserve.protocol.limits import Limits
from rlserve.protocol.messages import parse_request
from rlserve.server.service import Service, Session
from rlserve.server.stats import ServerStats
from service_fakes import RecordingSink

SPACE = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)


def _service(limits: Limits) -> tuple[Service, RecordingSink]:
    sink = RecordingSink()
    policies = {"default": (SPACE, gym.spaces.Discrete(2))}
    return Service(policies, limits, None, 8, sink, ServerStats()), sink


def _call(service: Service, session: Session, **message: Any) -> dict[str, Any]:
    replies: list[dict[str, Any]] = []
    service.handle(parse_request(message, service.limits), session, replies.append)
    assert len(replies) == 1
    return replies[0]


def _ok(reply: dict[str, Any]) -> None:
    assert reply["type"] in ("ok", "episode_started"), reply


# -- max_info_bytes: the infos logged for one step, merged ------------------------------------

INFO_LIMITS = Limits(max_info_bytes=1000)
BIG_A = {"a": "x" * 600}
BIG_B = {"b": "y" * 600}  # each fits on its own; merged they are about 1210 bytes


def test_log_returns_whose_info_would_take_the_step_over_max_info_bytes_is_refused() -> None:
    service, sink = _service(INFO_LIMITS)
    session = Session(authenticated=True)
    _ok(_call(service, session, type="start_episode", episode_id="e"))
    _ok(_call(service, session, type="log_action", episode_id="e", observation=[0, 0], action=1))
    _ok(_call(service, session, type="log_returns", episode_id="e", reward=1.0, info=BIG_A))
    refused = _call(service, session, type="log_returns", episode_id="e", reward=5.0, info=BIG_B)
    assert refused["code"] == "limit_exceeded"
    assert "log_returns for episode 'e'" in refused["message"]
    assert "the limit is 1000 (max_info_bytes)" in refused["message"]
    assert "log less per step" in refused["message"]
    # Nothing of the refused call was kept (its reward neither); a smaller info still merges.
    _ok(_call(service, session, type="log_returns", episode_id="e", reward=1.0, info={"c": 1}))
    _ok(_call(service, session, type="end_episode", episode_id="e", observation=[0, 0]))
    (fragment,) = sink.fragments
    assert fragment.rewards.tolist() == [2.0]
    assert fragment.infos == [{**BIG_A, "c": 1}]


def test_the_info_of_get_action_and_end_episode_counts_in_the_merge_too() -> None:
    service, _ = _service(INFO_LIMITS)
    session = Session(authenticated=True)
    _ok(_call(service, session, type="start_episode", episode_id="e"))
    _ok(_call(service, session, type="log_action", episode_id="e", observation=[0, 0], action=1))
    _ok(_call(service, session, type="log_returns", episode_id="e", reward=1.0, info=BIG_A))
    for kind, fields in (
        ("get_action", {"observation": [0, 0]}),
        ("log_action", {"observation": [0, 0], "action": 0}),
        ("end_episode", {"observation": [0, 0]}),
    ):
        refused = _call(service, session, type=kind, episode_id="e", info=BIG_B, **fields)
        assert refused["code"] == "limit_exceeded", refused
        assert f"{kind} for episode 'e'" in refused["message"]


def test_a_batched_get_action_with_one_info_too_many_changes_no_episode() -> None:
    service, _ = _service(INFO_LIMITS)
    session = Session(authenticated=True)
    for eid in ("a", "b"):
        _ok(_call(service, session, type="start_episode", episode_id=eid))
        _ok(
            _call(service, session, type="log_action", episode_id=eid, observation=[0, 0], action=1)
        )
    _ok(_call(service, session, type="log_returns", episode_id="b", reward=0.0, info=BIG_A))
    refused = _call(
        service,
        session,
        type="get_action",
        episode_ids=["a", "b"],
        observations=[[0, 0], [0, 0]],
        infos=[{"k": 1}, BIG_B],
    )
    assert refused["code"] == "limit_exceeded"
    assert "episode 'b'" in refused["message"]
    # Episode 'a' did not record the observation (it would be awaiting its action).
    _ok(_call(service, session, type="log_returns", episode_id="a", reward=1.0))


def test_a_multi_agent_info_merge_over_max_info_bytes_is_refused_and_changes_nothing() -> None:
    service, sink = _service(INFO_LIMITS)
    session = Session(authenticated=True)
    _ok(_call(service, session, type="start_episode", episode_id="e"))
    agents = {"agent_ids": ["p", "q"]}
    obs = [[0, 0], [0, 0]]
    _ok(
        _call(
            service,
            session,
            type="log_action",
            episode_id="e",
            observations=obs,
            actions=[1, 0],
            **agents,
        )
    )
    _ok(
        _call(
            service,
            session,
            type="log_returns",
            episode_id="e",
            rewards=[0.0, 0.0],
            infos=[None, BIG_A],
            **agents,
        )
    )
    for kind, fields in (
        ("log_returns", {"rewards": [3.0, 4.0]}),
        ("log_action", {"observations": obs, "actions": [0, 0]}),
        ("end_episode", {"observations": obs}),
    ):
        refused = _call(
            service, session, type=kind, episode_id="e", infos=[{"k": 1}, BIG_B], **fields, **agents
        )
        assert refused["code"] == "limit_exceeded", refused
        assert f"{kind} for episode 'e', agent 'q'" in refused["message"]
        assert "(max_info_bytes)" in refused["message"]
    _ok(_call(service, session, type="end_episode", episode_id="e", observations=obs, **agents))
    assert {f.agent_id: (f.rewards.tolist(), f.infos) for f in sink.fragments} == {
        "p": ([0.0], None),
        "q": ([0.0], [BIG_A]),
    }


# -- max_agents_per_client / max_agents_per_server: agents across episodes ---------------------

AGENT_LIMITS = Limits(max_agents_per_client=10, max_agents_per_server=25)


def _agents(service: Service, session: Session, episode_id: str, names: list[str]) -> Any:
    return _call(
        service,
        session,
        type="log_action",
        episode_id=episode_id,
        agent_ids=names,
        observations=[[0, 0]] * len(names),
        actions=[0] * len(names),
    )


def _names(prefix: str, count: int) -> list[str]:
    return [f"{prefix}{i}" for i in range(count)]


def test_a_client_cannot_hold_more_agents_than_max_agents_per_client_across_its_episodes() -> None:
    service, _ = _service(AGENT_LIMITS)
    session = Session(authenticated=True)
    for eid in ("e1", "e2"):
        _ok(_call(service, session, type="start_episode", episode_id=eid))
    _ok(_agents(service, session, "e1", _names("a", 6)))
    refused = _agents(service, session, "e2", _names("b", 5))
    assert refused["code"] == "capacity"
    assert refused["message"] == (
        "this client's open episodes would hold 11 agents; the limit is 10 "
        "(max_agents_per_client): end episodes, or reuse agent ids in an episode instead of "
        "bringing in new ones"
    )
    # Nothing was counted for the refused call; agents already held may go on acting.
    _ok(_agents(service, session, "e2", _names("b", 4)))
    _ok(_agents(service, session, "e1", _names("a", 6)))
    assert _agents(service, session, "e1", ["new"])["code"] == "capacity"
    # Ending an episode frees its agents (done ones included).
    _ok(_call(service, session, type="end_episode", episode_id="e1", agent_ids=[], observations=[]))
    _ok(_agents(service, session, "e2", _names("c", 6)))
    assert service.episodes.agent_counts.held(session.key) == 10


def test_an_expired_episode_frees_its_agents_too() -> None:
    service, _ = _service(AGENT_LIMITS)
    session = Session(authenticated=True)
    _ok(_call(service, session, type="start_episode", episode_id="e1"))
    _ok(_agents(service, session, "e1", _names("a", 10)))
    service.episodes.expire_idle(-1.0)
    _ok(_call(service, session, type="start_episode", episode_id="e2"))
    _ok(_agents(service, session, "e2", _names("b", 10)))


def test_the_server_holds_at_most_max_agents_per_server_in_all() -> None:
    service, _ = _service(AGENT_LIMITS)
    sessions = [Session(authenticated=True) for _ in range(3)]
    for i, session in enumerate(sessions):
        _ok(_call(service, session, type="start_episode", episode_id=f"e{i}"))
    _ok(_agents(service, sessions[0], "e0", _names("a", 10)))
    _ok(_agents(service, sessions[1], "e1", _names("a", 10)))
    refused = _agents(service, sessions[2], "e2", _names("a", 6))
    assert refused["code"] == "capacity"
    assert "would hold 26 agents; the limit is 25 (max_agents_per_server)" in refused["message"]
    _ok(_agents(service, sessions[2], "e2", _names("a", 5)))
    assert service.episodes.agent_counts.total == 25
