"""Multi-agent episodes end to end: dicts keyed by agent id, in both inference modes.

A real server with one policy and ``multiagent=True`` clients (every agent maps to the only
policy: shared policies are batched together): agents join and leave mid-episode, act at their
own pace, are marked done, and every mistake is a clear error naming the agent and its policy
while the episode and the server carry on.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gymnasium import spaces

from rlserve import PolicyClient
from rlserve.errors import EpisodeError, LimitExceededError, SpaceError
from rlserve.protocol.spaces import describe

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from meeting import AGENTS, MeetingEnv, play_episode

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

SMALL_PPO = (
    "--ppo-train-batch-size",
    "64",
    "--ppo-minibatch-size",
    "32",
    "--ppo-num-epochs",
    "2",
    "--fragment-length",
    "8",
)


@pytest.fixture(scope="module")
def server(module_launcher: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    spaces_file = tmp_path_factory.mktemp("spaces") / "meeting.json"
    obs = spaces.Box(-1.0, 1.0, (3,), np.float32)
    spaces_file.write_text(
        json.dumps(
            {"observation_space": describe(obs), "action_space": describe(spaces.Discrete(3))}
        )
    )
    return module_launcher(*SMALL_PPO, spaces=("--spaces-file", str(spaces_file)))


@pytest.fixture(params=["remote", "local"])
def client(request: pytest.FixtureRequest, server: Any) -> Any:
    with PolicyClient(
        server.address, inference_mode=request.param, multiagent=True, seed=1, update_interval=0.2
    ) as c:
        yield c


def test_the_meeting_example_plays_in_both_modes(client: PolicyClient, server: Any) -> None:
    env = MeetingEnv()
    returns = [play_episode(client, env, seed=i) for i in range(10)]
    assert all(-2.0 <= r <= 1.0 for r in returns)
    if client.local is not None:
        assert client.local.flush(30.0)
    metrics = server.metrics()
    assert metrics["episodes/completed"] >= 10


def test_agents_join_leave_and_act_at_their_own_pace(client: PolicyClient) -> None:
    obs = {a: np.zeros(3, np.float32) for a in ("a", "b", "c")}
    eid = client.start_episode()
    actions = client.get_action(eid, {"a": obs["a"]})  # only a acts
    assert set(actions) == {"a"} and all(isinstance(v, int) for v in actions.values())
    client.log_returns(eid, {"a": 1.0})
    actions = client.get_action(eid, {"b": obs["b"], "c": obs["c"]})  # turn-based: b and c
    assert set(actions) == {"b", "c"}
    client.log_returns(eid, {"b": 0.5, "c": -0.5}, multiagent_done_dict={"c": True})
    actions = client.get_action(eid, {"a": obs["a"], "b": obs["b"], "d": obs["a"]})  # d joins
    assert set(actions) == {"a", "b", "d"}
    client.log_returns(eid, {"a": 1.0, "d": 2.0})
    client.end_episode(eid, {"a": obs["a"]})
    # The episode is over; a new one works.
    eid2 = client.start_episode()
    assert set(client.get_action(eid2, {"a": obs["a"]})) == {"a"}
    client.end_episode(eid2, {})


def test_all_ends_the_episode_and_a_later_end_is_a_no_op(client: PolicyClient) -> None:
    eid = client.start_episode()
    client.get_action(eid, {"x": np.zeros(3, np.float32), "y": np.ones(3, np.float32) * 0.5})
    client.log_returns(eid, {"x": 1.0, "y": 1.0}, multiagent_done_dict={"__all__": True})
    client.end_episode(eid, {"x": np.zeros(3, np.float32)})  # what RLlib's clients do next
    with pytest.raises(EpisodeError):
        client.get_action(eid, {"x": np.zeros(3, np.float32)})


def test_errors_name_the_agent_and_the_policy_and_the_episode_goes_on(
    client: PolicyClient,
) -> None:
    eid = client.start_episode()
    good = np.zeros(3, np.float32)
    with pytest.raises(SpaceError, match=r"agent 'b'.*policy 'default'"):
        client.get_action(eid, {"a": good, "b": np.zeros(4, np.float32)})
    with pytest.raises(EpisodeError, match=r"agent 'z'.*has not acted"):
        client.log_returns(eid, {"z": 1.0})
    client.get_action(eid, {"a": good})
    client.log_returns(eid, {"a": 1.0}, multiagent_done_dict={"a": True})
    with pytest.raises(EpisodeError, match=r"agent 'a'.*policy 'default'.*done"):
        client.get_action(eid, {"a": good})
    # The episode carries on with other agents.
    assert set(client.get_action(eid, {"b": good})) == {"b"}
    client.end_episode(eid, {"b": good})


def test_log_action_takes_dicts(client: PolicyClient) -> None:
    eid = client.start_episode()
    obs = {"a": np.zeros(3, np.float32), "b": np.ones(3, np.float32) * 0.1}
    client.log_action(eid, obs, {"a": 0, "b": 2})
    with pytest.raises(SpaceError, match=r"agent 'b'"):
        client.log_action(eid, obs, {"a": 0, "b": 7})
    client.log_returns(eid, {"a": 1.0, "b": 1.0})
    assert set(client.get_action(eid, obs)) == {"a", "b"}
    client.end_episode(eid, obs, truncated=True)


def test_infos_that_merge_over_the_limit_are_refused_by_the_call_that_merges(
    client: PolicyClient,
) -> None:
    """Each map alone is within max_info_bytes (64 KiB); the second, merged, is not."""
    eid = client.start_episode()
    obs = {"a": np.zeros(3, np.float32)}
    client.get_action(eid, obs)
    client.log_returns(eid, {"a": 0.5}, infos_of("first"))
    with pytest.raises(LimitExceededError, match=r"agent 'a'.*merge to .*max_info_bytes"):
        client.log_returns(eid, {"a": 0.5}, infos_of("second"))
    # The refused call kept nothing: the step goes on with the first map and its reward.
    client.log_returns(eid, {"a": 0.25}, {"a": {"small": 1}})
    assert set(client.get_action(eid, obs)) == {"a"}
    client.end_episode(eid, obs)


def infos_of(key: str) -> dict[str, dict[str, bytes]]:
    """Agent a's info map of 40,000 bytes under ``key``."""
    return {"a": {key: bytes(40_000)}}


def test_the_shared_policy_learns_from_every_agent(server: Any) -> None:
    with PolicyClient(server.address, inference_mode="remote", multiagent=True) as client:
        env = MeetingEnv()
        before = server.metrics()["learner/steps_consumed"]
        for i in range(40):
            play_episode(client, env, seed=100 + i)
    # Both agents' steps reached the one policy they share, and it published what it trained
    # (the learner counts the steps it takes in before its update publishes the weights).
    server.wait_until(
        lambda m: m["learner/steps_consumed"] >= before + 64 and m["server/weights_version"] >= 1,
        timeout=60,
        what="training",
    )
    assert len(AGENTS) == 2
