"""Sub-environments as Ray actors (``remote_worker_envs=True`` under Ray) on the two-node
loopback cluster: a killed or hung copy restarted and its episodes counted, determinism with a
seed, copies inside a Ray env runner, placement by resource, a resource no node has refused,
multi-agent copies as actors."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
import pytest

from rlserve import PPOConfig
from rlserve.algorithm.algorithm import Algorithm
from rlserve.env import ALL_AGENTS, MultiAgentEnv
from rlserve.errors import ConfigError

if TYPE_CHECKING:
    from conftest import RayCluster

pytestmark = pytest.mark.timeout(180)

SMALL = {
    "train_batch_size": 128,
    "minibatch_size": 64,
    "num_epochs": 1,
    "min_env_steps_per_iteration": 128,
    "model": {"fcnet_hiddens": [16]},
}


class FailsOnceInActor(gym.Wrapper):
    """CartPole whose copy in the second actor fails once at step 30 (killed, or hangs)."""

    def __init__(self, config: Any) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self.marker = Path(config["marker"])
        self.mode = config["mode"]
        self.mine = config.worker_index == 2
        self.steps = 0

    def step(self, action: Any) -> Any:
        self.steps += 1
        if self.mine and self.steps == 30 and not self.marker.exists():
            self.marker.touch()
            if self.mode == "hang":
                time.sleep(3600)
            os.kill(os.getpid(), signal.SIGKILL)  # the actor's process dies
        return self.env.step(action)


class WhereAmI(gym.Wrapper):
    """CartPole that leaves a file named after its node and process in ``config["dir"]``."""

    def __init__(self, config: Any) -> None:
        super().__init__(gym.make("CartPole-v1"))
        import ray

        node = ray.util.get_node_ip_address()
        (Path(config["dir"]) / f"{node}_{os.getpid()}_{config.worker_index}").touch()


class Pair(MultiAgentEnv):
    """Two agents see a sign; ``a`` scores for copying it, ``b`` for the opposite. Each copy
    leaves a file named after its node and process in ``config["dir"]``."""

    def __init__(self, config: Any) -> None:
        import ray

        self.possible_agents = ["a", "b"]
        space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.observation_spaces = dict.fromkeys(self.possible_agents, space)
        self.action_spaces = dict.fromkeys(self.possible_agents, gym.spaces.Discrete(2))
        node = ray.util.get_node_ip_address() if ray.is_initialized() else "none"
        (Path(config["dir"]) / f"{node}_{os.getpid()}_{config.worker_index}").touch()

    def _obs(self) -> Any:
        self.sign = int(self.np_random.integers(0, 2))
        value = np.array([1.0 if self.sign else -1.0], np.float32)
        return {"a": value, "b": value}

    def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
        gym.Env.reset(self, seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action_dict: dict[str, Any]) -> Any:
        rewards = {
            "a": float(action_dict["a"] == self.sign),
            "b": float(action_dict["b"] != self.sign),
        }
        self.t += 1
        return self._obs(), rewards, {ALL_AGENTS: self.t >= 8}, {ALL_AGENTS: False}, {}


def _config(env: Any = "CartPole-v1", **runners: Any) -> Any:
    options = {"num_env_runners": 0, "num_cpus_per_remote_env": 0.25, **runners}
    return (
        PPOConfig()
        .environment(env)
        .env_runners(backend="ray", remote_worker_envs=True, num_envs_per_env_runner=2, **options)
        .training(**SMALL)
        .resources(device="cpu")
        .debugging(seed=11)
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


@pytest.mark.parametrize("mode", ["kill", "hang"])
def test_a_killed_or_hung_copy_actor_is_restarted_and_training_goes_on(
    ray_cluster: RayCluster, tmp_path: Path, mode: str
) -> None:
    marker = tmp_path / "failed"
    config = (
        _config(FailsOnceInActor)
        .environment(env_config={"marker": str(marker), "mode": mode})
        .env_runners(sample_timeout_s=1.0)
    )
    with config.build() as algo:
        results = [algo.train() for _ in range(3)]
        restarts = algo.source.restarts  # type: ignore[attr-defined]
    assert marker.exists()
    assert restarts == 1
    last = results[-1]["env_runners"]
    # The copy's episode in flight is lost; training went on to the last round.
    assert last["episodes_failed"] == 1
    assert results[-1]["training_iteration"] == 3
    assert last["num_env_steps_sampled_lifetime"] >= 3 * 128


def test_ray_sub_env_sampling_is_deterministic_with_a_seed(ray_cluster: RayCluster) -> None:
    runs = []
    for _ in range(2):
        with _config(envs_per_process=1).build() as algo:
            results = [_strip_times(algo.train()) for _ in range(2)]
            runs.append((results, _weights(algo)))
    (results_a, weights_a), (results_b, weights_b) = runs
    assert results_a[-1]["env_runners"]["num_env_steps_sampled_lifetime"] >= 2 * 128
    assert results_a == results_b
    assert weights_a == weights_b


def test_copies_step_in_actors_placed_by_resource_inside_a_ray_runner(
    ray_cluster: RayCluster, tmp_path: Path
) -> None:
    config = _config(
        WhereAmI,
        num_env_runners=1,
        num_cpus_per_env_runner=0.25,
        num_cpus_per_remote_env=0,
        custom_resources_per_remote_env={"sim": 1},
    ).environment(env_config={"dir": str(tmp_path)})
    with config.build() as algo:
        assert algo.runners is not None
        runner_pid = algo.runners.pids[0]
        result = algo.train()
    assert result["env_runners"]["num_env_steps_sampled"] >= 128
    made = [name.split("_") for name in os.listdir(tmp_path)]
    copies = [(node, int(pid)) for node, pid, worker in made if worker != "0"]
    # Two copies, each in an actor of its own (not the runner's process), both on the node
    # with "sim"; worker 0 is the Algorithm's own copy, for its spaces.
    assert len(copies) == 2
    assert {node for node, _ in copies} == {ray_cluster.second_ip}
    assert len({pid for _, pid in copies}) == 2 and runner_pid not in {pid for _, pid in copies}


def test_a_resource_no_node_has_for_the_copies_is_refused_up_front(
    ray_cluster: RayCluster,
) -> None:
    with pytest.raises(ConfigError, match="custom_resources_per_remote_env"):
        _config(custom_resources_per_remote_env={"nowhere": 1}).build()


def test_multi_agent_copies_step_in_actors_on_the_cluster(
    ray_cluster: RayCluster, tmp_path: Path
) -> None:
    config = (
        _config(
            Pair,
            num_cpus_per_remote_env=0,
            custom_resources_per_remote_env={"sim": 1},
        )
        .environment(env_config={"dir": str(tmp_path)})
        .multi_agent(
            policies={"p1": {}, "p2": {}},
            policy_mapping_fn=lambda agent_id, episode, **kw: "p1" if agent_id == "a" else "p2",
        )
        .training(train_batch_size=64, minibatch_size=32)  # each policy gets half the steps
    )
    with config.build() as algo:
        results = [algo.train() for _ in range(2)]
        restarts = algo.source.restarts  # type: ignore[attr-defined]
    last = results[-1]
    for pid in ("p1", "p2"):
        assert last["learners"][pid]["updates"] >= 1
    assert last["env_runners"]["num_episodes"] > 0 and restarts == 0
    made = [name.split("_") for name in os.listdir(tmp_path)]
    copies = [(node, int(pid)) for node, pid, worker in made if worker != "0"]
    # Two copies, each in an actor of its own on the node with "sim", not in this process.
    assert len(copies) == 2
    assert {node for node, _ in copies} == {ray_cluster.second_ip}
    assert len({pid for _, pid in copies}) == 2 and os.getpid() not in {p for _, p in copies}
