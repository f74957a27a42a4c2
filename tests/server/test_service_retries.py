"""A re-sent numbered call gets its own first reply, also while a later call without ``seq`` of
the same episode waits for its action (``docs/protocol.md`` sections 9.6 and 9.9).

Over HTTP, or from two connections of one identity, the retry can arrive while that later call
is pending; it used to join the pending call and be answered with the later call's action.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from rlserve.policy import ModelSpec
from rlserve.policy.weights import WeightsPackage
from rlserve.protocol.limits import Limits
from rlserve.protocol.messages import parse_request
from rlserve.server.service import Service, Session
from rlserve.server.stats import ServerStats
from service_fakes import NoLoop, RecordingSink


def _service() -> Service:
    obs = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    service = Service(
        {"default": (obs, gym.spaces.Discrete(2))},
        Limits(),
        None,
        100,
        RecordingSink(),
        ServerStats(),
    )
    spec = ModelSpec(3, ("l0",), "tanh", "categorical", 2)
    arrays = {"l0.weight": np.zeros((2, 3), np.float32), "l0.bias": np.zeros(2, np.float32)}
    service._loop = NoLoop()  # type: ignore[assignment]
    service.set_weights("default", WeightsPackage(0, spec, arrays))
    return service


def _plain(reply: dict[str, Any]) -> dict[str, Any]:
    return {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in reply.items()}


OBS = [0.1, 0.2, 0.3]
CALLS: dict[str, dict[str, Any]] = {
    "single": {"type": "get_action", "episode_id": "e", "observation": OBS},
    "multi-agent": {
        "type": "get_action",
        "episode_id": "e",
        "agent_ids": ["a", "b"],
        "observations": [OBS, OBS],
    },
}


@pytest.mark.parametrize("form", sorted(CALLS))
def test_a_retry_while_a_later_unnumbered_call_waits_gets_its_first_reply(form: str) -> None:
    service, session = _service(), Session(authenticated=True)
    replies: dict[int, list[dict[str, Any]]] = {}

    def send(request_id: int, **fields: Any) -> bool:
        message = {**CALLS[form], "id": request_id, **fields}
        answer = replies.setdefault(request_id, []).append
        return service.handle(parse_request(message), session, answer)

    start = parse_request({"type": "start_episode", "episode_id": "e"})
    service.handle(start, session, replies.setdefault(0, []).append)
    assert send(1, seq=1)
    service.flush()
    [first] = replies[1]
    assert first["type"] == "action"
    assert send(2)  # no seq: waits for the next flush
    assert not send(3, seq=1)  # the retry is answered at once, from what seq 1 answered
    assert [_plain({**r, "id": 1}) for r in replies[3]] == [_plain(first)]
    service.flush()
    assert [r["type"] for r in replies[2]] == ["action"] and len(replies[3]) == 1
