"""The learner as a Ray actor on the node that has the (fake) GPU: it trains as the in-process
learner does, its weights come back, checkpoints go through it, a killed one is replaced and
restored (from its snapshot or the newest checkpoint) and training goes on, and a resource no
node has is refused before anything starts."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

from rlserve import PPOConfig
from rlserve.algorithm.algorithm import Algorithm
from rlserve.cluster import learner as learner_module
from rlserve.cluster.learner import RemoteLearner
from rlserve.errors import ConfigError

if TYPE_CHECKING:
    from conftest import RayCluster

# A hang catcher: these tests took 90-128 s under the suite's load on the slowest VM phase, and a
# timeout that fires inside ray.get breaks the worker's driver for the Ray tests after it.
pytestmark = pytest.mark.timeout(360)

SMALL = {
    "train_batch_size": 128,
    "minibatch_size": 64,
    "num_epochs": 2,
    "min_env_steps_per_iteration": 128,
    "model": {"fcnet_hiddens": [16]},
}


def _config(**learners: Any) -> Any:
    config = (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(backend="ray", num_env_runners=0, num_envs_per_env_runner=2)
        .training(**SMALL)
        .debugging(seed=3)
    )
    return config.learners(**learners) if learners else config


def _strip(result: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in result.items() if k not in ("time_this_iter_s", "time_total_s")}
    out["learners"] = {
        pid: {k: v for k, v in m.items() if k != "update_seconds"}
        for pid, m in result["learners"].items()
    }
    return out


def _weights(algo: Algorithm) -> list[np.ndarray]:
    arrays = algo.learners["default"].weights().arrays
    return [np.asarray(arrays[name]) for name in sorted(arrays)]


def test_the_learner_on_the_gpu_node_trains_as_the_in_process_one(
    ray_cluster: RayCluster,
) -> None:
    with _config(num_gpus_per_learner=1, num_cpus_per_learner=0.25).build() as algo:
        learner = algo.learners["default"]
        assert isinstance(learner, RemoteLearner)
        # Placed on the only node with a GPU; torch finds no CUDA there: "auto" took the CPU.
        assert learner.node == ray_cluster.second_ip
        assert learner.device == "cpu"
        remote = [_strip(algo.train()) for _ in range(3)]
        remote_weights = _weights(algo)
        assert algo.learners["default"].version == 3
    with _config().build() as algo:
        assert not isinstance(algo.learners["default"], RemoteLearner)
        local = [_strip(algo.train()) for _ in range(3)]
        local_weights = _weights(algo)
    # The same sampling and the same maths on CPU: the same run.
    assert remote == local
    assert len(remote_weights) == len(local_weights) > 0
    for a, b in zip(remote_weights, local_weights, strict=True):
        np.testing.assert_array_equal(a, b)


def test_checkpoints_go_through_the_learner_actor(ray_cluster: RayCluster, tmp_path: Path) -> None:
    config = _config(custom_resources_per_learner={"sim": 1}, num_cpus_per_learner=0)
    with config.build() as algo:
        algo.train()
        folder = algo.save(tmp_path / "ckpt")
        saved = _weights(algo)
        assert saved
        version = algo.learners["default"].version
    restored = Algorithm.from_checkpoint(folder, config)
    try:
        learner = restored.learners["default"]
        assert isinstance(learner, RemoteLearner) and learner.node == ray_cluster.second_ip
        assert learner.version == version
        for a, b in zip(_weights(restored), saved, strict=True):
            np.testing.assert_array_equal(a, b)
        assert restored.train()["training_iteration"] == 2
        assert restored.learners["default"].version == version + 1
    finally:
        restored.stop()


def _kill_learner(ray_cluster: RayCluster, algo: Algorithm) -> None:
    learner = algo.learners["default"]
    assert isinstance(learner, RemoteLearner)
    ray_cluster.ray.kill(learner._actor, no_restart=True)


def test_a_killed_learner_actor_is_replaced_from_its_snapshot_and_training_goes_on(
    ray_cluster: RayCluster, caplog: pytest.LogCaptureFixture
) -> None:
    with _config(num_learners=1, num_cpus_per_learner=0.25).build() as algo:
        assert algo.train()["learner_restarts"] == 0
        learner = algo.learners["default"]
        assert learner.version == 1
        _kill_learner(ray_cluster, algo)
        with caplog.at_level(logging.WARNING, logger="rlserve.algorithm"):
            result = algo.train()
        assert result["learner_restarts"] == 1
        # The replacement was restored from the snapshot after update 1 (not started afresh),
        # its weights numbered after the last version seen: 2 for the restored ones, 3 updated.
        assert learner.counters()["updates"] == 2
        assert learner.version == 3
        assert algo._packages["default"].version == 3
        warned = [r.getMessage() for r in caplog.records if "learner actor" in r.getMessage()]
        assert len(warned) == 1
        assert "died during ingest" in warned[0]
        assert "restored from a snapshot at version 1" in warned[0]
        assert algo.train()["learner_restarts"] == 1
        assert learner.version == 4


def test_a_killed_learner_actor_is_restored_from_the_newest_checkpoint(
    ray_cluster: RayCluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with _config(num_learners=1, num_cpus_per_learner=0.25).build() as algo:
        algo.train()
        algo.save(tmp_path / "ckpt")  # version 1, and newer than the snapshot
        algo.train()
        algo.train()
        learner = algo.learners["default"]
        assert learner.version == 3
        _kill_learner(ray_cluster, algo)
        with caplog.at_level(logging.WARNING, logger="rlserve.algorithm"):
            result = algo.train()
        assert result["learner_restarts"] == 1
        assert learner.counters()["updates"] == 2  # the checkpoint's one, then one more
        assert learner.version == 5
        (warned,) = [r.getMessage() for r in caplog.records if "learner actor" in r.getMessage()]
        assert "restored from the checkpoint" in warned and "(version 1)" in warned


def test_training_goes_on_when_the_learners_node_is_lost(ray_cluster: RayCluster) -> None:
    ray = ray_cluster.ray
    # Fill the two nodes' CPUs, so the learner lands on a node of its own, then lose that node.
    holders = ray_cluster.fill_cpus()
    ray_cluster.add_node(LEARNER_IP)
    with _config(num_learners=1, num_cpus_per_learner=1).build() as algo:
        learner = algo.learners["default"]
        assert isinstance(learner, RemoteLearner) and learner.node == LEARNER_IP
        algo.train()
        for holder in holders:
            ray.kill(holder)
        ray_cluster.kill_raylet(LEARNER_IP)
        _wait_until_lost(ray, LEARNER_IP)
        results = [algo.train() for _ in range(2)]
        assert learner.node in {ray_cluster.head_ip, ray_cluster.second_ip}
        assert [r["learner_restarts"] for r in results] == [1, 1]
        assert [r["training_iteration"] for r in results] == [2, 3]
        assert learner.counters()["updates"] == 3  # the snapshot's one, then one a train()
        assert learner.version == 4


def test_a_learner_actor_that_keeps_dying_is_given_up_naming_the_fix(
    ray_cluster: RayCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(learner_module, "MAX_RESTARTS", 0)
    with _config(num_learners=1, num_cpus_per_learner=0.25).build() as algo:
        algo.train()
        _kill_learner(ray_cluster, algo)
        with pytest.raises(RuntimeError, match=r"learner actor .* died .*given up.*checkpoint"):
            algo.train()


@pytest.mark.parametrize(
    ("learners", "named"),
    [
        ({"num_gpus_per_learner": 2}, "num_gpus_per_learner"),
        ({"custom_resources_per_learner": {"nowhere": 1}}, "custom_resources_per_learner"),
    ],
)
def test_a_resource_no_node_has_for_the_learner_is_refused_up_front(
    ray_cluster: RayCluster, learners: dict[str, Any], named: str
) -> None:
    with pytest.raises(ConfigError, match=named):
        _config(**learners).build()


def test_learner_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match="num_learners must be 0"):
        PPOConfig().learners(num_learners=2)
    with pytest.raises(ConfigError, match="num_gpus_per_learner must be a number"):
        PPOConfig().learners(num_gpus_per_learner=-1)
    with pytest.raises(ConfigError, match="custom resources only"):
        PPOConfig().learners(custom_resources_per_learner={"GPU": 1})


LEARNER_IP = "127.0.0.5"


def _wait_until_lost(ray: Any, ip: str) -> None:
    """Until the cluster knows the node on ``ip`` is lost (its actors dead with it)."""
    deadline = time.monotonic() + 60.0
    while any(n["NodeManagerAddress"] == ip and n.get("Alive") for n in ray.nodes()):
        assert time.monotonic() < deadline, f"the node on {ip} was not noticed lost"
        time.sleep(0.2)
