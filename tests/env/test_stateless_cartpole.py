"""CartPole without its velocities (rlserve.env.stateless_cartpole), the memory task."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium.utils.env_checker import check_env

from rlserve import PPOConfig
from rlserve.env import StatelessCartPole, make_env
from rlserve.env.locate import locate_env


def test_it_observes_cart_position_and_pole_angle_alone() -> None:
    env = StatelessCartPole()
    assert env.observation_space.shape == (2,)
    assert env.observation_space.dtype == np.float32
    full = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=7)
    full_obs, _ = full.reset(seed=7)
    assert obs.tolist() == full_obs[[0, 2]].tolist()
    assert env.observation_space.contains(obs)
    rng = np.random.default_rng(0)
    done = False
    while not done:
        action = int(rng.integers(2))
        obs, reward, terminated, truncated, _ = env.step(action)
        full_obs, full_reward, *_ = full.step(action)
        assert obs.tolist() == full_obs[[0, 2]].tolist() and reward == full_reward
        done = terminated or truncated
    assert terminated  # random actions drop the pole, as in CartPole-v1


def test_it_is_a_valid_gymnasium_env() -> None:
    check_env(StatelessCartPole(), skip_render_check=True)


def test_the_env_config_reaches_cartpole_and_the_time_limit_is_kept() -> None:
    env = make_env(StatelessCartPole, {"max_episode_steps": 5})
    env.reset(seed=0)
    steps, done = 0, False
    while not done:
        _, _, terminated, truncated, _ = env.step(steps % 2)
        steps += 1
        done = terminated or truncated
    assert steps == 5 and truncated and not terminated
    assert make_env(StatelessCartPole, render_mode="rgb_array").render_mode == "rgb_array"


def test_a_command_line_names_it_as_module_and_class() -> None:
    assert locate_env("rlserve.env:StatelessCartPole") is StatelessCartPole


def test_hosted_ppo_trains_on_it() -> None:
    config = (
        PPOConfig()
        .environment(StatelessCartPole)
        .env_runners(num_envs_per_env_runner=2)
        .training(train_batch_size=64, minibatch_size=32, num_epochs=1, torch_threads=1)
        .debugging(seed=0)
    )
    with config.build() as algo:
        result = algo.train()
        action = algo.compute_single_action(np.zeros(2, np.float32))
    assert result["learners"]["default"]["updates"] >= 1
    assert np.isfinite(result["learners"]["default"]["policy_loss"])
    assert result["env_runners"]["episode_return_mean"] > 0
    assert int(action) in (0, 1)
