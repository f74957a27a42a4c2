"""``rlserve serve --algo sac``: external clients act with a squashed Gaussian, the learner
trains SAC on what they send, and a restart resumes it (replay buffer included)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from rlserve import PolicyClient
from rlserve.client.local import LocalConfig

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

SMALL_SAC = (
    "--algo",
    "sac",
    "--sac-hidden",
    "16",
    "16",
    "--sac-batch-size",
    "32",
    "--sac-learning-starts",
    "100",
    "--sac-train-every",
    "50",
    "--checkpoint-replay",
    "--checkpoint-every",
    "2",
    "--fragment-length",
    "50",
)
PENDULUM = ("--spaces-from", "Pendulum-v1")


def play(client: PolicyClient, seed: int, steps: int) -> list[np.ndarray]:
    """One Pendulum episode of at most ``steps`` steps; the actions the server sent."""
    env = gym.make("Pendulum-v1")
    obs, _ = env.reset(seed=seed)
    episode_id = client.start_episode()
    actions = []
    for _ in range(steps):
        action = np.asarray(client.get_action(episode_id, obs))
        actions.append(action)
        obs, reward, terminated, truncated, _ = env.step(action)
        client.log_returns(episode_id, float(reward))
        if terminated or truncated:
            break
    client.end_episode(episode_id, obs, truncated=True)
    return actions


def test_sac_server_trains_from_remote_and_local_clients(launch_server: Any) -> None:
    server = launch_server(*SMALL_SAC, "--seed", "4", spaces=PENDULUM)
    server.wait_for_weights()
    with PolicyClient(server.address, inference_mode="remote") as client:
        sent = [a for s in range(3) for a in play(client, seed=s, steps=100)]
    local = LocalConfig(batch_steps=50, batch_interval=0.1)
    with PolicyClient(server.address, inference_mode="local", local=local, seed=3) as client:
        sent += [a for s in range(3, 6) for a in play(client, seed=s, steps=100)]
    actions = np.concatenate(sent)
    # Scaled to Pendulum's +-2 torque, and spread across it (an untrained actor's std is ~1).
    assert np.abs(actions).max() <= 2.0 and actions.std() > 0.5
    # Every step of both clients reaches the replay buffer (600), and trains the learner.
    metrics = server.wait_until(
        lambda m: (m.get("learner/replay_size") or 0) >= 600,
        timeout=120,
        what="the 600 steps in the replay buffer",
    )
    assert metrics["learner/replay_size"] == 600 and metrics["learner/updates"] >= 4
    assert metrics["learner/alpha"] < 1.0  # the temperature is being tuned (from 1)
    assert server.wait_for_weights(version=4) >= 4


def test_a_restarted_sac_server_keeps_its_replay_buffer(launch_server: Any) -> None:
    first = launch_server(*SMALL_SAC, "--seed", "5", spaces=PENDULUM)
    first.wait_for_weights()
    with PolicyClient(first.address, inference_mode="remote") as client:
        for s in range(4):
            play(client, seed=s, steps=100)
    first.wait_until(lambda m: m["learner/updates"] >= 6, timeout=120, what="six updates")
    first.stop()
    second = launch_server(resume=first.run_folder)
    second.wait_for_weights()
    with PolicyClient(second.address, inference_mode="remote") as client:
        play(client, seed=10, steps=100)
    metrics = second.wait_until(
        lambda m: (m.get("learner/replay_size") or 0) >= 500, timeout=120, what="an update"
    )
    assert metrics["learner/replay_size"] == 500  # 400 from the checkpoint, 100 new
