"""SACConfig.training() with RLlib's SACConfig names: the ones with an rlserve counterpart are
mapped, the others refused naming the rlserve setting (or saying there is none)."""

from __future__ import annotations

import pytest

from rlserve import DQNConfig, PPOConfig, SACConfig
from rlserve.errors import ConfigError
from rlserve.learners.sac_config import SACSettings


def test_rllibs_sac_names_land_in_the_settings() -> None:
    settings = (
        SACConfig()
        .training(
            actor_lr=5e-4,
            critic_lr=2e-3,
            alpha_lr=5e-4,
            tau=0.01,
            initial_alpha=0.5,
            target_entropy="auto",
            twin_q=True,
            n_step=3,
            gamma=0.98,
            train_batch_size=128,
            num_steps_sampled_before_learning_starts=500,
            replay_buffer_config={"type": "EpisodeReplayBuffer", "capacity": 20_000},
            store_buffer_in_checkpoints=True,
            model={"fcnet_hiddens": [64, 64], "fcnet_activation": "relu"},
        )
        .algo_settings()
    )
    assert isinstance(settings, SACSettings)
    assert (settings.lr, settings.critic_lr) == (5e-4, 2e-3)
    assert (settings.tau, settings.initial_alpha, settings.target_entropy) == (0.01, 0.5, None)
    assert (settings.n_step, settings.gamma, settings.batch_size) == (3, 0.98, 128)
    assert (settings.learning_starts, settings.buffer_size) == (500, 20_000)
    assert settings.checkpoint_replay and settings.hidden == (64, 64)
    assert SACConfig().training(target_entropy=-2.0).algo_settings().target_entropy == -2.0
    assert DQNConfig().training(store_buffer_in_checkpoints=True).algo_settings().checkpoint_replay


@pytest.mark.parametrize(
    ("settings", "fix"),
    [
        ({"actor_lr": 3e-5, "critic_lr": 3e-4, "alpha_lr": 3e-4}, r"one learning rate .* lr"),
        ({"actor_lr": 3e-4}, r"pass lr=\.\.\., or actor_lr and alpha_lr both"),
        ({"critic_lr": -1e-3}, "critic_lr must be a finite number of 0.0 or more"),
        ({"twin_q": False}, "always learns twin critics; drop twin_q"),
        ({"training_intensity": 256.0}, r"updates_per_step \(RLlib's training_intensity / "),
        ({"target_network_update_freq": 1}, r"after every gradient step \(set tau\)"),
        ({"grad_clip": 40.0}, "does not clip gradients"),
        ({"optimization_config": {"actor_learning_rate": 3e-4}}, "the critics, critic_lr"),
        ({"q_model_config": {"fcnet_hiddens": [64]}}, "share hidden and activation"),
        ({"_use_beta_distribution": True}, "tanh-squashed Gaussian"),
        ({"num_sgd_iter": 3}, "training\\(\\) of sac has no setting 'num_sgd_iter'"),
        ({"replay_buffer_config": {"prioritized_replay_alpha": 0.6}}, "use capacity"),
    ],
)
def test_rllib_sac_settings_without_a_counterpart_are_refused_with_the_fix(
    settings: dict[str, object], fix: str
) -> None:
    with pytest.raises(ConfigError, match=fix):
        SACConfig().training(**settings)


def test_a_sac_policy_of_a_mixed_run_takes_rllibs_names_too() -> None:
    config = PPOConfig().multi_agent(
        policies={"arm": {"algo": "sac", "actor_lr": 1e-3, "critic_lr": 1e-3, "alpha_lr": 1e-3}},
        algorithm_settings={"sac": {"tau": 0.02, "twin_q": True}},
    )
    settings = config.policy_settings("sac", config.policies["arm"])
    assert (settings.lr, settings.critic_lr, settings.tau) == (1e-3, 1e-3, 0.02)
    with pytest.raises(ConfigError, match=r"policy 'arm': sac setting 'training_intensity'"):
        PPOConfig().multi_agent(policies={"arm": {"algo": "sac", "training_intensity": 2.0}})


def test_sac_learning_rates_of_zero_freeze_that_part() -> None:
    frozen = SACConfig().training(lr=0.0, critic_lr=0.0).algo_settings()
    assert (frozen.lr, frozen.critic_lr) == (0.0, 0.0)  # as PPO's lr 0: nothing learns
    with pytest.raises(ConfigError, match="lr must be a finite number"):
        SACSettings(lr=float("inf"))
