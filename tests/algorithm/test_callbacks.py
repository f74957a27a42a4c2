"""Callbacks on a hosted run, a served run (a real client over loopback) and their checkpoints."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

from rlserve import PolicyClient
from rlserve.algorithm import Callbacks, PPOConfig
from rlserve.algorithm.network import NetworkAlgorithm
from rlserve.errors import CallbackError, ConfigError

ENV = gym.make("CartPole-v1")
OBS, ACT = ENV.observation_space, ENV.action_space
SMALL = {
    "train_batch_size": 128,
    "minibatch_size": 64,
    "num_epochs": 1,
    "min_env_steps_per_iteration": 128,
    "model": {"fcnet_hiddens": [8]},
}


class Recorder(Callbacks):
    """Keeps every event it is told, in order."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.lock = threading.Lock()

    def _keep(self, name: str, **kwargs: Any) -> None:
        with self.lock:
            self.events.append((name, kwargs))

    def named(self, name: str) -> list[dict[str, Any]]:
        with self.lock:
            return [kwargs for event, kwargs in self.events if event == name]

    def on_algorithm_init(self, *, algorithm: Any, **kwargs: Any) -> None:
        self._keep("init", algorithm=algorithm)

    def on_train_result(self, *, algorithm: Any, result: dict[str, Any], **kwargs: Any) -> None:
        result["custom/seen_by_callback"] = 1.0
        self._keep("result", result=result)

    def on_episode_end(self, *, algorithm: Any, episode: Any, **kwargs: Any) -> None:
        self._keep("episode", episode=episode)

    def on_checkpoint(
        self, *, algorithm: Any, path: str, policy_id: str, version: int, **kwargs: Any
    ) -> None:
        self._keep("checkpoint", path=path, policy_id=policy_id, version=version)

    def on_algorithm_stop(self, *, algorithm: Any, **kwargs: Any) -> None:
        self._keep("stop", algorithm=algorithm)


class BrokenEpisodes(Callbacks):
    def on_episode_end(self, *, algorithm: Any, episode: Any, **kwargs: Any) -> None:
        raise ValueError("cannot log this episode")


class Broken(Callbacks):
    calls = 0

    def on_train_result(self, *, algorithm: Any, result: dict[str, Any], **kwargs: Any) -> None:
        Broken.calls += 1
        raise RuntimeError("the tracking server is down")


@pytest.mark.timeout(120)
def test_a_hosted_run_tells_results_episodes_and_checkpoints(tmp_path: Path) -> None:
    recorder = Recorder()
    algo = (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_envs_per_env_runner=2)
        .training(**SMALL)
        .debugging(seed=3)
        .callbacks([Broken, recorder])
        .build()
    )
    with algo:
        assert [e for e, _ in recorder.events] == ["init"]
        results = [algo.train(), algo.train()]
        folder = algo.save(tmp_path / "ckpt")
        assert algo.callbacks.failures == {"Broken.on_train_result": 2}
    told = recorder.named("result")
    assert [r["result"] for r in told] == results  # the same dicts, changed in place
    assert all(r["custom/seen_by_callback"] == 1.0 for r in results)
    episodes = [e["episode"] for e in recorder.named("episode")]
    assert episodes and {e.source for e in episodes} <= {"env-0", "env-1"}
    assert sum(r["env_runners"]["num_episodes"] for r in results) == len(episodes)
    assert all(e.length > 0 and e.policy_id == "default" for e in episodes)
    (checkpoint,) = recorder.named("checkpoint")
    assert checkpoint["policy_id"] == "default"
    assert Path(checkpoint["path"]).is_file()
    assert Path(checkpoint["path"]).is_relative_to(folder)
    assert checkpoint["version"] == algo.learners["default"].version >= 2
    assert [e for e, _ in recorder.events][-1] == "stop"
    assert len(recorder.named("stop")) == 1


@pytest.mark.timeout(120)
def test_a_raising_callback_does_not_stop_training_unless_fail_fast(tmp_path: Path) -> None:
    base = PPOConfig().environment("CartPole-v1").training(**SMALL).debugging(seed=3)
    with base.copy().callbacks(Broken).build() as algo:
        before = Broken.calls
        assert algo.train()["training_iteration"] == 1
        assert algo.train()["training_iteration"] == 2
        assert Broken.calls == before + 2
        assert algo.callbacks.failures == {"Broken.on_train_result": 2}
    failing = base.copy().callbacks(Broken, fail_fast=True).build()
    with failing, pytest.raises(CallbackError, match="the tracking server is down"):
        failing.train()


def test_callbacks_refuses_what_is_not_a_callbacks_class() -> None:
    with pytest.raises(ConfigError, match=r"subclass of rlserve\.algorithm\.Callbacks"):
        PPOConfig().callbacks(dict)
    with pytest.raises(ConfigError, match="cannot be imported"):
        PPOConfig().callbacks("no_such_package.anywhere:Callbacks")
    config = PPOConfig().callbacks(on_train_result=lambda result, **kw: None)
    assert len(config.callbacks_class) == 1


def play(address: str, episodes: int, done: threading.Event) -> None:
    """A remote-inference CartPole client: ``episodes`` episodes, then as many as asked."""
    env = gym.make("CartPole-v1")
    with PolicyClient(address, "remote") as client:
        played = 0
        while played < episodes or not done.is_set():
            obs, _ = env.reset(seed=played)
            episode_id = client.start_episode()
            over = False
            while not over:
                obs, reward, terminated, truncated, _ = env.step(client.get_action(episode_id, obs))
                client.log_returns(episode_id, float(reward))
                over = terminated or truncated
            client.end_episode(episode_id, obs, truncated=not terminated)
            played += 1


@pytest.mark.timeout(240)
def test_a_served_run_tells_client_episodes_results_and_learner_checkpoints(
    tmp_path: Path,
) -> None:
    recorder = Recorder()
    algo = (
        PPOConfig()
        .environment(observation_space=OBS, action_space=ACT)
        .training(**SMALL)
        .serving(host="127.0.0.1", port=0)
        .reporting(run_dir=str(tmp_path), name="served")
        .debugging(seed=1)
        .callbacks([BrokenEpisodes, recorder])
        .build()
    )
    assert isinstance(algo, NetworkAlgorithm) and algo.address is not None
    callbacks = algo.callbacks
    done = threading.Event()
    client = threading.Thread(target=play, args=(algo.address, 3, done), daemon=True)
    client.start()
    try:
        result = algo.train()
        saved = algo.save()
    finally:
        done.set()
        client.join(60)
        algo.stop()
    assert recorder.named("result")[0]["result"] is result
    episodes = [e["episode"] for e in recorder.named("episode")]
    assert len(episodes) >= 3
    # The raising callback came first: every episode still reached the recorder after it.
    assert callbacks.failures == {"BrokenEpisodes.on_episode_end": len(episodes)}
    assert all(e.source.startswith("client-") for e in episodes)
    assert len({e.source for e in episodes}) == 1  # one client
    assert all(e.length > 0 and e.episode_return == e.length for e in episodes)
    checkpoints = recorder.named("checkpoint")
    assert checkpoints and all(c["policy_id"] == "default" for c in checkpoints)
    assert all(Path(c["path"]).is_relative_to(saved) for c in checkpoints)
    assert max(c["version"] for c in checkpoints) >= 1
    names = [e for e, _ in recorder.events]
    assert names[0] == "init" and names[-1] == "stop" and names.count("stop") == 1


@pytest.mark.timeout(240)
def test_an_attached_server_tells_its_clients_episodes_with_the_environments(
    tmp_path: Path,
) -> None:
    recorder = Recorder()
    algo = (
        PPOConfig()
        .environment("CartPole-v1")
        .training(**SMALL)
        .serving(host="127.0.0.1", port=0)
        .reporting(run_dir=str(tmp_path), name="attached")
        .debugging(seed=2)
        .callbacks(recorder)
        .build()
    )
    done = threading.Event()
    assert algo.address is not None
    client = threading.Thread(target=play, args=(algo.address, 2, done), daemon=True)
    client.start()
    try:
        sources: set[str] = set()
        for _ in range(40):
            algo.train()
            sources = {e["episode"].source for e in recorder.named("episode")}
            if any(s.startswith("client-") for s in sources):
                break
    finally:
        done.set()
        client.join(60)
        algo.stop()
    assert "env-0" in sources
    assert any(s.startswith("client-") for s in sources)


@pytest.mark.timeout(240)
def test_a_served_run_with_fail_fast_raises_from_train(tmp_path: Path) -> None:
    algo = (
        PPOConfig()
        .environment(observation_space=OBS, action_space=ACT)
        .training(**SMALL)
        .serving(host="127.0.0.1", port=0)
        .reporting(run_dir=str(tmp_path), name="failing")
        .debugging(seed=1)
        .callbacks(BrokenEpisodes, fail_fast=True)
        .build()
    )
    assert algo.address is not None
    done = threading.Event()
    client = threading.Thread(target=play, args=(algo.address, 1, done), daemon=True)
    client.start()
    try:
        with pytest.raises(CallbackError, match="cannot log this episode"):
            algo.train()
    finally:
        done.set()
        client.join(60)
        algo.stop()  # the error was raised once: stopping is clean
