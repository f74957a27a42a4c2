"""Local-mode client defects: reports over the frame limit, outage backlogs, shared random
streams, a shipper that spins after close()."""

from __future__ import annotations

import json
import logging
import resource
import signal
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from rlserve import PolicyClient
from rlserve.client.local import LocalConfig
from rlserve.protocol.spaces import describe

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

SMALL_PPO = ("--ppo-train-batch-size", "128", "--ppo-minibatch-size", "64", "--ppo-num-epochs", "1")


@pytest.fixture(scope="module")
def cartpole(module_launcher: Any) -> Any:
    handle = module_launcher("--seed", "8")
    handle.wait_for_weights()
    return handle


def _steps(client: PolicyClient, count: int, seed: int) -> int:
    """Play CartPole for ``count`` steps (ending episodes as they end); return steps taken."""
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=seed)
    eid = client.start_episode()
    for _ in range(count):
        obs, reward, terminated, truncated, _ = env.step(client.get_action(eid, obs))
        client.log_returns(eid, float(reward))
        if terminated or truncated:
            client.end_episode(eid, obs, truncated=truncated and not terminated)
            obs, _ = env.reset()
            eid = client.start_episode()
    client.end_episode(eid, obs, truncated=True)
    return count


def test_big_observations_ship_under_a_small_frame_limit(
    launch_server: Any, tmp_path: Path
) -> None:
    """10,000-float observations: a 200-step fragment is 8 MB, the frame limit 1 MB."""
    observation_space = gym.spaces.Box(-1.0, 1.0, (10_000,), np.float32)
    spaces_file = tmp_path / "big_spaces.json"
    spaces_file.write_text(
        json.dumps(
            {
                "observation_space": describe(observation_space),
                "action_space": describe(gym.spaces.Discrete(2)),
            }
        )
    )
    server = launch_server(
        "--max-frame-bytes",
        "1000000",
        "--ppo-hidden",
        "8",
        "8",
        *SMALL_PPO,
        spaces=("--spaces-file", str(spaces_file)),
    )
    config = LocalConfig(batch_steps=200, batch_interval=0.2, fragment_length=200)
    client = PolicyClient(server.address, inference_mode="local", local=config, seed=1)
    rng = np.random.default_rng(0)
    eid = client.start_episode()
    for _ in range(300):
        client.get_action(eid, rng.uniform(-1, 1, 10_000).astype(np.float32))
        client.log_returns(eid, 1.0)
    client.end_episode(eid, np.zeros(10_000, np.float32))
    assert client.local is not None
    assert client.local.flush(60.0), "the steps were never accepted"
    client.close()
    assert client.local.shipped_steps == 300
    assert client.local.rejected_steps == 0
    metrics = server.wait_until(lambda m: m["episodes/completed"] == 1, what="the episode")
    assert metrics["samples/steps_reported"] == 300


def test_a_backlog_over_the_frame_limit_drains_after_an_outage(launch_server: Any) -> None:
    """About 5,000 CartPole steps fit in a 200 kB frame; 12,000 pile up while the server is down."""
    first = launch_server("--max-frame-bytes", "200000", *SMALL_PPO)
    first.wait_for_weights()
    config = LocalConfig(batch_steps=64, batch_interval=0.1, max_buffered_steps=50_000)
    client = PolicyClient(
        first.address, inference_mode="local", local=config, reconnect_timeout=60.0, seed=2
    )
    assert client.local is not None
    try:
        played = _steps(client, 300, seed=0)
        assert client.local.flush(60.0)
        first.stop()
        played += _steps(client, 12_000, seed=1)
        assert client.local.buffered_steps > 5_000  # more than one frame holds
        second = launch_server(resume=first.run_folder, port=first.port)
        assert client.local.flush(120.0), f"{client.local.buffered_steps} steps never shipped"
    finally:
        client.close()
    assert client.local.dropped_steps == 0
    assert client.local.rejected_steps == 0
    assert client.local.shipped_steps == played
    assert second.metrics()["samples/steps_reported"] >= 12_000


def _actions(client: PolicyClient, count: int) -> list[int]:
    eid = client.start_episode()
    obs = np.array([0.01, -0.02, 0.03, 0.04], np.float32)
    return [int(client.get_action(eid, obs)) for _ in range(count)]


def test_clients_sample_from_their_own_streams(cartpole: Any) -> None:
    """Same weights, same observations: two clients draw different actions unless seeded alike."""
    kwargs: dict[str, Any] = {"inference_mode": "local", "update_interval": None}
    clients = {
        "fresh-a": PolicyClient(cartpole.address, **kwargs),
        "fresh-b": PolicyClient(cartpole.address, **kwargs),
        "seven-a": PolicyClient(cartpole.address, seed=7, **kwargs),
        "seven-b": PolicyClient(cartpole.address, seed=7, **kwargs),
        "eight": PolicyClient(cartpole.address, seed=8, **kwargs),
    }
    try:
        versions = {c.weights_version for c in clients.values()}
        assert len(versions) == 1, versions
        drawn = {name: _actions(c, 200) for name, c in clients.items()}
    finally:
        for c in clients.values():
            c.close()
    assert drawn["fresh-a"] != drawn["fresh-b"]
    assert drawn["seven-a"] == drawn["seven-b"]  # reproducible with a seed
    assert drawn["seven-a"] != drawn["eight"]


def test_the_steps_of_untrained_episodes_count_as_env_steps(launch_server: Any) -> None:
    """A local client ships no fragment of a ``training_enabled=False`` episode, only its
    summary: its steps still count in ``samples/env_steps`` (not in ``steps_reported``)."""
    server = launch_server(*SMALL_PPO)
    env = gym.make("CartPole-v1")
    with PolicyClient(server.address, inference_mode="local", update_interval=None) as client:
        lengths = []
        for k, trained in enumerate((True, False, False)):
            obs, _ = env.reset(seed=k)
            eid = client.start_episode(training_enabled=trained)
            terminated = truncated = False
            length = 0
            while not (terminated or truncated):
                obs, reward, terminated, truncated, _ = env.step(client.get_action(eid, obs))
                client.log_returns(eid, float(reward))
                length += 1
            client.end_episode(eid, obs, truncated=truncated and not terminated)
            lengths.append(length)
        assert client.local is not None and client.local.flush(30.0)
    metrics = server.wait_until(lambda m: m["episodes/completed"] == 3, what="three episodes")
    assert metrics["samples/steps_reported"] == lengths[0]
    assert metrics["samples/env_steps"] == sum(lengths)


def test_close_names_a_server_too_slow_to_take_the_steps_not_a_lost_connection(
    launch_server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    server = launch_server(*SMALL_PPO)
    server.wait_for_weights()
    # Nothing is shipped before close(): the steps wait for a batch of 10,000 or a minute.
    config = LocalConfig(batch_steps=10_000, batch_interval=60.0)
    client = PolicyClient(server.address, inference_mode="local", local=config)
    assert client.local is not None
    _steps(client, 50, seed=0)
    server.process.send_signal(signal.SIGSTOP)  # connected, and answering nothing
    try:
        with caplog.at_level("WARNING", logger="rlserve.client"):
            client.close(timeout=2.0)
    finally:
        server.process.send_signal(signal.SIGCONT)
    assert "50 steps of " in caplog.text and "were not delivered" in caplog.text, caplog.text
    # close() gave up waiting and cut the connection itself: that is no lost connection.
    assert "it did not take them within 2.0 s" in caplog.text, caplog.text
    assert "could not be reached" not in caplog.text, caplog.text
    assert server.stop() == 0


def test_close_while_the_server_is_down_stops_the_threads(
    launch_server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    server = launch_server(*SMALL_PPO)
    server.wait_for_weights()
    config = LocalConfig(batch_steps=32, batch_interval=0.1)
    client = PolicyClient(server.address, inference_mode="local", local=config)
    assert client.local is not None
    _steps(client, 100, seed=0)
    server.stop()
    _steps(client, 100, seed=1)
    with caplog.at_level("WARNING", logger="rlserve.client"):
        client.close(timeout=2.0)
    assert not client.local._shipper.is_alive()
    assert not client.local._refresher.is_alive()
    assert "were not delivered" in caplog.text
    # Nothing keeps a core busy afterwards (the old shipper spun at 100%).
    before = resource.getrusage(resource.RUSAGE_SELF)
    time.sleep(1.0)
    after = resource.getrusage(resource.RUSAGE_SELF)
    used = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert used < 0.5, f"the process used {used:.2f} s of CPU in 1 s after close()"


def test_a_short_timeout_while_the_server_starts_does_not_fail(launch_server: Any) -> None:
    """The first get_weights waits for the learner's first weights, longer than the timeout."""
    server = launch_server(*SMALL_PPO)
    client = PolicyClient(
        server.address, inference_mode="local", timeout=0.5, reconnect_timeout=60.0
    )
    try:
        assert _steps(client, 20, seed=3) == 20
        assert client.weights_version is not None
    finally:
        client.close()


def test_steps_of_episodes_left_open_are_shipped_at_close(
    cartpole: Any, caplog: pytest.LogCaptureFixture
) -> None:
    before = cartpole.metrics()
    client = PolicyClient(cartpole.address, inference_mode="local", update_interval=None)
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=5)
    eid = client.start_episode()
    for _ in range(5):  # a random CartPole episode lasts longer than this
        obs, reward, terminated, _, _ = env.step(client.get_action(eid, obs))
        assert not terminated
        client.log_returns(eid, float(reward))
    with caplog.at_level(logging.WARNING, logger="rlserve.client"):
        client.close()
    assert "1 episodes were still open; 4 of their steps are shipped" in caplog.text
    # The last step has no next observation: the other 4 bootstrap from it, as at idle expiry.
    after = cartpole.wait_until(
        lambda m: m["samples/steps_reported"] >= before["samples/steps_reported"] + 4,
        what="the open episode's steps",
    )
    assert after["samples/steps_reported"] == before["samples/steps_reported"] + 4
    assert after["episodes/completed"] == before["episodes/completed"]
