"""The Algorithm API: result keys, acting, evaluation, config errors, checkpoints, and every kind
of environment (multi-agent, ExternalEnv, crashing sub-processes) trained through it."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from algorithm_toys import GuessSign, Mimic, strip_times

from rlserve import PPOConfig
from rlserve.algorithm.algorithm import RESULT_KEYS, Algorithm
from rlserve.errors import ConfigError, SpaceError

SMALL = {
    "train_batch_size": 256,
    "minibatch_size": 64,
    "num_epochs": 2,
    "min_env_steps_per_iteration": 256,
    "model": {"fcnet_hiddens": [32]},
}


def _config(env: Any = "CartPole-v1", num_envs: int = 4, **training: Any) -> Any:
    return (
        PPOConfig()
        .environment(env)
        .env_runners(num_envs_per_env_runner=num_envs)
        .training(**{**SMALL, **training})
        .resources(device="cpu")
        .debugging(seed=3)
    )


def _get(result: dict[str, Any], key: str) -> Any:
    value: Any = result
    for part in key.split("/"):
        value = value[part]
    return value


# -- results, acting, evaluation -------------------------------------------------------------


@pytest.mark.timeout(60)
def test_result_has_every_documented_key_and_counters_advance() -> None:
    with _config().build() as algo:
        first = algo.train()
        second = algo.train()
    for result in (first, second):
        for key in RESULT_KEYS:
            if key.startswith("learners/"):
                assert set(result["learners"]) == {"default"}
                assert "policy_loss" in result["learners"]["default"]
            else:
                _get(result, key)
    assert (first["training_iteration"], second["training_iteration"]) == (1, 2)
    runners1, runners2 = first["env_runners"], second["env_runners"]
    assert runners1["num_env_steps_sampled"] >= 256
    assert (
        runners2["num_env_steps_sampled_lifetime"]
        == runners1["num_env_steps_sampled_lifetime"] + runners2["num_env_steps_sampled"]
    )
    assert second["num_env_steps_sampled_lifetime"] == second["timesteps_total"]
    assert second["timesteps_total"] == runners2["num_env_steps_sampled_lifetime"]
    assert second["learners"]["default"]["updates"] > first["learners"]["default"]["updates"]
    assert second["time_total_s"] >= first["time_total_s"]
    assert second["episode_return_mean"] == runners2["episode_return_mean"]
    assert second["episode_reward_mean"] == runners2["episode_return_mean"]
    assert runners2["episodes_failed"] == 0 and second["network"]["num_env_steps"] == 0


@pytest.mark.timeout(60)
def test_compute_actions_and_evaluate_on_discrete_cartpole() -> None:
    with _config().evaluation(evaluation_duration=3).build() as algo:
        algo.train()
        space = gym.spaces.Discrete(2)
        obs, _ = gym.make("CartPole-v1").reset(seed=0)
        action = algo.compute_single_action(obs)
        assert isinstance(action, int) and space.contains(action)
        explored = algo.compute_single_action(obs, explore=True)
        assert space.contains(explored)
        batch = np.stack([obs, obs * 0.5, -obs]).astype(np.float64)  # float64 is accepted
        actions = algo.compute_actions(batch)
        assert len(actions) == 3 and all(space.contains(a) for a in actions)
        before = (algo.iteration, algo.env_steps_sampled, algo.episodes_total)
        learner_updates = algo.learners["default"].counters()["updates"]
        evaluation = algo.evaluate()
        with pytest.raises(SpaceError, match=r"as env.reset\(\) returns \(obs, info\)"):
            algo.compute_single_action(gym.make("CartPole-v1").reset(seed=0))
        with pytest.raises(SpaceError, match=r"item 1 has shape \(1,\), item 0 has shape \(2,\)"):
            algo.compute_single_action([[1.0, 2.0], [3.0]])
        for episodes in (0, -1, "2"):
            with pytest.raises(ValueError, match="a whole number of episodes, 1 or more"):
                algo.evaluate(episodes=episodes)  # type: ignore[arg-type]
        assert (algo.iteration, algo.env_steps_sampled, algo.episodes_total) == before
        assert algo.learners["default"].counters()["updates"] == learner_updates
    runners = evaluation["evaluation"]["env_runners"]
    assert set(runners) == {
        "episode_return_mean",
        "episode_return_min",
        "episode_return_max",
        "episode_len_mean",
        "num_episodes",
    }
    assert runners["num_episodes"] == 3
    assert runners["episode_return_min"] <= runners["episode_return_mean"]
    assert runners["episode_return_mean"] <= runners["episode_return_max"]
    # CartPole gives 1 per step: a return is the episode's length.
    assert 1 <= runners["episode_return_min"] <= 500
    with pytest.raises(ConfigError, match="no policy 'nope'"):
        algo.compute_single_action(obs, policy_id="nope")


@pytest.mark.timeout(60)
def test_compute_actions_on_a_box_action_env() -> None:
    with _config("Pendulum-v1", num_envs=2).build() as algo:
        algo.train()
        space = gym.make("Pendulum-v1").action_space
        obs, _ = gym.make("Pendulum-v1").reset(seed=0)
        action = algo.compute_single_action(obs)
        assert np.asarray(action).shape == (1,) and space.contains(np.float32(action))
        actions = algo.compute_actions(np.stack([obs, -obs]), explore=True)
        assert len(actions) == 2
        for a in actions:
            assert space.contains(np.asarray(a, np.float32))
        evaluation = algo.evaluate(1)
    assert evaluation["evaluation"]["env_runners"]["episode_len_mean"] == 200


# -- config ----------------------------------------------------------------------------------


def test_unknown_training_key_names_the_valid_ones() -> None:
    with pytest.raises(ConfigError) as err:
        PPOConfig().training(lamda=0.9)
    text = str(err.value)
    assert "'lamda'" in text
    for name in ("lambda_", "num_sgd_iter", "gae_lambda", "train_batch_size", "model"):
        assert name in text


def test_build_without_env_and_bad_env_config_are_refused() -> None:
    with pytest.raises(ConfigError, match="no environment"):
        PPOConfig().build()
    with pytest.raises(ConfigError, match="env_config must be a dict"):
        PPOConfig().environment("CartPole-v1", env_config=[("a", 1)])  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="model setting 'use_attention'"):
        PPOConfig().training(model={"use_attention": True})
    with pytest.raises(ConfigError, match="conv_filters is empty"):
        PPOConfig().training(model={"conv_filters": []})
    with pytest.raises(ConfigError, match="num_envs_per_env_runner"):
        PPOConfig().env_runners(num_envs_per_env_runner=0)


@pytest.mark.timeout(60)
def test_rllib_names_land_in_the_learner_settings() -> None:
    config = _config().training(
        lambda_=0.9, num_sgd_iter=3, sgd_minibatch_size=32, model={"fcnet_hiddens": [32]}
    )
    with config.build() as algo:
        settings = algo.learners["default"].config
    assert settings.gae_lambda == 0.9
    assert settings.num_epochs == 3
    assert settings.minibatch_size == 32
    assert settings.hidden == (32,)
    assert settings.train_batch_size == 256


def test_hosted_and_served_ppo_take_the_same_defaults() -> None:
    """One set chosen on the learning suite: hosted PPO starts from the settings' own defaults."""
    hosted = PPOConfig().environment("CartPole-v1").algo_settings()
    assert hosted == PPOConfig().algo_settings()  # a network-only Algorithm: the server's
    schedule = (hosted.train_batch_size, hosted.minibatch_size, hosted.num_epochs, hosted.lr)
    assert schedule == (2048, 64, 10, 3e-4)
    assert (hosted.gamma, hosted.gae_lambda, hosted.clip_coef) == (0.99, 0.95, 0.2)
    assert hosted.normalize_observations is None  # automatic: by the observation space


# -- checkpoints -----------------------------------------------------------------------------


def _weights(algo: Algorithm) -> dict[str, np.ndarray]:
    return {k: v.copy() for k, v in algo.learners["default"].weights().arrays.items()}


def _learner_state(algo: Algorithm) -> tuple[dict[str, torch.Tensor], Any]:
    learner = algo.learners["default"]
    model = {k: v.detach().clone() for k, v in learner.model.state_dict().items()}
    return model, learner.optimizer.state_dict()


def _assert_same_learner_state(a: Any, b: Any) -> None:
    model_a, opt_a = a
    model_b, opt_b = b
    assert model_a.keys() == model_b.keys()
    for key in model_a:
        assert torch.equal(model_a[key], model_b[key]), key
    assert opt_a["param_groups"] == opt_b["param_groups"]
    assert opt_a["state"].keys() == opt_b["state"].keys()
    for index, state in opt_a["state"].items():
        for name, value in state.items():
            assert torch.equal(value, opt_b["state"][index][name]), (index, name)


@pytest.mark.timeout(90)
def test_save_restore_and_from_checkpoint_continue_identically(tmp_path: Path) -> None:
    """Two restores of one checkpoint continue training exactly alike.

    Episodes in flight at save() are not in the checkpoint: a restored Algorithm starts fresh
    episodes with environments reset from a seed derived from (seed, iteration), and samples
    with policy RNGs seeded the same way; the learner's weights, optimiser state, counters and
    torch RNG come from the checkpoint. So restoring the same checkpoint twice (into
    ``from_checkpoint`` and into a freshly built Algorithm) must give bitwise equal results.
    It is not the same as never stopping (those in-flight episodes differ), which nobody can
    promise without pickling the environments.
    """
    config = _config()
    with config.build() as algo:
        algo.train()
        algo.train()
        path = algo.save(tmp_path / "ckpt")
        saved_state = _learner_state(algo)
        saved_weights = _weights(algo)
        saved_counters = algo.learners["default"].counters()
        saved_steps = algo.env_steps_sampled

    restored_a = Algorithm.from_checkpoint(path)
    restored_b = config.build()
    restored_b.restore(path)
    runs = []
    try:
        for restored in (restored_a, restored_b):
            assert restored.iteration == 2 and restored.env_steps_sampled == saved_steps
            assert restored.learners["default"].counters() == saved_counters
            _assert_same_learner_state(_learner_state(restored), saved_state)
            for key, value in _weights(restored).items():
                np.testing.assert_array_equal(value, saved_weights[key])
        for restored in (restored_a, restored_b):
            results = [strip_times(restored.train()) for _ in range(2)]
            runs.append((results, _weights(restored), _learner_state(restored)))
    finally:
        restored_a.stop()
        restored_b.stop()
    (results_a, weights_a, state_a), (results_b, weights_b, state_b) = runs
    assert [r["training_iteration"] for r in results_a] == [3, 4]
    assert results_a[0]["num_env_steps_sampled_lifetime"] > saved_steps
    assert results_a == results_b
    assert weights_a.keys() == weights_b.keys()
    for key in weights_a:
        assert weights_a[key].tobytes() == weights_b[key].tobytes(), key
    _assert_same_learner_state(state_a, state_b)
    # ...and training did move on from the saved weights.
    assert any(not np.array_equal(weights_a[k], saved_weights[k]) for k in saved_weights)


def test_restore_of_a_folder_that_is_no_checkpoint_says_so(tmp_path: Path) -> None:
    with _config().build() as algo, pytest.raises(ConfigError, match=r"algo\.save"):
        algo.restore(tmp_path)


# -- other kinds of environment --------------------------------------------------------------


@pytest.mark.timeout(60)
def test_multi_agent_env_trains_a_learner_per_policy() -> None:
    config = (
        _config(Mimic, num_envs=2)
        .multi_agent(
            policies={"p1": {}, "p2": {}},
            policy_mapping_fn=lambda agent_id, episode, **kw: "p1" if agent_id == "a" else "p2",
        )
        .training(min_env_steps_per_iteration=1024)
    )
    with config.build() as algo:
        results = [algo.train() for _ in range(3)]
        assert set(algo.learners) == {"p1", "p2"}
        obs = np.array([1.0], np.float32)
        assert algo.compute_single_action(obs, policy_id="p1") in (0, 1)
    last = results[-1]
    for pid in ("p1", "p2"):
        metrics = last["learners"][pid]
        assert metrics["updates"] >= 1 and math.isfinite(metrics["policy_loss"])
    assert last["env_runners"]["num_episodes"] > 0
    # Each agent scores up to 8 per episode; the return adds both. Random play gives ~8.
    assert last["env_runners"]["episode_return_mean"] > 8.5


def map_agent(agent_id: str, episode: Any, **kwargs: Any) -> str:
    """A module-level mapping function: a checkpoint saves it by name."""
    return "p1" if agent_id == "a" else "p2"


@pytest.mark.timeout(90)
def test_multi_agent_env_in_sub_processes_trains_as_in_process() -> None:
    runs = []
    for remote in (False, True):
        config = (
            _config(Mimic, num_envs=3)
            .env_runners(remote_worker_envs=remote, envs_per_process=2)
            .multi_agent(policies={"p1": {}, "p2": {}}, policy_mapping_fn=map_agent)
            .training(train_batch_size=128)
        )
        with config.build() as algo:
            results = [strip_times(algo.train()) for _ in range(2)]
            weights = {
                pid: {k: np.asarray(v).tolist() for k, v in learner.weights().arrays.items()}
                for pid, learner in algo.learners.items()
            }
        runs.append((results, weights))
    (local, local_weights), (remote, remote_weights) = runs
    for pid in ("p1", "p2"):
        assert remote[-1]["learners"][pid]["updates"] >= 1
    assert remote[-1]["env_runners"]["num_episodes"] > 0
    # The same seed gives the same episodes, hence the same updates, in or out of process.
    assert remote == local
    assert remote_weights == local_weights


@pytest.mark.timeout(60)
def test_from_checkpoint_finds_a_named_mapping_function_and_says_when_it_cannot(
    tmp_path: Path,
) -> None:
    for mapping_fn, folder in (
        (map_agent, tmp_path / "named"),
        (lambda a, e, **k: map_agent(a, e), None),
    ):
        config = (
            _config(Mimic, num_envs=1)
            .multi_agent(policies={"p1": {}, "p2": {}}, policy_mapping_fn=mapping_fn)
            .training(min_env_steps_per_iteration=64)
        )
        with config.build() as algo:
            algo.train()
            saved = algo.save(folder or tmp_path / "lambda")
        if folder is None:
            with pytest.raises(ConfigError, match=r"policy_mapping_fn .* pass config=\.\.\."):
                Algorithm.from_checkpoint(saved)
            with Algorithm.from_checkpoint(saved, config) as restored:  # the fix it names
                assert set(restored.learners) == {"p1", "p2"}
            continue
        with pytest.raises(ConfigError, match="trust_code=True"):
            Algorithm.from_checkpoint(saved)  # a function named by a folder: the caller's word
        with Algorithm.from_checkpoint(saved, trust_code=True) as restored:
            assert restored.config.policy_mapping_fn is map_agent
            assert restored.train()["env_runners"]["num_episodes"] > 0


@pytest.mark.timeout(60)
def test_external_env_learns_a_trivial_task() -> None:
    env = GuessSign()
    config = _config(env, num_envs=1).training(lr=3e-3)
    with config.build() as algo:
        results = [algo.train() for _ in range(10)]
    assert env.stopped.wait(5)
    assert results[-1]["env_runners"]["episode_len_mean"] == 1
    assert results[-1]["env_runners"]["episode_return_mean"] >= 0.9


class RaisesSometimes(gym.Wrapper[Any, Any, Any, Any]):
    """CartPole whose second copy raises at its 5th step of every episode."""

    def __init__(self, config: Any) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self.bad = config.worker_index == 2  # one copy per process: copy index + 1
        self.steps = 0

    def reset(self, **kwargs: Any) -> Any:
        self.steps = 0
        return self.env.reset(**kwargs)

    def step(self, action: Any) -> Any:
        self.steps += 1
        if self.bad and self.steps == 5:
            raise ValueError("boom")
        return self.env.step(action)


@pytest.mark.timeout(90)
def test_crashing_sub_process_env_keeps_training() -> None:
    config = _config(RaisesSometimes, num_envs=2).env_runners(
        remote_worker_envs=True, num_envs_per_env_runner=2, sample_timeout_s=20.0
    )
    with config.build() as algo:
        results = [algo.train() for _ in range(2)]
    last = results[-1]
    assert last["training_iteration"] == 2
    assert last["env_runners"]["episodes_failed"] > 0
    # A failed step has no reward, so it is sampled but not trained on: updates may lag.
    assert last["learners"]["default"]["updates"] >= 1
    assert last["learners"]["default"]["fragments_excluded_invalid"] == 0
    assert last["env_runners"]["num_episodes"] > 0  # the healthy copy finishes episodes
