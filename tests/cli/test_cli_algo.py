"""``rlserve serve --algo``: the algorithm's settings from its flags and tables, refusals."""

from __future__ import annotations

import pytest

from rlserve.cli.commands import build_parser
from rlserve.cli.serve import _algorithm_settings, _settings_of
from rlserve.errors import ConfigError
from rlserve.learners.dqn_config import DQNSettings
from rlserve.learners.ppo_config import PPOSettings


def _args(*flags: str) -> object:
    return build_parser().parse_args(["serve", *flags])


def test_algo_picks_the_settings_and_its_flags() -> None:
    settings = _algorithm_settings(
        _args("--algo", "dqn", "--dqn-n-step", "5", "--checkpoint-replay"), {}
    )
    assert isinstance(settings, DQNSettings)
    assert settings.n_step == 5 and settings.checkpoint_replay
    assert isinstance(_algorithm_settings(_args(), {}), PPOSettings)


def test_the_config_file_names_the_algorithm_and_its_table() -> None:
    tables = {"algorithm": {"name": "dqn"}, "dqn": {"buffer_size": 1000}}
    settings = _algorithm_settings(_args(), tables)
    assert isinstance(settings, DQNSettings) and settings.buffer_size == 1000


def test_refusals_name_the_fix() -> None:
    with pytest.raises(ConfigError, match="keeps no replay buffer"):
        _algorithm_settings(_args("--checkpoint-replay"), {})
    with pytest.raises(ConfigError, match="a run keeps its algorithm"):
        _algorithm_settings(_args("--algo", "ppo"), {"algorithm": {"name": "dqn"}}, resumed=True)


def test_each_algorithm_a_policy_names_has_its_table_and_flags() -> None:
    tables = {"dqn": {"buffer_size": 1000}}
    settings = _settings_of(
        ["ppo", "dqn"], _args("--dqn-n-step", "5", "--checkpoint-replay"), tables
    )
    assert isinstance(settings["ppo"], PPOSettings)
    dqn = settings["dqn"]
    assert isinstance(dqn, DQNSettings)
    assert (dqn.buffer_size, dqn.n_step, dqn.checkpoint_replay) == (1000, 5, True)
    with pytest.raises(ConfigError, match="or a policy with algo = 'dqn'"):
        _settings_of(["ppo"], _args("--checkpoint-replay"), {})
