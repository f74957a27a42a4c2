"""Multi-agent calls through the service: replies and errors as the wire sees them."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from rlserve.protocol.limits import Limits
from rlserve.protocol.messages import parse_request
from rlserve.server.service import Service, Session
from rlserve.server.stats import ServerStats
from service_fakes import RecordingSink


def _service() -> tuple[Service, RecordingSink]:
    sink = RecordingSink()
    space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    service = Service(
        {"default": (space, gym.spaces.Discrete(2))}, Limits(), None, 8, sink, ServerStats()
    )
    return service, sink


def _call(service: Service, session: Session, **message: Any) -> dict[str, Any]:
    replies: list[dict[str, Any]] = []
    service.handle(parse_request(message), session, replies.append)
    assert len(replies) == 1
    return replies[0]


def test_a_zero_reward_or_an_info_for_an_agent_that_has_not_acted_is_accepted() -> None:
    """It has no step to belong to: nothing changes for it, and the other agents' rewards count
    once (it used to fail with an internal KeyError after applying the rewards before it)."""
    service, sink = _service()
    session = Session(authenticated=True)
    obs = [[0.0, 0.0]]
    started = _call(service, session, type="start_episode", episode_id="e")
    assert started["type"] == "episode_started"
    logged = _call(
        service,
        session,
        type="log_action",
        episode_id="e",
        agent_ids=["a"],
        observations=obs,
        actions=[1],
    )
    assert logged == {"type": "ok", "id": 0}
    for names, rewards, infos in (
        (["a", "newcomer"], [1.0, 0.0], None),
        (["newcomer"], [0.0], [{"k": 1}]),
    ):
        reply = _call(
            service,
            session,
            type="log_returns",
            episode_id="e",
            agent_ids=names,
            rewards=rewards,
            infos=infos,
        )
        assert reply == {"type": "ok", "id": 0}
    # The newcomer may still join later, and the episode ends normally.
    ended = _call(
        service,
        session,
        type="end_episode",
        episode_id="e",
        agent_ids=["a", "newcomer"],
        observations=[[0.5, 0.5], [0.5, 0.5]],
    )
    assert ended == {"type": "ok", "id": 0}
    assert [(f.agent_id, f.rewards.tolist()) for f in sink.fragments] == [("a", [1.0])]
