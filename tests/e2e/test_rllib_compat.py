"""RLlib's external-client call pattern, unchanged, against a real server.

What RLlib's example clients do, written here in our own words: a client built with only an
address (RLlib's defaults: local inference, weights every 10 s), ``log_returns(eid, reward,
info=info)`` on every step, rewards before the first action, an episode kept out of training next
to one that logs someone else's actions, and a server restarted under a running client.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from rlserve import EpisodeLostError, PolicyClient, SpaceError
from rlserve.client.local import LocalConfig
from rlserve.run.experience_log import ExperienceLog

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

OBS = np.array([0.01, -0.02, 0.03, 0.04], dtype=np.float32)
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "cartpole_client.py"


def logged_fragments(server: Any) -> list[dict[str, Any]]:
    """Every fragment in a stopped server's experience log."""
    log = ExperienceLog(server.run_folder / "experience")
    try:
        return [fragment for record in log.open() for fragment in record.fragments()]
    finally:
        log.close()


def play_like_rllib(client: PolicyClient, seed: int, episodes: int) -> int:
    """RLlib's cartpole client loop: the env's info logged with every reward. Returns steps."""
    env = gym.make("CartPole-v1")
    steps = 0
    for episode in range(episodes):
        obs, info = env.reset(seed=seed + episode)
        eid = client.start_episode()
        client.log_returns(eid, 0.5, info={"reset": True})  # before the first action
        done = False
        while not done:
            action = client.get_action(eid, obs)
            obs, reward, terminated, truncated, info = env.step(action)
            info = {**info, "step": steps, 3: "an int key", "pos": (1, 2)}
            client.log_returns(eid, reward, info=info)
            steps += 1
            done = terminated or truncated
        client.end_episode(eid, obs)
    return steps


def test_rllib_call_pattern_with_only_defaults(launch_server: Any) -> None:
    server = launch_server()
    client = PolicyClient(server.address)
    assert client.inference_mode == "local" and client.update_interval == 10.0
    steps = play_like_rllib(client, seed=0, episodes=3)
    # RLlib's two-episode client: one episode served only, one that logs another's actions.
    served = client.start_episode(training_enabled=False)
    client.get_action(served, OBS)
    client.get_action(served, OBS)
    logging_eid = client.start_episode(training_enabled=True)
    first = client.get_action(logging_eid, OBS)
    client.log_action(logging_eid, OBS, first)
    client.log_returns(logging_eid, 1.3)
    client.log_action(logging_eid, OBS, first)
    client.log_action(logging_eid, OBS, first)
    client.log_returns(logging_eid, 1.3)
    client.end_episode(logging_eid, OBS)
    client.get_action(served, OBS)
    client.end_episode(served, OBS)
    client.close()
    assert client.local is not None and client.local.rejected_steps == 0
    assert client.local.shipped_steps == steps + 4
    metrics = server.wait_until(
        lambda m: m["samples/steps_reported"] == steps + 4, what="every step reported"
    )
    assert metrics["episodes/completed"] >= 4
    assert server.stop() == 0
    infos = [i for f in logged_fragments(server) for i in (f.get("infos") or [])]
    # One per CartPole step; the info before each first action has no step, and the episode
    # that logged no info has no infos at all.
    assert len(infos) == steps and None not in infos
    assert infos[0] == {"step": 0, "3": "an int key", "pos": [1, 2]}


def test_remote_info_rides_with_the_next_call_and_is_kept(launch_server: Any) -> None:
    server = launch_server()
    client = PolicyClient(server.address, inference_mode="remote", timeout=30)
    sent_before = client._conn._next_id  # request ids count the frames this client sent
    steps = play_like_rllib(client, seed=10, episodes=2)
    # One request per step, plus start and end: info costs no round trip of its own.
    assert client._conn._next_id - sent_before == steps + 2 * 2
    eid = client.start_episode()
    client.get_action(eid, OBS)
    with pytest.raises(SpaceError, match=r"log_returns for episode '.*': info\['seen'\] is a set"):
        client.log_returns(eid, 1.0, info={"seen": {1, 2}})
    client.log_returns(eid, 1.0, info={"ok": 1})
    client.end_episode(eid, OBS, truncated=True)
    client.close()
    assert server.stop() == 0
    fragments = logged_fragments(server)
    infos = [i for f in fragments for i in (f.get("infos") or [])]
    assert len([i for i in infos if i is not None]) == steps + 1
    assert {"ok": 1} in infos and {"step": 0, "3": "an int key", "pos": [1, 2]} in infos


@pytest.mark.parametrize("mode", ["remote", "local"])
def test_a_non_finite_reward_is_refused_by_log_returns(launch_server: Any, mode: str) -> None:
    server = launch_server()
    client = PolicyClient(server.address, inference_mode=mode, timeout=30)
    env = gym.make("CartPole-v1")
    steps = 0
    for episode in range(4):
        obs, _ = env.reset(seed=episode)
        eid = client.start_episode()
        done = False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(client.get_action(eid, obs))
            if steps == 3:
                for bad in (math.nan, math.inf):
                    with pytest.raises(SpaceError, match=f"log_returns for episode '{eid}'"):
                        client.log_returns(eid, bad)
                client.log_returns(eid, 6e8)
                with pytest.raises(SpaceError, match="add up to"):
                    client.log_returns(eid, 6e8)
            client.log_returns(eid, reward)
            steps += 1
            done = terminated or truncated
        client.end_episode(eid, obs, truncated=truncated and not terminated)
    client.close()
    if mode == "local":
        assert client.local is not None
        assert client.local.rejected_steps == 0 and client.local.shipped_steps == steps
    metrics = server.wait_until(
        lambda m: m["episodes/completed"] == 4, what="all four episodes counted"
    )
    assert metrics["samples/env_steps"] == steps


def test_a_refused_end_episode_is_named_by_the_next_call(launch_server: Any) -> None:
    server = launch_server()
    client = PolicyClient(
        server.address, inference_mode="remote", timeout=30, check_observations=False
    )
    eid = client.start_episode("the-ended-one")
    client.get_action(eid, OBS)
    client.end_episode(eid, [1.0, 2.0])  # the wrong shape: only the server sees it
    with pytest.raises(SpaceError) as caught:
        client.start_episode("unrelated")
    message = str(caught.value)
    assert "end_episode of episode 'the-ended-one' failed" in message
    assert "which was not sent" in message
    client.end_episode(eid, OBS)  # the refused end left the episode open
    client.close()


def test_dropped_steps_are_warned_about_once_per_interval(
    launch_server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    server = launch_server()
    small = LocalConfig(batch_steps=8, batch_interval=0.05, max_buffered_steps=16)
    client = PolicyClient(server.address, local=small, reconnect_timeout=5)
    assert server.stop() == 0
    caplog.set_level(logging.WARNING, logger="rlserve.client")
    eid = client.start_episode()
    for _ in range(300):
        client.get_action(eid, OBS)
        client.log_returns(eid, 1.0)
    client.close(timeout=1)
    assert client.local is not None and client.local.dropped_steps > 100
    warnings = [r.getMessage() for r in caplog.records if "buffer is full" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "when_full='block'" in warnings[0] and "dropped" in warnings[0]


def test_remote_episodes_lost_in_a_restart_raise_episode_lost_error(launch_server: Any) -> None:
    first = launch_server()
    client = PolicyClient(first.address, inference_mode="remote", timeout=30)
    eid = client.start_episode()
    client.get_action(eid, OBS)
    assert first.stop(signal.SIGKILL) != 0
    second = launch_server(resume=first.run_folder, port=first.port)
    with pytest.raises(EpisodeLostError) as caught:
        client.get_action(eid, OBS)  # reconnects, then finds the episode gone
    assert caught.value.episode_ids == [eid] and "start a new episode" in str(caught.value)
    with pytest.raises(EpisodeLostError):
        client.end_episode(eid, OBS)
    fresh = client.start_episode()
    client.get_action(fresh, OBS)
    client.end_episode(fresh, OBS)
    client.close()
    assert second.stop() == 0


def test_the_example_client_survives_a_server_restart(launch_server: Any) -> None:
    first = launch_server()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    remote = ["--inference", "remote"]  # a restart loses remote episodes: the case to show
    example = subprocess.Popen(
        [sys.executable, str(EXAMPLE), "--address", first.address, "--episodes", "100000", *remote],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert example.stdout is not None
        lines = [example.stdout.readline() for _ in range(3)]
        assert all(line.startswith("episode ") for line in lines), lines
        assert first.stop(signal.SIGKILL) != 0
        second = launch_server(resume=first.run_folder, port=first.port)
        after = [example.stdout.readline() for _ in range(30)]
        assert example.poll() is None, example.stderr.read() if example.stderr else ""
        assert sum(line.startswith("episode ") for line in after) >= 25, after
        assert second.metrics()["episodes/completed"] >= 1
    finally:
        example.terminate()
        example.wait(30)
