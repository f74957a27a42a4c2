"""DQNConfig: the settings of the registered algorithm, RLlib's names, saving and loading."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rlserve import DQNConfig, PPOConfig
from rlserve.algorithm.config import config_for
from rlserve.algorithm.saved_config import CONFIG_FILE, load_config, save_config
from rlserve.errors import ConfigError
from rlserve.learners.dqn_config import SOFT_TAU, DQNSettings
from rlserve.learners.ppo_config import PPOSettings


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
    # PPO's own defaults (none differ for hosted environments), untouched by DQN's registration
    assert settings == PPOSettings(seed=settings.seed)


def test_the_epsilon_schedule_is_linear_then_flat() -> None:
    settings = DQNSettings(epsilon_start=1.0, epsilon_end=0.1, exploration_steps=100)
    assert settings.epsilon(0) == 1.0
    assert settings.epsilon(50) == pytest.approx(0.55)
    assert settings.epsilon(100) == settings.epsilon(10_000) == pytest.approx(0.1)
    assert DQNSettings(exploration_steps=0, epsilon_end=0.02).epsilon(0) == 0.02


def test_the_learning_rate_falls_linearly_to_lr_end_then_stays() -> None:
    settings = DQNSettings(lr=1e-3, lr_end=1e-4, lr_decay_steps=1000)
    assert settings.learning_rate(0) == pytest.approx(1e-3)
    assert settings.learning_rate(500) == pytest.approx(5.5e-4)
    assert settings.learning_rate(1000) == settings.learning_rate(9999) == pytest.approx(1e-4)
    assert DQNSettings(lr=3e-4).learning_rate(10**6) == 3e-4  # no lr_end: constant
    with pytest.raises(ConfigError, match=r"lr_end must be a finite number of 0\.0 or more"):
        DQNSettings(lr_end=-1e-4)
    assert DQNSettings(lr_end=0.0).lr_end == 0.0  # a decay to zero, as SB3's schedules end
    assert DQNSettings(lr=0.0).lr == 0.0  # a policy that does not learn, as PPO's lr 0
    assert DQNSettings(lr=np.float32(5e-4)).lr == pytest.approx(5e-4)  # numpy numbers too
    with pytest.raises(ConfigError, match="lr must be a finite number"):
        DQNSettings(lr=True)
    with pytest.raises(ConfigError, match="lr_decay_steps must be positive"):
        DQNSettings(lr_end=1e-4, lr_decay_steps=0)


def test_rllibs_two_point_lr_schedule_is_lr_lr_end_and_lr_decay_steps() -> None:
    for given in (
        {"lr_schedule": [[0, 1e-3], [20_000, 1e-4]]},
        {"lr": [[0, 1e-3], [20_000, 1e-4]]},
    ):
        settings = DQNConfig().training(**given).algo_settings()
        assert isinstance(settings, DQNSettings)
        assert (settings.lr, settings.lr_end, settings.lr_decay_steps) == (1e-3, 1e-4, 20_000)
    for schedule in ([[0, 1e-3], [5, 1e-4], [9, 1e-5]], [[100, 1e-3], [200, 1e-4]], "fast"):
        with pytest.raises(ConfigError, match=r"\[\[0, lr\], \[env_steps, lr_end\]\]"):
            DQNConfig().training(lr_schedule=schedule)
    with pytest.raises(ConfigError, match="has no setting 'lr_schedule'"):
        PPOConfig().training(lr_schedule=[[0, 1e-3], [10, 1e-4]])


def test_a_saved_config_loads_as_its_algorithm(tmp_path: Path) -> None:
    save_config(DQNConfig().environment("CartPole-v1").training(n_step=5), tmp_path)
    loaded = load_config(tmp_path)
    assert isinstance(loaded, DQNConfig)
    assert loaded.algo_settings().n_step == 5
    assert isinstance(config_for(None), PPOConfig)
    with pytest.raises(ConfigError, match="unknown algorithm 'a3c'"):
        config_for("a3c")


def test_a_config_saved_before_tau_became_automatic_keeps_its_soft_copies(
    tmp_path: Path,
) -> None:
    config = DQNConfig().environment("CartPole-v1").training(target_update_interval=100)
    save_config(config, tmp_path)
    assert load_config(tmp_path).algo_settings().target_tau == 1.0  # now: a hard copy
    saved = json.loads((tmp_path / CONFIG_FILE).read_text())
    del saved["format"]  # as saved before the change
    (tmp_path / CONFIG_FILE).write_text(json.dumps(saved))
    assert load_config(tmp_path).algo_settings().target_tau == pytest.approx(SOFT_TAU)
