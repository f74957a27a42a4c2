"""Every algorithm's settings refuse, by name, a value its learner could not train with."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from rlserve.errors import ConfigError
from rlserve.learners.common import resolve_device
from rlserve.learners.dqn_config import SOFT_TAU, DQNSettings
from rlserve.learners.ppo_config import PPOSettings
from rlserve.learners.sac_config import SACSettings
from rlserve.learners.setting_checks import check_device_present

PPO_MISTAKES: dict[str, tuple[dict[str, Any], str]] = {
    "no epochs": ({"num_epochs": 0}, "num_epochs must be a whole number of 1 or more, got 0"),
    "negative lr": ({"lr": -1.0}, r"lr must be a finite number of 0.0 or more, got -1.0"),
    "nan lr": ({"lr": float("nan")}, "lr must be a finite number of 0.0 or more"),
    "gamma above 1": ({"gamma": 1.5}, r"gamma must be within \[0.0, 1.0\], got 1.5"),
    "lambda above 1": ({"gae_lambda": 2.0}, r"gae_lambda must be within \[0.0, 1.0\]"),
    "negative clip": ({"clip_coef": -0.2}, "clip_coef must be a finite positive number"),
    "negative value weight": ({"vf_coef": -1.0}, "vf_coef must be a finite number of 0.0 or more"),
    "nan entropy weight": ({"ent_coef": float("nan")}, "ent_coef must be a finite number"),
    "zero grad norm": ({"max_grad_norm": 0.0}, r"max_grad_norm must be positive \(inf: no"),
    "negative lag": ({"max_policy_lag": -3}, "max_policy_lag must be a whole number of 0 or more"),
    "negative kl": ({"target_kl": -1.0}, "target_kl must be a finite positive number"),
    "zero-width layer": ({"hidden": (64, 0)}, r"hidden must list layer sizes of 1 or more"),
    "no threads": ({"torch_threads": 0}, "torch_threads must be a whole number of 1 or more"),
    "bad device": ({"device": "cuda:x"}, "device must be auto, cpu, cuda or cuda:N, got 'cuda:x'"),
    "bad activation": ({"activation": "gelu"}, "activation must be tanh or relu"),
}


@pytest.mark.parametrize("case", sorted(PPO_MISTAKES))
def test_ppo_refuses_a_value_out_of_range_by_name(case: str) -> None:
    settings, message = PPO_MISTAKES[case]
    with pytest.raises(ConfigError, match=message):
        PPOSettings(**settings)


@pytest.mark.parametrize("settings_class", [PPOSettings, DQNSettings, SACSettings])
def test_every_algorithm_checks_its_network_settings(settings_class: type) -> None:
    with pytest.raises(ConfigError, match="hidden must list layer sizes of 1 or more"):
        settings_class(hidden=(0,))
    with pytest.raises(ConfigError, match="torch_threads must be a whole number of 1 or more"):
        settings_class(torch_threads=0)
    # The edges that do train: a linear model, no gradient clipping, an explicit GPU index.
    assert settings_class(hidden=(), device="cuda:1").hidden == ()


def test_ppo_edges_that_do_train_are_accepted() -> None:
    edges = PPOSettings(max_grad_norm=float("inf"), max_policy_lag=0, gamma=1.0, gae_lambda=0.0)
    assert (edges.max_policy_lag, edges.gamma) == (0, 1.0)


def test_a_dqn_interval_without_tau_copies_the_target_hard() -> None:
    # RLlib's target_network_update_freq and SB3's target_update_interval mean hard copies.
    assert DQNSettings().target_tau == pytest.approx(SOFT_TAU)
    assert DQNSettings(target_update_interval=200).target_tau == 1.0
    assert DQNSettings(target_update_interval=200, tau=0.1).target_tau == pytest.approx(0.1)
    with pytest.raises(ConfigError, match=r"tau must be within \(0, 1\]"):
        DQNSettings(tau=0.0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_a_cuda_device_on_a_machine_without_one_is_refused_with_the_fix() -> None:
    with pytest.raises(ConfigError, match=r"--ppo-device cuda: torch .* sees no CUDA device here"):
        check_device_present("cuda", "--ppo-device")
    with pytest.raises(ConfigError, match="use auto"):
        resolve_device("cuda:0")
    check_device_present("cpu")  # nothing to check
    assert resolve_device("auto").type == "cpu"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_cuda_index_past_the_devices_is_refused() -> None:
    check_device_present("cuda:0")
    with pytest.raises(ConfigError, match="CUDA device"):
        check_device_present(f"cuda:{torch.cuda.device_count()}")
