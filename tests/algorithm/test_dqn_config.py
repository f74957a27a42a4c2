"""DQNConfig: the settings of the registered algorithm, RLlib's names, saving and loading."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlserve import DQNConfig, PPOConfig
from rlserve.algorithm.config import config_for
from rlserve.algorithm.saved_config import load_config, save_config
from rlserve.algorithms.dqn_config import DQNSettings
from rlserve.algorithms.ppo_config import PPOSettings
from rlserve.errors import ConfigError


def test_training_takes_the_dqn_settings_and_rllib_names() -> None:
    config = DQNConfig().training(
        n_step=2,
        train_batch_size=32,
        num_steps_sampled_before_learning_starts=100,
        replay_buffer_config={"capacity": 5000},
        model={"fcnet_hiddens": [32, 32]},
    )
    settings = config.algo_settings()
    assert isinstance(settings, DQNSettings)
    assert (settings.n_step, settings.batch_size, settings.learning_starts) == (2, 32, 100)
    assert settings.buffer_size == 5000 and settings.hidden == (32, 32)
    assert config.ppo_settings() == settings  # the old name still answers
    assert DQNConfig().min_env_steps_per_iteration == 1000


def test_unknown_or_invalid_dqn_settings_are_refused_at_once() -> None:
    with pytest.raises(ConfigError, match=r"training\(\) of dqn has no setting 'clip_param'"):
        DQNConfig().training(clip_param=0.2)
    with pytest.raises(ConfigError, match="batch_size 128 is larger than buffer_size 64"):
        DQNConfig().training(batch_size=128, buffer_size=64)
    with pytest.raises(ConfigError, match="epsilon_end must be within"):
        DQNConfig().training(epsilon_end=1.5)
    with pytest.raises(ConfigError, match="replay_buffer_config setting 'alpha'"):
        DQNConfig().training(replay_buffer_config={"alpha": 0.6})
    with pytest.raises(ConfigError, match="has no setting 'buffer_size'"):
        PPOConfig().training(buffer_size=10)


def test_ppo_settings_are_unchanged() -> None:
    settings = PPOConfig().environment("CartPole-v1").algo_settings()
    assert isinstance(settings, PPOSettings)
    assert settings.train_batch_size == 512  # the hosted PPO defaults still apply


def test_the_epsilon_schedule_is_linear_then_flat() -> None:
    settings = DQNSettings(epsilon_start=1.0, epsilon_end=0.1, exploration_steps=100)
    assert settings.epsilon(0) == 1.0
    assert settings.epsilon(50) == pytest.approx(0.55)
    assert settings.epsilon(100) == settings.epsilon(10_000) == pytest.approx(0.1)
    assert DQNSettings(exploration_steps=0, epsilon_end=0.02).epsilon(0) == 0.02


def test_a_saved_config_loads_as_its_algorithm(tmp_path: Path) -> None:
    save_config(DQNConfig().environment("CartPole-v1").training(n_step=5), tmp_path)
    loaded = load_config(tmp_path)
    assert isinstance(loaded, DQNConfig)
    assert loaded.algo_settings().n_step == 5
    assert isinstance(config_for(None), PPOConfig)
    with pytest.raises(ConfigError, match="unknown algorithm 'a3c'"):
        config_for("a3c")
