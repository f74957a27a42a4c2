"""Env runners as Ray actors on a two-node loopback cluster: placement by resource, learning
and determinism, restarts of a killed actor, and a resource no node has refused up front."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
import pytest

from rlserve import PPOConfig
from rlserve.algorithm.algorithm import Algorithm
from rlserve.errors import ConfigError

if TYPE_CHECKING:
    from conftest import RayCluster

pytestmark = pytest.mark.timeout(180)

SMALL = {
    "train_batch_size": 256,
    "minibatch_size": 64,
    "num_epochs": 2,
    "min_env_steps_per_iteration": 256,
    "model": {"fcnet_hiddens": [32]},
}


class SlowCartPole(gym.Wrapper):
    """CartPole that sleeps 2 ms a step, so a train() lasts long enough to be interrupted."""

    def __init__(self, env_config: Any = None) -> None:
        super().__init__(gym.make("CartPole-v1"))

    def step(self, action: Any) -> Any:
        time.sleep(0.002)
        return self.env.step(action)


def _config(env: Any = "CartPole-v1", runners: int = 2, **placement: Any) -> Any:
    return (
        PPOConfig()
        .environment(env)
        .env_runners(num_env_runners=runners, num_envs_per_env_runner=2, **placement)
        .training(**SMALL)
        .resources(device="cpu")
        .debugging(seed=5)
    )


def _strip_times(result: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in result.items() if k not in ("time_this_iter_s", "time_total_s")}
    out["learners"] = {
        pid: {k: v for k, v in m.items() if k != "update_seconds"}
        for pid, m in result["learners"].items()
    }
    return out


def _weights(algo: Algorithm) -> list[list[float]]:
    arrays = algo.learners["default"].weights().arrays
    return [np.asarray(arrays[name]).ravel().tolist() for name in sorted(arrays)]


def test_runners_are_placed_by_resource_over_both_nodes(ray_cluster: RayCluster) -> None:
    # One CPU each and one CPU per node: one runner on each node (auto backend: Ray is up).
    with _config().build() as algo:
        assert algo.runners is not None
        assert sorted(algo.runners.nodes) == [ray_cluster.head_ip, ray_cluster.second_ip]
        assert algo.train()["env_runners"]["num_env_steps_sampled"] >= 256
    # Only the second node has "sim".
    with _config(
        backend="ray", num_cpus_per_env_runner=0.25, custom_resources_per_env_runner={"sim": 1}
    ).build() as algo:
        assert algo.runners is not None
        assert algo.runners.nodes == [ray_cluster.second_ip] * 2
        assert algo.train()["env_runners"]["num_healthy_env_runners"] == 2


def test_ppo_with_ray_runners_is_deterministic_with_a_seed(ray_cluster: RayCluster) -> None:
    runs = []
    for _ in range(2):
        with _config(backend="ray", num_cpus_per_env_runner=0.5).build() as algo:
            results = [_strip_times(algo.train()) for _ in range(3)]
            runs.append((results, _weights(algo)))
    (results_a, weights_a), (results_b, weights_b) = runs
    assert [r["training_iteration"] for r in results_a] == [1, 2, 3]
    assert results_a[-1]["env_runners"]["num_env_steps_sampled_lifetime"] >= 3 * 256
    assert results_a == results_b
    assert weights_a == weights_b


def test_a_killed_runner_actor_is_restarted_and_its_episodes_counted(
    ray_cluster: RayCluster,
) -> None:
    with _config(SlowCartPole, backend="ray", num_cpus_per_env_runner=0.5).build() as algo:
        assert algo.runners is not None
        first = algo.train()
        victim = algo.runners.actors[1]
        killer = threading.Timer(0.05, ray_cluster.ray.kill, (victim,))
        killer.start()
        results = [algo.train() for _ in range(2)]
        killer.join()
        assert algo.runners.actors[1] is not victim
    assert first["env_runners"]["episodes_failed"] == 0
    last = results[-1]["env_runners"]
    # Its two copies' episodes in flight are lost.
    assert last["episodes_failed"] == 2 and last["num_env_runner_restarts"] == 1
    assert last["num_healthy_env_runners"] == 2
    assert results[-1]["training_iteration"] == 3


class FailsOnce(gym.Wrapper):
    """CartPole whose copies in runner 1 fail once (the first one to reach step 30 wins)."""

    def __init__(self, config: Any) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self.marker = Path(config["marker"])
        self.mode = config["mode"]
        self.mine = config.worker_index == 1
        self.steps = 0

    def step(self, action: Any) -> Any:
        self.steps += 1
        if self.mine and self.steps == 30 and not self.marker.exists():
            self.marker.touch()
            if self.mode == "hang":
                time.sleep(3600)
            elif self.mode == "exit":
                os._exit(3)
            raise ValueError("boom")
        return self.env.step(action)


@pytest.mark.parametrize("mode", ["raise", "exit", "hang"])
def test_a_failing_runner_actor_is_restarted_and_training_goes_on(
    ray_cluster: RayCluster, tmp_path: Path, mode: str
) -> None:
    marker = tmp_path / "failed"
    config = (
        _config(FailsOnce, backend="ray", num_cpus_per_env_runner=0.5)
        .environment(env_config={"marker": str(marker), "mode": mode})
        .env_runners(sample_timeout_s=2.0)
    )
    with config.build() as algo:
        assert algo.runners is not None
        before = list(algo.runners.actors)
        results = [algo.train() for _ in range(3)]
        after = algo.runners.actors
    assert marker.exists()
    last = results[-1]["env_runners"]
    assert last["num_env_runner_restarts"] == 1
    assert last["episodes_failed"] == 2  # the failed runner's two copies' episodes
    assert last["num_healthy_env_runners"] == 2
    assert before[0] is not after[0] and before[1] is after[1]
    assert results[-1]["learners"]["default"]["updates"] >= 2


class NotesClose(gym.Wrapper):
    """CartPole that leaves a file named after its runner when it is closed."""

    def __init__(self, config: Any) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self.note = Path(config["folder"]) / f"{config.worker_index}-{config.vector_index}"

    def close(self) -> None:
        self.note.touch()
        super().close()


def test_stop_closes_every_runner_actors_environments(
    ray_cluster: RayCluster, tmp_path: Path
) -> None:
    config = _config(NotesClose, backend="ray", num_cpus_per_env_runner=0.5).environment(
        env_config={"folder": str(tmp_path)}
    )
    with config.build() as algo:
        algo.train()
    runner_notes = {n.name for n in tmp_path.iterdir() if not n.name.startswith("0-")}
    assert runner_notes == {"1-0", "1-1", "2-0", "2-1"}


def test_an_env_the_nodes_cannot_import_names_the_fix(
    ray_cluster: RayCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A module only this process can import (the nodes' workers do not have tmp_path).
    (tmp_path / "driver_only_envs.py").write_text(
        "import gymnasium as gym\n\n\n"
        "class DriverOnly(gym.Wrapper):\n"
        "    def __init__(self, config=None):\n"
        "        super().__init__(gym.make('CartPole-v1'))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "driver_only_envs", raising=False)
    from driver_only_envs import DriverOnly  # type: ignore[import-not-found]

    config = _config(DriverOnly, runners=1, backend="ray", num_cpus_per_env_runner=0.5)
    with pytest.raises(RuntimeError, match=r"No module named 'driver_only_envs'.*py_modules"):
        config.build()


def test_a_resource_no_node_has_is_refused_before_sampling(ray_cluster: RayCluster) -> None:
    config = _config(backend="ray", custom_resources_per_env_runner={"tpu": 1})
    with pytest.raises(ConfigError, match=r"tpu=1 .*ray start --address=HEAD"):
        config.build()
    with pytest.raises(ConfigError, match=r"CPU=8 .*num_cpus_per_env_runner"):
        _config(backend="ray", num_cpus_per_env_runner=8).build()


def test_training_goes_on_when_a_node_is_lost(ray_cluster: RayCluster) -> None:
    ray = ray_cluster.ray
    # Fill the two nodes' CPUs, so both runners land on a third node, then lose that node.
    holders = ray_cluster.fill_cpus()
    ray_cluster.add_node(THIRD_IP)
    config = _config(SlowCartPole, backend="ray", num_cpus_per_env_runner=0.5)
    with config.env_runners(sample_timeout_s=20).build() as algo:
        assert algo.runners is not None
        assert algo.runners.nodes == [THIRD_IP, THIRD_IP]
        first = algo.train()
        for holder in holders:
            ray.kill(holder)
        killer = threading.Timer(0.05, ray_cluster.kill_raylet, (THIRD_IP,))
        killer.start()
        results = [algo.train() for _ in range(2)]
        killer.join()
        survivors = {ray_cluster.head_ip, ray_cluster.second_ip}
        assert set(algo.runners.nodes) <= survivors
    assert first["env_runners"]["episodes_failed"] == 0
    last = results[-1]["env_runners"]
    assert last["episodes_failed"] == 4 and last["num_env_runner_restarts"] == 2
    assert last["num_healthy_env_runners"] == 2
    assert results[-1]["training_iteration"] == 3


THIRD_IP = "127.0.0.4"
