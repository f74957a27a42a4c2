"""Without Ray installed: asking for it is a one-line error naming the install, and the env
runners are processes as before."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from rlserve import PPOConfig
from rlserve.algorithm.saved_config import load_config, save_config
from rlserve.errors import ConfigError


@pytest.fixture
def no_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``import ray`` fail, as when it is not installed."""
    monkeypatch.setitem(sys.modules, "ray", None)


def test_asking_for_ray_without_it_names_the_install(no_ray: None) -> None:
    with pytest.raises(ConfigError, match=r"pip install -e '\.\[ray\]' in the checkout") as caught:
        PPOConfig().environment("CartPole-v1").env_runners(num_env_runners=2, backend="ray")
    assert "\n" not in str(caught.value)


@pytest.mark.timeout(60)
def test_without_ray_runners_are_processes(no_ray: None) -> None:
    config = (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=2)
        .training(train_batch_size=128, minibatch_size=64, num_epochs=1)
        .training(min_env_steps_per_iteration=128, model={"fcnet_hiddens": [16]})
        .resources(device="cpu")
    )
    with config.build() as algo:
        assert algo.runners is not None
        assert algo.runners.nodes == [None, None] and algo.runners.actors == []
        assert all(pid is not None for pid in algo.runners.pids)
        assert algo.train()["env_runners"]["num_healthy_env_runners"] == 2


def test_backend_and_resources_are_checked() -> None:
    runners = PPOConfig().env_runners
    with pytest.raises(ConfigError, match="'ray', 'process' or 'auto'"):
        runners(backend="slurm")
    with pytest.raises(ConfigError, match="num_cpus_per_env_runner"):
        runners(num_cpus_per_env_runner=-1)
    with pytest.raises(ConfigError, match="num_cpus_per_env_runner"):
        runners(custom_resources_per_env_runner={"CPU": 1})
    with pytest.raises(ConfigError, match=r"\{'sim': 1\}"):
        runners(custom_resources_per_env_runner={"sim": -1})


def test_ray_is_not_left_initialised_for_other_modules() -> None:
    ray = sys.modules.get("ray")
    assert ray is None or not ray.is_initialized()


def test_placement_settings_are_saved_with_a_checkpoint(tmp_path: Path) -> None:
    config = PPOConfig().environment("CartPole-v1")
    config.env_runners(
        backend="process", num_cpus_per_env_runner=0.5, custom_resources_per_env_runner={"sim": 1}
    )
    save_config(config, tmp_path)
    loaded = load_config(tmp_path)
    assert loaded.env_runner_backend == "process"
    assert loaded.num_cpus_per_env_runner == 0.5
    assert loaded.custom_resources_per_env_runner == {"sim": 1.0}


def test_backend_ray_before_ray_init_names_the_fix() -> None:
    ray = pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[ray]'")
    assert not ray.is_initialized()
    config = PPOConfig().environment("CartPole-v1").env_runners(num_env_runners=1, backend="ray")
    with pytest.raises(ConfigError, match=r"call ray.init\(address=\.\.\.\) first"):
        config.build()


@pytest.mark.timeout(60)
def test_without_ray_learner_and_sub_environments_stay_on_this_machine(no_ray: None) -> None:
    from rlserve.env.subprocess import ProcessVectorSource
    from rlserve.processes.supervisor import ProcessSupervisor

    config = (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_envs_per_env_runner=2, remote_worker_envs=True)
        .learners(num_gpus_per_learner=1, custom_resources_per_learner={"trainer": 1})
        .training(train_batch_size=128, minibatch_size=64, num_epochs=1)
        .training(min_env_steps_per_iteration=128, model={"fcnet_hiddens": [16]})
        .resources(device="cpu")
    )
    with config.build() as algo:
        assert type(algo.learners["default"]).__name__ == "PPOLearner"
        assert isinstance(algo.source, ProcessVectorSource)
        assert isinstance(algo.source._workers.supervisor, ProcessSupervisor)
        algo.train()
        assert algo.learners["default"].version == 1
