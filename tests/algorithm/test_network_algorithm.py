"""The Algorithm without environments (``rlserve serve``'s): network clients are its only source."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from rlserve import PolicyClient
from rlserve.algorithm import Algorithm, PPOConfig
from rlserve.algorithm.algorithm import RESULT_KEYS
from rlserve.algorithm.network import NetworkAlgorithm
from rlserve.algorithm.network_config import server_config_of, serving_config
from rlserve.errors import ConfigError
from rlserve.learners.dqn_config import DQNSettings
from rlserve.learners.ppo_config import PPOSettings
from rlserve.protocol.mapping import PolicyMapping
from rlserve.run.checkpoints import checkpoints_in
from rlserve.server.config import ServerConfig
from rlserve.server.policies import PolicySpec

ENV = gym.make("CartPole-v1")
OBS, ACT = ENV.observation_space, ENV.action_space


def config(run_dir: Path, **training: Any) -> PPOConfig:
    return (
        PPOConfig()
        .environment(observation_space=OBS, action_space=ACT)
        .training(
            train_batch_size=256,
            minibatch_size=128,
            num_epochs=2,
            min_env_steps_per_iteration=512,
            model={"fcnet_hiddens": [16]},
            **training,
        )
        .serving(host="127.0.0.1", port=0)
        .reporting(run_dir=str(run_dir), name="net")
        .debugging(seed=1)
    )


class Simulator(threading.Thread):
    """A remote-inference CartPole client playing until stopped."""

    def __init__(self, address: str, seed: int):
        super().__init__(daemon=True)
        self.client = PolicyClient(address, "remote")
        self.seed = seed
        self.halt = threading.Event()

    def run(self) -> None:
        env = gym.make("CartPole-v1")
        episode = 0
        while not self.halt.is_set():
            obs, _ = env.reset(seed=self.seed + episode)
            episode += 1
            episode_id = self.client.start_episode()
            done = False
            while not done:
                obs, reward, terminated, truncated, _ = env.step(
                    self.client.get_action(episode_id, obs)
                )
                self.client.log_returns(episode_id, float(reward))
                done = terminated or truncated
            self.client.end_episode(episode_id, obs, truncated=not terminated)

    def stop(self) -> None:
        self.halt.set()
        self.join(60)
        self.client.close()


@pytest.fixture
def simulated(tmp_path: Path) -> Iterator[tuple[NetworkAlgorithm, Simulator]]:
    algo = config(tmp_path).build()
    assert isinstance(algo, NetworkAlgorithm) and algo.address is not None
    simulator = Simulator(algo.address, seed=0)
    simulator.start()
    yield algo, simulator
    simulator.stop()
    algo.stop()


def get(result: dict[str, Any], key: str) -> Any:
    for part in key.split("/"):
        result = result[part]
    return result


@pytest.mark.timeout(240)
def test_train_waits_for_the_learner_and_reports_every_key(
    simulated: tuple[NetworkAlgorithm, Simulator],
) -> None:
    algo, _ = simulated
    first, second = algo.train(), algo.train()
    for result in (first, second):
        for key in RESULT_KEYS:
            if key.startswith("learners/"):
                assert set(result["learners"]) == {"default"}
            else:
                get(result, key)
    trained = [r["learners"]["default"]["steps_trained"] for r in (first, second)]
    assert trained[0] >= 512 and trained[1] >= trained[0] + 512
    assert second["training_iteration"] == 2
    assert second["env_runners"]["num_env_steps_sampled_lifetime"] > 1024
    assert np.isfinite(second["env_runners"]["episode_return_mean"])
    assert algo.compute_single_action(OBS.sample()) in (0, 1)
    assert len(algo.compute_actions(np.stack([OBS.sample() for _ in range(3)]))) == 3


@pytest.mark.timeout(240)
def test_save_checkpoints_into_the_run_folder_and_from_checkpoint_resumes(
    simulated: tuple[NetworkAlgorithm, Simulator], tmp_path: Path
) -> None:
    algo, simulator = simulated
    algo.train()
    folder = algo.save()
    assert folder == algo.folder.path
    assert checkpoints_in(folder / "checkpoints")
    with pytest.raises(ConfigError, match="run folder"):
        algo.save(tmp_path / "elsewhere")
    with pytest.raises(ConfigError, match="from_checkpoint"):
        algo.restore(folder)
    with pytest.raises(ConfigError, match="training_enabled=False"):
        algo.evaluate()
    served = algo.policy_server.stats.policy_versions["default"]
    simulator.stop()
    algo.stop()

    resumed = Algorithm.from_checkpoint(folder)
    try:
        assert isinstance(resumed, NetworkAlgorithm)
        assert resumed.folder.path == folder
        assert resumed.policy_server.stats.policy_versions["default"] >= served
        assert resumed.compute_single_action(OBS.sample()) in (0, 1)
    finally:
        resumed.stop()


def test_a_server_config_survives_the_trip_through_the_algorithm_config(tmp_path: Path) -> None:
    server = ServerConfig(
        host="127.0.0.1",
        port=0,
        http_port=0,
        token="secret-token-1234",
        run_dir=str(tmp_path),
        name="trip",
        fragment_length=50,
        idle_timeout=12.0,
        max_sample_queue_steps=1234,
        checkpoint_every=5,
        keep_checkpoints=2,
        metrics_interval=0.5,
        seed=7,
        progress=False,
        max_frame_bytes=1 << 20,
        http_allowed_origins=("http://localhost:3000",),
        sync_reports=True,
    )
    ppo = PPOSettings(lr=1e-4, train_batch_size=1024, hidden=(32, 32), seed=7)
    policies = {
        "red": PolicySpec("red", OBS, ACT, {"lr": 3e-4}),
        "blue": PolicySpec("blue", OBS, ACT),
    }
    mapping = PolicyMapping([("red_*", "red"), ("blue_*", "blue")], policies)
    config = serving_config(server, ppo, policies, mapping)
    assert server_config_of(config) == server
    assert config.ppo_settings() == ppo
    assert config.policy_mapping == mapping.rules
    assert config.policies == {"red": {"lr": 3e-4}, "blue": {}}


def test_a_server_config_of_mixed_policies_keeps_each_policys_algorithm() -> None:
    """``rlserve serve`` with a PPO and a DQN policy: each keeps its algorithm and settings (its
    algorithm's top table, then its overrides) through the Algorithm config."""
    ppo = PPOSettings(lr=1e-4, train_batch_size=1024)
    dqn = DQNSettings(learning_starts=300, lr=2e-3)
    policies = {
        "red": PolicySpec("red", OBS, ACT, {"lr": 3e-4}),
        "green": PolicySpec("green", OBS, ACT, {"buffer_size": 5000}, algo="dqn"),
    }
    config = serving_config(ServerConfig(), ppo, policies, None, {"dqn": dqn})
    assert config.algorithm_of("red") == "ppo" and config.algorithm_of("green") == "dqn"
    assert config.used_algorithms() == ["ppo", "dqn"]
    assert config.policy_settings("ppo", config.policies["red"]).lr == 3e-4
    green = config.policy_settings("dqn", config.policies["green"])
    assert isinstance(green, DQNSettings)
    assert (green.lr, green.learning_starts, green.buffer_size) == (2e-3, 300, 5000)
    # RLlib's tuple form: the overrides dict names the algorithm.
    tuples = PPOConfig().multi_agent(
        policies={"red": (None, OBS, ACT, {}), "green": (None, OBS, ACT, {"algo": "dqn"})}
    )
    assert tuples.policy_specs["green"].algo == "dqn" and tuples.policies["green"] == {}
    with pytest.raises(ConfigError, match="disagree; name the algorithm once"):
        PPOConfig().multi_agent(
            policies={"g": PolicySpec("g", OBS, ACT, {"algo": "sac"}, algo="dqn")}
        )


def test_rllib_style_policy_tuples_declare_a_multi_policy_server(tmp_path: Path) -> None:
    algo = (
        PPOConfig()
        .multi_agent(
            policies={"red": (None, OBS, ACT, {"lr": 1e-4}), "blue": (None, OBS, ACT, {})},
            policy_mapping={"red_*": "red", "blue_*": "blue"},
        )
        .serving(port=0)
        .reporting(run_dir=str(tmp_path), name="teams")
        .build()
    )
    try:
        assert isinstance(algo, NetworkAlgorithm)
        assert sorted(algo.specs) == ["blue", "red"]
        assert algo.specs["red"].ppo == {"lr": 1e-4}
        assert "[policies.red]" in (algo.folder.path / "config.toml").read_text()
        assert algo.compute_single_action(OBS.sample(), policy_id="blue") in (0, 1)
    finally:
        algo.stop()


@pytest.mark.parametrize(
    ("make", "fix"),
    [
        (lambda: PPOConfig().build(), r"\.serving\(port"),
        (lambda: PPOConfig().serving(port=0).build(), "observation_space=..., action_space"),
        (lambda: PPOConfig().environment(observation_space="Box(4)"), "gymnasium space"),
        (lambda: PPOConfig().serving(server={"run_dir": "x"}), r"reporting\(run_dir"),
        (lambda: PPOConfig().serving(port="abc"), r"serving\(\): option 'port' must be an int"),
        (lambda: PPOConfig().serving(prot=1), r"serving\(\): .*'prot'.*did you mean 'port'"),
        (lambda: PPOConfig().env_runners(sample_timeout_s="x"), "sample_timeout_s must be sec"),
        (lambda: PPOConfig().multi_agent(policies={"a": (OBS, ACT)}), "RLlib's PolicySpec"),
    ],
)
def test_mistakes_are_refused_with_the_fix(make: Any, fix: str) -> None:
    with pytest.raises(ConfigError, match=fix):
        make()


@pytest.mark.timeout(180)
def test_train_raises_when_the_learner_keeps_dying(tmp_path: Path) -> None:
    broken = tmp_path / "not_a_checkpoint.pt"
    broken.write_bytes(b"not a checkpoint")
    spec = PolicySpec("default", OBS, ACT, init_checkpoint=str(broken))
    algo = (
        PPOConfig()
        .multi_agent(policies={"default": spec})
        .serving(port=0)
        .reporting(run_dir=str(tmp_path), name="broken")
        .build()
    )
    try:
        with pytest.raises(RuntimeError, match=r"learner process died 3 times.*init_checkpoint"):
            algo.train()
        assert algo.address is not None  # serving goes on
    finally:
        algo.stop()
