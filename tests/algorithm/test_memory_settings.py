"""use_lstm, max_seq_len and lstm_cell_size through training() and RLlib's model={...}."""

from __future__ import annotations

from typing import Any

import pytest

from rlserve import DQNConfig, PPOConfig, SACConfig
from rlserve.config.fields import build
from rlserve.errors import ConfigError
from rlserve.learners.dqn_config import DQNSettings
from rlserve.learners.sac_config import SACSettings


def test_ppo_takes_the_memory_settings_directly_and_in_the_model_dict() -> None:
    direct = PPOConfig().training(use_lstm=True, max_seq_len=8, lstm_cell_size=32)
    model = PPOConfig().training(model={"use_lstm": True, "max_seq_len": 8, "lstm_cell_size": 32})
    for config in (direct, model):
        settings = config.algo_settings()
        assert (settings.use_lstm, settings.max_seq_len, settings.lstm_cell_size) == (True, 8, 32)
    default = PPOConfig().algo_settings()
    assert (default.use_lstm, default.max_seq_len, default.lstm_cell_size) == (False, 20, 64)


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({"max_seq_len": 0}, r"max_seq_len must be a whole number of 1 or more, got 0"),
        ({"lstm_cell_size": -4}, r"lstm_cell_size must be a whole number of 1 or more, got -4"),
        ({"lstm_cell_size": 2.5}, r"lstm_cell_size must be a whole number"),
        ({"model": {"max_seq_len": True}}, r"max_seq_len must be a whole number"),
        ({"use_lstm": "yes"}, r"use_lstm must be true or false, got 'yes'"),
    ],
)
def test_bad_memory_settings_are_one_line_errors(settings: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match) as err:
        PPOConfig().training(**settings).algo_settings()
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("config", [DQNConfig, SACConfig])
@pytest.mark.parametrize(
    "settings",
    [
        {"use_lstm": True},
        {"model": {"use_lstm": True}},
        {"model": {"use_lstm": True, "max_seq_len": 20, "lstm_cell_size": 64}},
        {"lstm_cell_size": 64},
    ],
)
def test_dqn_and_sac_refuse_memory_naming_the_fix(config: Any, settings: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match=r"only PPO trains recurrent \(LSTM\) policies") as err:
        config().training(**settings)
    text = str(err.value)
    assert "use PPOConfig for memory, or drop" in text
    assert "\n" not in text


@pytest.mark.parametrize("config", [DQNConfig, SACConfig])
def test_use_lstm_false_is_accepted_everywhere(config: Any) -> None:
    assert not hasattr(config().training(use_lstm=False).algo_settings(), "use_lstm")
    config().training(model={"use_lstm": False, "fcnet_hiddens": [32]}).algo_settings()


def test_a_policy_override_with_memory_is_refused_for_dqn() -> None:
    with pytest.raises(ConfigError, match=r"policy 'red'.*only PPO trains recurrent"):
        DQNConfig().multi_agent(
            policies={"red": {"use_lstm": True}}, policy_mapping_fn=lambda a, *_, **__: "red"
        )


@pytest.mark.parametrize("settings", [DQNSettings, SACSettings])
@pytest.mark.parametrize("option", ["use_lstm", "max_seq_len", "lstm_cell_size"])
def test_a_config_table_with_memory_for_dqn_or_sac_names_the_fix(
    settings: type, option: str
) -> None:
    with pytest.raises(ConfigError, match=r"only PPO trains recurrent .*\[ppo\] use_lstm = true"):
        build(settings, {option: 20}, None)
