"""An Algorithm holds its run folder: a second one on the same folder (a served run resumed
while it serves, a training run's folder taken over) is refused until the first stops."""

from __future__ import annotations

import os
from pathlib import Path

import gymnasium as gym
import pytest

from rlserve.algorithm import Algorithm, PPOConfig
from rlserve.errors import ConfigError
from rlserve.run.run_folder import IN_USE_RESUME, RunFolder

pytestmark = pytest.mark.timeout(120)

ENV = gym.make("CartPole-v1")
SMALL = {"train_batch_size": 128, "minibatch_size": 64, "model": {"fcnet_hiddens": [8]}}


def test_a_served_run_cannot_be_resumed_while_it_serves(tmp_path: Path) -> None:
    served = (
        PPOConfig()
        .environment(observation_space=ENV.observation_space, action_space=ENV.action_space)
        .training(**SMALL)
        .serving(host="127.0.0.1", port=0)
        .reporting(run_dir=str(tmp_path), name="net")
        .build()
    )
    assert served.run is not None
    folder = served.run.path
    try:
        with pytest.raises(ConfigError) as refused:
            Algorithm.from_checkpoint(folder)
        assert str(refused.value).startswith(
            f"{folder} is in use by pid {os.getpid()}; stop that process first"
        )
        assert served.address is not None  # still serving
    finally:
        served.stop()
    resumed = Algorithm.from_checkpoint(folder)
    resumed.stop()


def test_a_training_runs_folder_is_not_taken_over_while_it_trains(tmp_path: Path) -> None:
    config = PPOConfig().environment("CartPole-v1").training(**SMALL).debugging(seed=2)
    first = config.copy().reporting(run_dir=str(tmp_path), name="a").build()
    second = config.copy().reporting(run_dir=str(tmp_path), name="b").build()
    assert first.run is not None and second.run is not None
    folder_a, folder_b = first.run.path, second.run.path
    try:
        with pytest.raises(ConfigError, match=f"{folder_a} is in use by pid {os.getpid()}"):
            second.use_run_folder(folder_a)
        assert second.run.path == folder_b  # refused: it keeps writing its own folder
    finally:
        first.stop()
    second.use_run_folder(folder_a)
    second.stop()
    # b was let go when the second moved to a, and a when it stopped.
    for folder in (folder_a, folder_b):
        RunFolder(folder).hold(IN_USE_RESUME).release()


def test_save_refuses_a_folder_another_process_writes_or_a_served_run(tmp_path: Path) -> None:
    config = PPOConfig().environment("CartPole-v1").training(**SMALL).debugging(seed=2)
    with config.build() as algo:
        held = tmp_path / "served"
        held.mkdir()
        lock = RunFolder(held).hold(IN_USE_RESUME)  # as a live server holds its run folder
        try:
            with pytest.raises(ConfigError, match=f"{held} is in use by pid .*another folder"):
                algo.save(held)
        finally:
            lock.release()
        assert not (held / "config.toml").exists()  # nothing of it was written
        (held / "config.toml").write_text("[server]\n")  # a stopped server's run
        (held / "spaces.json").write_text("{}")
        with pytest.raises(ConfigError, match="holds a run of rlserve serve"):
            algo.save(held)
        mine = algo.save(tmp_path / "mine")
        assert algo.save(mine) == mine  # its own checkpoint folder again: fine
