"""``.serving(ray_address=..., replicas=2)``: what ``rlserve serve --ray --replicas 2`` runs.

A network-only Algorithm built in this process is the first front-end (on 127.0.0.2); the
second is started on 127.0.0.3 from its run folder's configuration, on the same port, and the
learner is an actor pinned to the second node by its (pretend) GPU. A local-inference client of
each front-end plays; ``train()`` returns once the shared learner trained on their steps.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest
from serving_players import LocalPlayer, front_ends, metrics, port_free_on_both

from conftest import HEAD_IP, SECOND_IP, RayCluster
from rlserve import PPOConfig
from rlserve.errors import ConfigError

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


def _config(tmp_path: Path, **serving: Any) -> Any:
    env = gym.make("CartPole-v1")
    return (
        PPOConfig()
        .environment(observation_space=env.observation_space, action_space=env.action_space)
        .training(
            train_batch_size=256, minibatch_size=128, num_epochs=1, min_env_steps_per_iteration=256
        )
        .env_runners(rollout_fragment_length=16)
        .learners(num_gpus_per_learner=1)
        .serving(**serving)
        .reporting(run_dir=str(tmp_path / "runs"), progress=False)
        .debugging(seed=0)
    )


def test_serving_on_ray_runs_a_front_end_per_node_and_one_learner(
    ray_cluster: RayCluster, tmp_path: Path
) -> None:
    port = port_free_on_both()
    config = _config(
        tmp_path,
        port=port,
        ray_address=ray_cluster.address,
        ray_node_ip=HEAD_IP,
        replicas=2,
    )
    algo = config.build()
    players: list[LocalPlayer] = []
    try:
        assert algo.address == f"{HEAD_IP}:{port}"
        first, second = front_ends(algo.folder.path)
        assert (first["node"], second["node"]) == (HEAD_IP, SECOND_IP)
        assert second["host"] == SECOND_IP and second["port"] == port
        a, b = f"{HEAD_IP}:{port}", f"{SECOND_IP}:{port}"
        players = [LocalPlayer([a, b], seed=0), LocalPlayer([b, a], seed=1_000)]
        for player in players:
            player.start()
        result = algo.train()
        assert result["learners"]["default"]["steps_trained"] >= 256
        # Both front-ends fed the one learner: the second's steps were consumed there too.
        assert metrics(second)["samples/steps_reported"] > 0
        second_log = (Path(second["run_folder"]) / "rlserve.log").read_text()
        assert f"front-end {SECOND_IP} joined the learner" in second_log, second_log
    finally:
        for player in players:
            player.finish()
        algo.stop()
    for player in players:
        assert player.client.local is not None
        assert player.client.local.buffered_steps == player.client.local.rejected_steps == 0


def test_serving_replicas_without_a_cluster_or_a_port_name_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"replicas=2: .*pass ray_address="):
        _config(tmp_path, port=9900, replicas=2)
    with pytest.raises(ConfigError, match=r"replicas=2: .*pass port=N \(not 0\)"):
        _config(tmp_path, ray_address="127.0.0.2:6379", replicas=2)
    with pytest.raises(ConfigError, match=r"replicas must be at least 1"):
        _config(tmp_path, replicas=0)
    hosted = _config(tmp_path, port=9900, ray_address="127.0.0.2:6379").environment("CartPole-v1")
    with pytest.raises(ConfigError, match=r"places a server without environments on Ray"):
        hosted.build()
