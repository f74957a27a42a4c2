"""Hosted env runners and network clients feeding one Algorithm at the same time."""

from __future__ import annotations

import threading
import time

import gymnasium as gym
import pytest

from rlserve import PolicyClient, PPOConfig
from rlserve.client.local import LocalConfig
from rlserve.run.progress_file import read_progress

# The simulators here share the Algorithm's process (and its GIL): each step takes a simulator's
# millisecond, and the local-inference client waits for room instead of flooding the learner.
SIMULATOR_STEP_S = 0.001
PACED = LocalConfig(batch_steps=256, batch_interval=0.2, max_buffered_steps=512, when_full="block")


def _client_loop(address: str, inference: str, stop: threading.Event, seed: int) -> None:
    env = gym.make("CartPole-v1")
    client = PolicyClient(
        address,
        inference_mode=inference,
        client_name=f"sim-{inference}",
        local=PACED if inference == "local" else None,
    )
    obs, _ = env.reset(seed=seed)
    try:
        while not stop.is_set():
            episode_id = client.start_episode()
            done = False
            while not done and not stop.is_set():
                action = client.get_action(episode_id, obs)
                obs, reward, terminated, truncated, _ = env.step(action)
                time.sleep(SIMULATOR_STEP_S)
                client.log_returns(episode_id, float(reward))
                done = terminated or truncated
                if done:
                    client.end_episode(episode_id, obs, truncated=truncated and not terminated)
                    obs, _ = env.reset()
    finally:
        client.close()


@pytest.mark.timeout(120)
def test_one_algorithm_learns_from_hosted_envs_and_network_clients(tmp_path):
    algo = (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_envs_per_env_runner=2)
        .training(train_batch_size=256, minibatch_size=64, min_env_steps_per_iteration=512)
        .debugging(seed=3)
        .reporting(run_dir=str(tmp_path), name="both")
        .serving(host="127.0.0.1", port=0)
        .build()
    )
    stop = threading.Event()
    threads = [
        threading.Thread(target=_client_loop, args=(algo.address, mode, stop, i), daemon=True)
        for i, mode in enumerate(("remote", "local"))
    ]
    try:
        for thread in threads:
            thread.start()
        network = 0
        versions = []
        for _ in range(40):
            result = algo.train()
            network += result["network"]["num_env_steps"]
            versions.append(result["learners"]["default"]["weights_version"])
            if network >= 1000 and len(versions) >= 3:
                break
        assert network >= 1000, "the network clients' steps never reached the learner"
        assert result["env_runners"]["num_env_steps_sampled_lifetime"] > 0
        assert versions == sorted(versions) and versions[-1] > versions[0]
        # Both kinds of client were served and counted as separate sources.
        sources = algo.server.steps_by_source
        assert len([s for s, n in sources.items() if n > 0]) >= 2, sources
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)
        algo.stop()
    # The run folder's metrics are the Algorithm's (a row per iteration), the attached
    # server's are in server/, so the two streams never mix in one TensorBoard run.
    run = tmp_path / "both"
    rows = read_progress(run)
    assert len(rows) == len(versions)
    assert rows[-1]["samples/env_steps"] == result["num_env_steps_sampled_lifetime"]
    served = read_progress(run / "server")
    assert served and (served[-1]["samples/env_steps"] or 0) >= network
