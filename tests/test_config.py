"""Config dataclasses: TOML tables, flags, and the example file."""

from __future__ import annotations

import argparse
import dataclasses
import tomllib
from pathlib import Path

import pytest

from rlserve.algorithms.ppo import PPOConfig
from rlserve.config import add_arguments, build, to_table
from rlserve.errors import ConfigError
from rlserve.server.config import ServerConfig

EXAMPLE = Path(__file__).parent.parent / "examples" / "rlserve.toml"


def test_the_example_config_lists_every_option_with_its_default() -> None:
    tables = tomllib.loads(EXAMPLE.read_text())
    server = build(ServerConfig, tables["server"], None)
    ppo = build(PPOConfig, tables["ppo"], None)
    assert server.spaces_from == "CartPole-v1"
    assert dataclasses.replace(server, spaces_from=None) == ServerConfig()
    assert ppo == PPOConfig()
    documented = set(tables["server"]) | set(tables["ppo"])
    commented = {
        line[2:].split(" = ")[0]
        for line in EXAMPLE.read_text().splitlines()
        if line.startswith("# ") and " = ..." in line
    }
    assert {f.name for f in dataclasses.fields(ServerConfig)} <= documented | commented
    assert {f.name for f in dataclasses.fields(PPOConfig)} <= documented | commented


def test_flags_win_over_the_table_and_unknown_keys_are_named() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser, PPOConfig, prefix="ppo_")
    args = parser.parse_args(["--ppo-lr", "0.5", "--ppo-hidden", "8", "8"])
    ppo = build(PPOConfig, {"lr": 0.1, "gamma": 0.9}, args, prefix="ppo_")
    assert (ppo.lr, ppo.gamma, ppo.hidden) == (0.5, 0.9, (8, 8))
    assert build(PPOConfig, to_table(ppo), None) == ppo
    with pytest.raises(ConfigError, match=r"unknown option 'learning_rate'.*known options"):
        build(PPOConfig, {"learning_rate": 0.1}, None)


def test_binding_beyond_loopback_needs_a_token() -> None:
    with pytest.raises(ConfigError, match="--token"):
        ServerConfig(host="0.0.0.0")
    assert ServerConfig(host="0.0.0.0", token="s3cret").host == "0.0.0.0"
    assert ServerConfig(host="::1").host == "::1"
