"""The service with a policy with memory: multi-agent episodes and reported ``state_in``.

The real :class:`Service` (its flush run by the test): each agent of a remote multi-agent
episode carries its own state (logged steps advance it), and a local client's report whose
``state_in`` does not fit the policy is refused with the fix while the server carries on.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from typing import Any

import gymnasium as gym
import numpy as np

from memory_policies import memory_package, memory_policy, replay
from rlserve.protocol.fragment import Fragment
from rlserve.protocol.limits import Limits
from rlserve.protocol.messages import parse_request
from rlserve.server.service import Service, Session
from rlserve.server.stats import ServerStats
from service_fakes import NoLoop, RecordingSink

OBS = gym.spaces.Box(-2.0, 2.0, (4,), np.float32)


def _service(sink: RecordingSink) -> Service:
    service = Service(
        {"default": (OBS, gym.spaces.Discrete(2))}, Limits(), None, 3, sink, ServerStats()
    )
    service._loop = NoLoop()  # type: ignore[assignment]  # the test flushes
    service.set_weights("default", memory_package())
    return service


def _call(service: Service, session: Session, **message: Any) -> dict[str, Any]:
    replies: list[dict[str, Any]] = []
    service.handle(parse_request({"id": 1, **message}), session, replies.append)
    service.flush()
    (reply,) = replies
    assert reply.get("type") != "error", reply
    return reply


def test_each_agent_of_a_remote_multi_agent_episode_has_its_own_state() -> None:
    sink = RecordingSink()
    service, session = _service(sink), Session(authenticated=True)
    rng = np.random.default_rng(5)
    obs = rng.uniform(-2, 2, (9, 2, 4)).astype(np.float32)
    _call(service, session, type="start_episode", episode_id="m")
    for t in range(8):
        step = {"episode_id": "m", "agent_ids": ["p", "q"], "observations": obs[t].tolist()}
        if t == 4:
            _call(service, session, type="log_action", actions=[0, 1], **step)
        else:
            _call(service, session, type="get_action", **step)
        _call(
            service,
            session,
            type="log_returns",
            episode_id="m",
            agent_ids=["p", "q"],
            rewards=[1, 0],
        )
    _call(
        service,
        session,
        type="end_episode",
        episode_id="m",
        agent_ids=["p", "q"],
        observations=obs[8].tolist(),
        truncated=True,
    )
    chains: dict[str, list[Fragment]] = defaultdict(list)
    for fragment in sink.fragments:
        chains[fragment.agent_id].append(fragment)
    assert sorted(chains) == ["p", "q"] and all(len(c) == 3 for c in chains.values())
    policy = memory_policy()
    for chain in chains.values():
        assert chain[0].state_in is not None and not chain[0].state_in.any()
        for before, after in itertools.pairwise(chain):
            assert after.state_in is not None
            np.testing.assert_allclose(replay(policy, before), after.state_in, atol=1e-5)
    # The agents saw different observations: their states differ.
    assert not np.allclose(chains["p"][1].state_in, chains["q"][1].state_in)  # type: ignore[arg-type]


def _report(state_in: Any) -> dict[str, Any]:
    fragment: dict[str, Any] = {
        "episode_id": "local-1",
        "obs": np.zeros((3, 4), np.float32),
        "actions": np.zeros(2, np.int64),
        "rewards": np.ones(2, np.float32),
        "behaviour_logp": np.full(2, -0.5, np.float32),
        "policy_chosen": np.ones(2, bool),
        "weights_version": np.ones(2, np.int64),
        "terminated": True,
        "truncated": False,
    }
    if state_in is not None:
        fragment["state_in"] = state_in
    return {
        "type": "report_samples",
        "id": 7,
        "batch_id": f"b{id(state_in)}",
        "fragments": [fragment],
    }


def test_a_report_whose_state_in_does_not_fit_is_refused_and_the_server_carries_on() -> None:
    sink = RecordingSink()
    service, session = _service(sink), Session(authenticated=True)
    for bad, message in [
        (np.zeros(4, np.float32), "'state_in' has 4 values; policy 'default' has a recurrent"),
        (None, "has memory (a recurrent state of 6 values) but the fragment has no 'state_in'"),
    ]:
        replies: list[dict[str, Any]] = []
        service.handle(parse_request(_report(bad)), session, replies.append)
        (reply,) = replies
        assert reply["type"] == "error" and message in reply["message"]
        assert "\n" not in reply["message"]
    assert sink.fragments == []
    replies = []
    service.handle(parse_request(_report(np.full(6, 0.25, np.float32))), session, replies.append)
    assert replies[0]["type"] == "samples_accepted", replies
    (fragment,) = sink.fragments
    np.testing.assert_array_equal(fragment.state_in, np.full(6, 0.25, np.float32))


def test_steps_logged_before_the_first_weights_leave_the_state_as_it_was() -> None:
    sink = RecordingSink()
    service = Service(
        {"default": (OBS, gym.spaces.Discrete(2))}, Limits(), None, 3, sink, ServerStats()
    )
    service._loop = NoLoop()  # type: ignore[assignment]
    session = Session(authenticated=True)
    obs = np.random.default_rng(6).uniform(-2, 2, (5, 4)).astype(np.float32)
    _call(service, session, type="start_episode", episode_id="e")
    for t in range(2):  # no weights yet: nothing can run the LSTM
        _call(
            service,
            session,
            type="log_action",
            episode_id="e",
            observation=obs[t].tolist(),
            action=1,
        )
    service.set_weights("default", memory_package())
    for t in range(2, 4):
        _call(service, session, type="get_action", episode_id="e", observation=obs[t].tolist())
    _call(service, session, type="end_episode", episode_id="e", observation=obs[4].tolist())
    first, second = sink.fragments
    assert len(first) == 3 and first.state_in is not None and not first.state_in.any()
    _, after = memory_policy().recurrent_forward(obs[2:3], np.zeros((1, 6), np.float32))
    assert second.state_in is not None
    np.testing.assert_allclose(second.state_in, after[0], atol=1e-6)
