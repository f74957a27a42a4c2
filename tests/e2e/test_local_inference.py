"""Local inference against a real server: modes side by side, weight refresh, restarts, refusals."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
import uuid
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from rlserve import ClientClosedError, PolicyClient, SpaceError
from rlserve.client.connection import Connection, Timeouts
from rlserve.client.local import LocalConfig

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

SMALL_PPO = ("--ppo-train-batch-size", "128", "--ppo-minibatch-size", "64", "--ppo-num-epochs", "2")
QUICK = LocalConfig(batch_steps=32, batch_interval=0.1)


def play(client: PolicyClient, episodes: int, seed: int) -> tuple[int, list[float]]:
    """Play CartPole episodes; return the steps taken and each episode's return."""
    env = gym.make("CartPole-v1")
    steps, returns = 0, []
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + i)
        eid = client.start_episode()
        total, done = 0.0, False
        while not done:
            action = client.get_action(eid, obs)
            obs, reward, terminated, truncated, _ = env.step(action)
            client.log_returns(eid, float(reward))
            total += float(reward)
            steps += 1
            done = terminated or truncated
        client.end_episode(eid, obs, truncated=truncated and not terminated)
        returns.append(total)
    return steps, returns


def raw_connection(address: str) -> Connection:
    conn = Connection(address, None, "raw", "local", Timeouts(request=30.0))
    conn.open()
    return conn


def fragment(steps: int, version: int, obs_dim: int = 4) -> dict[str, Any]:
    return {
        "episode_id": uuid.uuid4().hex,
        "obs": np.zeros((steps + 1, obs_dim), np.float32),
        "actions": np.zeros(steps, np.int64),
        "rewards": np.ones(steps, np.float32),
        "behaviour_logp": np.full(steps, -0.69, np.float32),
        "policy_chosen": np.ones(steps, bool),
        "weights_version": np.full(steps, version, np.int64),
        "terminated": True,
        "truncated": False,
    }


def test_local_client_never_imports_torch(launch_server: Any) -> None:
    server = launch_server()
    script = textwrap.dedent(
        f"""
        import sys
        import gymnasium as gym
        from rlserve import PolicyClient
        client = PolicyClient({server.address!r}, inference_mode="local")
        env = gym.make("CartPole-v1")
        obs, _ = env.reset(seed=0)
        eid = client.start_episode()
        for _ in range(5):
            obs, reward, terminated, truncated, _ = env.step(client.get_action(eid, obs))
            client.log_returns(eid, float(reward))
        client.end_episode(eid, obs, truncated=True)
        client.close()
        print("torch" in sys.modules, client.local.shipped_steps)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "5"]


def test_both_modes_against_one_server(launch_server: Any) -> None:
    server = launch_server(*SMALL_PPO)
    results: dict[str, tuple[int, list[float]]] = {}

    def run(mode: str, seed: int) -> None:
        local = QUICK if mode == "local" else None
        with PolicyClient(server.address, inference_mode=mode, local=local) as client:
            results[mode] = play(client, 15, seed)

    threads = [
        threading.Thread(target=run, args=(m, s)) for m, s in (("remote", 0), ("local", 100))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    remote_steps, remote_returns = results["remote"]
    local_steps, local_returns = results["local"]
    metrics = server.wait_until(
        lambda m: m["episodes/completed"] == 30, what="30 episodes from both modes"
    )
    assert metrics["samples/env_steps"] == remote_steps + local_steps
    assert metrics["samples/steps_reported"] == local_steps
    assert metrics["episodes/return_mean"] == pytest.approx(
        np.mean(remote_returns + local_returns), rel=1e-6
    )


def test_weights_refresh_by_interval_and_on_request(launch_server: Any) -> None:
    server = launch_server(*SMALL_PPO)
    manual = PolicyClient(server.address, inference_mode="local", update_interval=None, local=QUICK)
    timed = PolicyClient(server.address, inference_mode="local", update_interval=0.2, local=QUICK)
    try:
        assert manual.weights_version == 0
        play(manual, 30, seed=0)  # enough steps for several learner updates
        newest = server.wait_for_weights(1)
        assert manual.weights_version == 0, "update_interval=None must not refresh by itself"
        manual.update_policy_weights()
        assert manual.weights_version is not None and manual.weights_version >= newest
        deadline = time.monotonic() + 30
        while timed.weights_version is not None and timed.weights_version < newest:
            assert time.monotonic() < deadline, "the interval refresh never happened"
            time.sleep(0.05)
    finally:
        manual.close()
        timed.close()


def test_server_restart_while_a_local_client_runs(launch_server: Any) -> None:
    first = launch_server(*SMALL_PPO)
    # "block": this simulator pauses while the server is away instead of dropping experience.
    patient = LocalConfig(
        batch_steps=32, batch_interval=0.1, max_buffered_steps=2000, when_full="block"
    )
    client = PolicyClient(
        first.address, inference_mode="local", local=patient, reconnect_timeout=60.0
    )
    played = [0]
    stop = threading.Event()

    def loop() -> None:
        seed = 0
        while not stop.is_set():
            steps, _ = play(client, 1, seed)
            played[0] += steps
            seed += 1

    worker = threading.Thread(target=loop)
    worker.start()
    try:
        first.wait_until(lambda m: m["samples/steps_reported"] > 300, what="reported steps")
        first.stop()
        second = launch_server(resume=first.run_folder, port=first.port)
        second.wait_until(
            lambda m: m["samples/steps_reported"] > 0 and m["episodes/completed"] > 0,
            what="reports after the restart",
        )
        time.sleep(1.0)
    finally:
        stop.set()
        worker.join(60)
        client.close()
    assert client.local is not None
    assert client.local.dropped_steps == 0
    assert client.local.rejected_steps == 0
    assert client.local.buffered_steps == 0
    metrics = second.metrics()
    # Each step the client took is counted exactly once across both server lives: batches lost
    # with the first server were re-sent, and none was counted twice.
    assert metrics["samples/env_steps"] == played[0]


def test_a_re_sent_batch_is_not_trained_twice(launch_server: Any) -> None:
    server = launch_server()
    conn = raw_connection(server.address)
    version = conn.request({"type": "get_weights"})["version"]
    batch = {"type": "report_samples", "batch_id": "batch-1", "fragments": [fragment(5, version)]}
    first = conn.request(dict(batch))
    again = conn.request(dict(batch))
    assert (first["duplicate"], again["duplicate"]) == (False, True)
    assert first["steps"] == again["steps"] == 5
    metrics = server.metrics()
    assert metrics["samples/steps_reported"] == 5
    conn.close()


def test_forged_versions_and_mismatched_spaces_are_refused(launch_server: Any) -> None:
    server = launch_server()
    conn = raw_connection(server.address)
    version = conn.request({"type": "get_weights"})["version"]
    with pytest.raises(SpaceError, match="not versions this server published"):
        conn.request(
            {
                "type": "report_samples",
                "batch_id": "forged",
                "fragments": [fragment(3, version + 7)],
            }
        )
    with pytest.raises(SpaceError, match=r"shape \(4, 4\)"):
        conn.request(
            {"type": "report_samples", "batch_id": "wide", "fragments": [fragment(3, version, 6)]}
        )
    bad_action = fragment(3, version)
    bad_action["actions"] = np.array([0, 1, 2])
    with pytest.raises(SpaceError, match=r"choice indices 0\.\.1"):
        conn.request({"type": "report_samples", "batch_id": "act", "fragments": [bad_action]})
    # A refused batch id is not remembered: the corrected batch is accepted under it.
    fixed = conn.request(
        {"type": "report_samples", "batch_id": "forged", "fragments": [fragment(3, version)]}
    )
    assert fixed["duplicate"] is False
    assert server.metrics()["samples/steps_reported"] == 3
    conn.close()


def test_a_full_buffer_drops_the_oldest_steps_and_says_so(
    launch_server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    server = launch_server()
    small = LocalConfig(batch_steps=32, batch_interval=0.1, max_buffered_steps=200)
    client = PolicyClient(server.address, inference_mode="local", local=small)
    server.stop()
    with caplog.at_level("WARNING", logger="rlserve.client"):
        steps, _ = play(client, 60, seed=0)
    assert client.local is not None
    assert client.local.dropped_steps > 0
    assert client.local.buffered_steps <= 200
    assert "dropped" in caplog.text
    assert client.local.dropped_steps + client.local.buffered_steps <= steps
    client.local.close(timeout=0.5)


def test_close_wakes_a_get_action_blocked_on_a_full_buffer(
    launch_server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    server = launch_server()
    # Fragments of 8 steps: the buffer fills within the first 13 fragments.
    full_blocks = LocalConfig(
        batch_steps=32,
        batch_interval=0.1,
        fragment_length=8,
        max_buffered_steps=100,
        when_full="block",
    )
    client = PolicyClient(server.address, inference_mode="local", local=full_blocks)
    assert client.local is not None
    server.stop()  # nothing ships from now on: the buffer fills and the simulator waits
    outcome: list[BaseException | None] = []
    blocked_in: list[str] = []

    def simulator() -> None:
        # One endless episode: every fragment is cut, and the wait happens, in get_action.
        obs = np.zeros(4, np.float32)
        try:
            episode = client.start_episode()
            for _ in range(100_000):
                client.get_action(episode, obs)
                client.log_returns(episode, 1.0)
            outcome.append(None)
        except BaseException as exc:  # what the simulator sees once the client is closed
            outcome.append(exc)

    player = threading.Thread(target=simulator, daemon=True)
    player.start()
    deadline = time.monotonic() + 60
    while client.local.buffered_steps <= full_blocks.max_buffered_steps:
        assert time.monotonic() < deadline, "the buffer never filled"
        assert player.is_alive(), outcome
        time.sleep(0.05)
    frame = sys._current_frames().get(player.ident or 0)
    while frame is not None:
        blocked_in.append(frame.f_code.co_name)
        frame = frame.f_back
    closer = threading.Thread(target=client.close, kwargs={"timeout": 1.0}, daemon=True)
    with caplog.at_level("WARNING", logger="rlserve.client"):
        closer.start()
        closer.join(20)
    assert not closer.is_alive(), "close() hung behind the blocked call"
    player.join(20)
    assert not player.is_alive(), "the blocked call stayed blocked after close()"
    assert "get_action" in blocked_in, blocked_in
    assert isinstance(outcome[0], ClientClosedError)
    assert "was closed" in str(outcome[0])
    assert client.local.dropped_steps == 0  # block mode waits; it never drops
    assert "were not delivered" in caplog.text


@pytest.mark.parametrize("mode", ["remote", "local"])
def test_calls_after_close_are_refused_with_the_fix(launch_server: Any, mode: str) -> None:
    server = launch_server()
    obs = np.zeros(4, np.float32)
    with PolicyClient(server.address, inference_mode=mode, local=QUICK) as client:
        episode = client.start_episode()
        client.get_action(episode, obs)
    for call, run in (
        ("start_episode", lambda: client.start_episode()),
        ("get_action", lambda: client.get_action(episode, obs)),
        ("log_action", lambda: client.log_action(episode, obs, 0)),
        ("log_returns", lambda: client.log_returns(episode, 1.0)),
        ("end_episode", lambda: client.end_episode(episode, obs)),
        ("update_policy_weights", lambda: client.update_policy_weights()),
    ):
        with pytest.raises(ClientClosedError, match=f"{call}: this PolicyClient was closed"):
            run()
    client.close()  # a second close does nothing


def test_a_client_whose_local_engine_was_closed_refuses_calls(launch_server: Any) -> None:
    server = launch_server()
    client = PolicyClient(server.address, inference_mode="local", local=QUICK)
    assert client.local is not None
    client.local.close(timeout=5.0)
    with pytest.raises(ClientClosedError, match="start_episode: this PolicyClient was closed"):
        client.start_episode()
    client.close()
