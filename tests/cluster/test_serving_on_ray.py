"""``.serving(ray_address=..., replicas=2)``: what ``rlserve serve --ray --replicas 2`` runs.

A network-only Algorithm built in this process is the first front-end (on 127.0.0.2); the
second is started on 127.0.0.3 from its run folder's configuration, on the same port, and the
learner is an actor pinned to the second node by its (pretend) GPU. A local-inference client of
each front-end plays; ``train()`` returns once the shared learner trained on their steps.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest
from serving_players import LocalPlayer, front_ends, metrics, port_free_on_both

from conftest import HEAD_IP, SECOND_IP, RayCluster
from rlserve import PPOConfig
from rlserve.algorithm.algorithm import Algorithm
from rlserve.algorithm.network_config import run_folder_config
from rlserve.algorithm.network_ray import RAY_PLACEMENT_FILE
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


def _learner_ready_on(
    caplog: pytest.LogCaptureFixture, ip: str, times: int = 1, timeout: float = 120.0
) -> None:
    """Wait until the server has said ``times`` times that its learner actor is ready on ``ip``."""
    deadline = time.monotonic() + timeout
    line = f"the learner actor is ready on {ip}"
    while caplog.text.count(line) < times:
        assert time.monotonic() < deadline, f"not {times}x '{line}' in:\n{caplog.text[-3000:]}"
        time.sleep(0.2)


def test_from_checkpoint_of_a_run_on_ray_serves_on_ray_again(
    ray_cluster: RayCluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="rlserve.server")
    config = _config(tmp_path, port=0, ray_address=ray_cluster.address, ray_node_ip=HEAD_IP)
    algo = config.build()
    try:
        run, host = algo.folder.path, str(algo.address).rpartition(":")[0]
        _learner_ready_on(caplog, SECOND_IP)
        algo.save()
    finally:
        algo.stop()
    placement = json.loads((run / RAY_PLACEMENT_FILE).read_text())
    assert placement["ray_address"] == ray_cluster.address
    assert placement["num_gpus_per_learner"] == 1
    again = Algorithm.from_checkpoint(run)
    try:
        assert again.config.serving_settings is not None
        assert again.config.serving_settings["ray_address"] == ray_cluster.address
        assert str(again.address).rpartition(":")[0] == host
        # The resumed run's learner is an actor on the GPU node again, not a process here.
        _learner_ready_on(caplog, SECOND_IP, times=2)
    finally:
        again.stop()


def test_an_unreadable_ray_placement_names_the_fix(tmp_path: Path) -> None:
    algo = _config(tmp_path, port=0).build()
    run = algo.folder.path
    algo.stop()
    assert not (run / RAY_PLACEMENT_FILE).exists()  # not on Ray: nothing written
    assert run_folder_config(run).serving_settings.get("ray_address") is None  # type: ignore[union-attr]
    (run / RAY_PLACEMENT_FILE).write_text("[1, 2]")
    with pytest.raises(ConfigError, match=r"ray_placement.json .*unreadable.*pass config="):
        run_folder_config(run)
