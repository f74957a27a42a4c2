"""An attached server: checkpoints release the experience log; a resume replays what is left."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import pytest

from rlserve import PolicyClient
from rlserve.algorithm import Algorithm, PPOConfig
from rlserve.algorithm.serving import REPLAYED_SOURCE


def config(run_dir: Path) -> PPOConfig:
    return (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_envs_per_env_runner=2, rollout_fragment_length=16)
        .training(
            train_batch_size=256, min_env_steps_per_iteration=256, model={"fcnet_hiddens": [16]}
        )
        .serving(host="127.0.0.1", port=0)
        .reporting(run_dir=str(run_dir), name="run")
        .debugging(seed=3)
    )


def play(address: str, episodes: int, seed: int) -> int:
    """Remote-inference CartPole episodes through a real client; the steps it took."""
    client = PolicyClient(address, "remote")
    env = gym.make("CartPole-v1")
    steps = 0
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + i)
        episode_id = client.start_episode()
        done = False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(client.get_action(episode_id, obs))
            client.log_returns(episode_id, float(reward))
            steps += 1
            done = terminated or truncated
        client.end_episode(episode_id, obs, truncated=not terminated)
    client.close()
    return steps


def segments(run: Path) -> list[Path]:
    return sorted((run / "experience").iterdir())


@pytest.mark.timeout(180)
def test_a_checkpoint_releases_the_log_its_weights_hold(tmp_path: Path) -> None:
    algo = config(tmp_path).build()
    try:
        algo.server.server.log.segment_bytes = 2048  # a few records per segment
        assert algo.address is not None
        play(algo.address, 4, seed=0)
        assert algo.run is not None
        before = len(segments(algo.run.path))
        assert before > 2
        while algo.server.queued_steps_by_source:
            algo.train()
        folder = algo.save()
        state = json.loads((folder / "algorithm.json").read_text())
        assert state["log_trained_through"] == algo.server.taken_through > 0
        assert len(segments(folder)) == 1  # only the newest (open) segment is left
    finally:
        algo.stop()


@pytest.mark.timeout(180)
def test_a_resumed_run_trains_what_was_logged_after_its_checkpoint(tmp_path: Path) -> None:
    first = config(tmp_path).build()
    try:
        assert first.address is not None
        first.train()
        folder = first.save()
        logged_later = play(first.address, 3, seed=10)  # acknowledged, never taken
    finally:
        first.stop()  # as a crash would leave it: the steps are only in the log

    second = Algorithm.from_checkpoint(folder, config(tmp_path))
    try:
        assert second.run is not None and second.run.path == folder
        assert second.server.queued_steps_by_source == {REPLAYED_SOURCE: logged_later}
        taken = 0
        while second.server.queued_steps_by_source:
            taken += second.train()["network"]["num_env_steps"]
        assert taken == logged_later
        assert second.iteration == 2
    finally:
        second.stop()
