"""A bug while handling one request costs one error reply, never the connection or the server."""

from __future__ import annotations

import io
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from rlserve.protocol.limits import Limits
from rlserve.protocol.messages import GetAction, Ping, StartEpisode
from rlserve.server import replies as replies_module
from rlserve.server.replies import INTERNAL_ERROR
from rlserve.server.service import Service, Session
from rlserve.server.stats import ServerStats
from rlserve.server.throttled_log import ThrottledLog
from service_fakes import RecordingSink


def test_an_unexpected_exception_becomes_an_internal_error_reply_logged_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stream = io.StringIO()
    monkeypatch.setattr(replies_module, "SERVER_LOG", ThrottledLog(60.0, stream))
    space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    service = Service(
        {"default": (space, gym.spaces.Discrete(2))},
        Limits(),
        None,
        8,
        RecordingSink(),
        ServerStats(),
    )

    def broken(request: Any, session: Any) -> dict[str, Any]:
        raise RuntimeError("boom")

    monkeypatch.setattr(service, "_simple", broken)
    replies: list[dict[str, Any]] = []
    session = Session(authenticated=True)
    for i in range(3):
        assert service.handle(Ping(i), session, replies.append) is False
    assert [(r["type"], r["id"], r["code"]) for r in replies] == [
        ("error", i, INTERNAL_ERROR) for i in range(3)
    ]
    assert "RuntimeError: boom" in replies[0]["message"]
    assert stream.getvalue().count("\n") == 1, stream.getvalue()
    assert "Traceback" not in stream.getvalue()
    assert service.stats.errors[INTERNAL_ERROR] == 3


def test_a_failing_forward_pass_answers_every_waiting_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stream = io.StringIO()
    monkeypatch.setattr(replies_module, "SERVER_LOG", ThrottledLog(60.0, stream))
    space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    service = Service(
        {"default": (space, gym.spaces.Discrete(2))},
        Limits(),
        None,
        8,
        RecordingSink(),
        ServerStats(),
    )
    session = Session(authenticated=True)
    replies: list[dict[str, Any]] = []
    for i, eid in enumerate(("a", "b")):
        service.handle(StartEpisode(10 + i, eid), session, replies.append)
        deferred = service.handle(
            GetAction(i, [eid], np.zeros((1, 2), np.float32)), session, replies.append
        )
        assert deferred

    class BrokenPolicy:
        def compute_actions(self, obs: Any) -> Any:
            raise FloatingPointError("bad weights")

    slot = service.slots["default"]
    slot.policy = BrokenPolicy()  # type: ignore[assignment]
    service.flush()
    errors = [r for r in replies if r["type"] == "error"]
    assert [(r["id"], r["code"]) for r in errors] == [(0, INTERNAL_ERROR), (1, INTERNAL_ERROR)]
    assert "start new ones" in errors[0]["message"]
    assert stream.getvalue().count("\n") == 1, stream.getvalue()
