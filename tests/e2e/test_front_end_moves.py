"""A client given several serving front-ends moves to another when its own is killed (-9).

Each front-end here is an ordinary ``rlserve serve`` with its own port and run folder.
Remote-inference episodes started on the dead one end with ``EpisodeLostError`` and new ones
run on the other; a local-inference client loses no step: what the dead front-end did not
acknowledge is delivered to the other, once.
"""

from __future__ import annotations

import logging
import signal
import socket
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from e2e_support import play_cartpole

from rlserve import PolicyClient
from rlserve.client.local import LocalConfig
from rlserve.errors import ConfigError, EpisodeLostError

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

GOOD = np.array([0.01, -0.02, 0.03, 0.04], dtype=np.float32)


def _refusing_address() -> str:
    """A loopback address nothing listens on (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


def _play(client: PolicyClient, episodes: int, seed: int, max_steps: int = 25) -> int:
    """Play CartPole episodes with local inference; the steps taken."""
    env = gym.make("CartPole-v1")
    steps = 0
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        eid = client.start_episode()
        for step in range(max_steps):
            obs, reward, terminated, _, _ = env.step(client.get_action(eid, obs))
            client.log_returns(eid, float(reward))
            steps += 1
            if terminated or step == max_steps - 1:
                client.end_episode(eid, obs, truncated=not terminated)
                break
    env.close()
    return steps


def test_the_first_front_end_that_answers_is_used(launch_server: Any) -> None:
    first, second = launch_server(), launch_server()
    for address in (f"{first.address}, {second.address}", [first.address, second.address]):
        with PolicyClient(address, inference_mode="remote", timeout=30) as client:
            assert client.front_end == first.address
    # A front-end that refuses is skipped, in order.
    skipping = [_refusing_address(), second.address, first.address]
    with PolicyClient(skipping, inference_mode="remote", timeout=30) as client:
        assert client.front_end == second.address
        assert play_cartpole(client, seed=1, max_steps=5).length == 5
    second.wait_until(lambda m: m["episodes/completed"] == 1, what="the episode")


def test_remote_episodes_on_a_killed_front_end_are_lost_and_new_ones_run_on_another(
    launch_server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    first, second = launch_server(), launch_server()
    client = PolicyClient(
        [first.address, second.address],
        inference_mode="remote",
        timeout=30,
        reconnect_timeout=60,
    )
    try:
        assert client.front_end == first.address
        old = client.start_episode()
        assert client.get_action(old, GOOD) in (0, 1)
        first.stop(signal.SIGKILL)

        with (
            caplog.at_level(logging.WARNING, logger="rlserve.client"),
            pytest.raises(EpisodeLostError) as lost,
        ):
            client.get_action(old, GOOD)
        message = str(lost.value)
        for part in (old, first.address, second.address, "start a new episode"):
            assert part in message, message
        assert lost.value.episode_ids == [old]
        assert f"moved to front-end {second.address}" in caplog.text
        assert client.front_end == second.address
        # Nothing is sent for the lost episode again; new episodes run on the live front-end.
        with pytest.raises(EpisodeLostError):
            client.end_episode(old, GOOD)
        result = play_cartpole(client, seed=3, max_steps=20)
        assert result.length > 0
        metrics = second.wait_until(
            lambda m: m["episodes/completed"] == 1, what="the new episode on the live front-end"
        )
        assert metrics["server/errors"] == 0
    finally:
        client.close()


def test_a_local_client_delivers_every_unacknowledged_step_to_another_front_end(
    launch_server: Any,
) -> None:
    first, second = launch_server(), launch_server()
    # Nothing ships until a flush: what the first front-end acknowledged is known exactly.
    holding = LocalConfig(batch_steps=100_000, batch_interval=3600.0, max_buffered_steps=100_000)
    client = PolicyClient(
        [first.address, second.address],
        inference_mode="local",
        update_interval=None,
        local=holding,
        timeout=30,
        reconnect_timeout=60,
        seed=0,
    )
    try:
        local = client.local
        assert local is not None
        taken = _play(client, episodes=3, seed=0)
        assert local.flush(60)
        acknowledged = local.shipped_steps
        assert acknowledged == taken
        assert first.metrics()["samples/steps_reported"] == acknowledged

        taken += _play(client, episodes=2, seed=100)  # buffered in the client
        first.stop(signal.SIGKILL)
        taken += _play(client, episodes=2, seed=200)  # acting needs no server
        assert local.flush(90), f"{local.buffered_steps} steps still buffered"

        # Every step the killed front-end did not acknowledge reached the other one, once.
        assert second.metrics()["samples/steps_reported"] == taken - acknowledged
        assert local.shipped_steps == taken
        assert (local.dropped_steps, local.rejected_steps, local.buffered_steps) == (0, 0, 0)
        # The weights now come from the live front-end.
        client.update_policy_weights()
        assert client.front_end == second.address
        assert client.weights_version == int(second.health()["weights_version"])
    finally:
        client.close()


def test_a_front_end_of_another_run_is_refused_by_name(launch_server: Any) -> None:
    first = launch_server()
    other = launch_server(spaces=("--spaces-from", "MountainCar-v0"))
    client = PolicyClient(
        [first.address, other.address], inference_mode="remote", timeout=30, reconnect_timeout=30
    )
    try:
        episode = client.start_episode()
        first.stop(signal.SIGKILL)
        with pytest.raises(ConfigError, match="serves other policies or spaces") as err:
            client.get_action(episode, GOOD)
        assert f"remove '{other.address}'" in str(err.value)
        assert first.address in str(err.value)
    finally:
        client.close()
