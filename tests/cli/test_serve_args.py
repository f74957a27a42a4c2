"""``rlserve serve --help`` is grouped and short; ``--help-all`` shows every flag; all work."""

from __future__ import annotations

import dataclasses

import pytest

from rlserve.cli.commands import build_parser
from rlserve.cli.serve_args import SERVER_GROUPS
from rlserve.learners.registry import ALGORITHMS
from rlserve.server.config import ServerConfig


def _help(capsys: pytest.CaptureFixture[str], flag: str) -> str:
    with pytest.raises(SystemExit) as stopped:
        build_parser().parse_args(["serve", flag])
    assert stopped.value.code == 0
    return capsys.readouterr().out


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def test_serve_help_is_grouped_and_short(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    shown = _help(capsys, "--help")
    assert len(shown.splitlines()) < 130, len(shown.splitlines())
    for title, names in SERVER_GROUPS.items():
        assert f"\n{title}:\n" in shown
        for name in names:
            assert _flag(name) in shown
    assert "--log-level" in shown and "--help-all" in shown
    assert "--ppo-lr" not in shown and "--max-connections" not in shown


def test_help_all_shows_every_flag(capsys: pytest.CaptureFixture[str]) -> None:
    shown = _help(capsys, "--help-all")
    for f in dataclasses.fields(ServerConfig):
        assert _flag(f.name) in shown
    for entry in ALGORITHMS.values():
        for f in dataclasses.fields(entry.settings):
            assert _flag(f"{entry.name}_{f.name}") in shown


def test_hidden_flags_still_parse() -> None:
    args = build_parser().parse_args(
        ["serve", "--max-connections", "7", "--ppo-lr", "0.1", "--log-level", "error"]
    )
    assert args.max_connections == 7 and args.ppo_lr == 0.1 and args.log_level == "error"


@pytest.mark.parametrize(
    "argv",
    [
        ["serve"],
        ["train", "--env", "CartPole-v1"],
        ["status"],
        ["demo", "cartpole"],
        ["export", "runs/x"],
        ["check-env", "CartPole-v1"],
    ],
)
def test_every_command_takes_log_level(argv: list[str]) -> None:
    assert build_parser().parse_args(argv).log_level == "info"
    assert build_parser().parse_args([*argv, "--log-level", "debug"]).log_level == "debug"


def test_train_help_leaves_the_algorithms_to_help_all(
    capsys: pytest.CaptureFixture[str],
) -> None:
    shown = {}
    for flag in ("--help", "--help-all"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["train", flag])
        shown[flag] = capsys.readouterr().out
    assert "--env " in shown["--help"] and "--dqn-lr" not in shown["--help"]
    assert "--dqn-lr" in shown["--help-all"]
    args = build_parser().parse_args(["train", "--env", "CartPole-v1", "--dqn-lr", "0.01"])
    assert args.dqn_lr == 0.01
