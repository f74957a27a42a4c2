"""Per-agent rewards through a real PolicyClient and Service, connected in-process.

Rewards logged several times before an action, rewards of agents that skip a tick, zero rewards
and rewards of agents left out of ``end_episode`` must each reach the step they belong to, in both
inference modes.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest

import rlserve.client.policy_client as policy_client
from rlserve.policy import ModelSpec
from rlserve.policy.weights import WeightsPackage
from rlserve.protocol.codec import decode, encode
from rlserve.protocol.limits import Limits
from rlserve.protocol.messages import parse_request
from rlserve.protocol.replies import Welcome
from rlserve.protocol.session_requests import Hello
from rlserve.server.service import Service, Session
from rlserve.server.stats import ServerStats
from service_fakes import NoLoop, RecordingSink


def _service(sink: RecordingSink) -> Service:
    obs = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    service = Service(
        {"default": (obs, gym.spaces.Discrete(2))}, Limits(), None, 100, sink, ServerStats()
    )
    spec = ModelSpec(3, ("l0",), "tanh", "categorical", 2)
    arrays = {"l0.weight": np.zeros((2, 3), np.float32), "l0.bias": np.zeros(2, np.float32)}
    service._loop = NoLoop()  # type: ignore[assignment]  # flushed by the bridge below
    service.set_weights("default", WeightsPackage(0, spec, arrays))
    return service


def _bridge(service: Service) -> type:
    class Bridge:
        """A Connection answered by ``service`` in this process (through the codec)."""

        def __init__(self, *args: Any) -> None:
            self.session = Session()
            self.limits = Limits()
            self.refused: list[dict[str, Any]] = []
            self.unanswered = 0
            self.reconnects = 0
            self.mode = args[3]
            self.client_id = args[6]
            self.welcome: Welcome | None = None

        def open(self) -> Welcome:
            hello = Hello(1, 1, inference_mode=self.mode, client_id=self.client_id)
            self.welcome = Welcome.from_wire(self.request(hello.to_wire()))
            return self.welcome

        def request(self, message: dict[str, Any], raise_deferred: bool = True) -> dict[str, Any]:
            replies: list[dict[str, Any]] = []
            request = parse_request(decode(encode({"id": 1, **message})))
            service.handle(request, self.session, replies.append)
            if service._flush_scheduled:
                service.flush()
            reply = decode(encode(replies[0]))
            assert reply["type"] != "error", reply
            return reply

        def send_nowait(self, message: dict[str, Any], settle: bool = True) -> None:
            self.request(message)

        def take_unanswered(self) -> list[Any]:
            return []

        def close(self) -> None:
            pass

        def abort(self) -> None:
            pass

    return Bridge


@pytest.mark.parametrize("mode", ["remote", "local"])
def test_each_reward_reaches_the_step_it_belongs_to(
    mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sink = RecordingSink()
    service = _service(sink)
    monkeypatch.setattr(policy_client, "Connection", _bridge(service))
    client = policy_client.PolicyClient(
        "in-process:1", inference_mode=mode, multiagent=True, update_interval=None
    )
    obs = {a: np.full(3, i / 10, np.float32) for i, a in enumerate("abc")}
    eid = client.start_episode("ep")
    client.get_action(eid, obs)
    client.log_returns(eid, {"a": 1.0, "b": 0.0, "c": 2.0})
    client.log_returns(eid, {"a": 0.5})
    client.get_action(eid, {"a": obs["a"], "b": obs["b"]})  # c skips this tick
    client.log_returns(eid, {"c": 1.0})
    client.get_action(eid, obs)
    client.log_returns(eid, {"a": 1.0, "b": 1.0, "c": 1.0})
    client.end_episode(eid, {"a": obs["a"]})  # b and c end without a final observation
    if client.local is not None:
        assert client.local.flush(10.0)
    client.close()
    # (Reported fragments do not name their agent: compare the agents' rewards as a set.)
    rewards = sorted(f.rewards.tolist() for f in sink.fragments)
    assert rewards == [[0.0, 0.0, 1.0], [1.5, 0.0, 1.0], [3.0, 1.0]]
    assert all(f.terminated for f in sink.fragments)
    if mode == "remote":
        assert service.stats.returns[-1] == 7.5
