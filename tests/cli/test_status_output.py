"""``rlserve status`` prints plain labelled lines off a terminal and a rich table on one."""

from __future__ import annotations

import io
import math
import sys
from typing import Any

import pytest

from rlserve.cli.status import LEARNER_FIGURES, format_status, learner_algorithm, print_status
from rlserve.learners.registry import ALGORITHMS
from rlserve.server.stats import ServerStats

HEALTH = {"status": "degraded", "server_version": "0.1.0", "problems": {"learner": "died"}}
METRICS = {"samples/env_steps": 1234, "server/weights_version": 3, "policies/a/weights_version": 3}


class FakeTerminal(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def test_plain_lines_when_stdout_is_not_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    print_status("here", HEALTH, METRICS)
    out = capsys.readouterr().out
    assert out == format_status("here", HEALTH, METRICS) + "\n"
    assert "\x1b" not in out
    lines = out.splitlines()
    assert lines[0].startswith("server    here: degraded, rlserve 0.1.0")
    assert lines[1].startswith("progress  1,234 env steps")
    assert lines[-2].startswith("policy    a: weights v3")
    assert lines[-1] == "problem   learner: died"


@pytest.mark.parametrize("no_color", [False, True])
def test_a_table_on_a_colour_terminal(no_color: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if no_color:
        monkeypatch.setenv("NO_COLOR", "1")
    else:
        monkeypatch.delenv("NO_COLOR", raising=False)
        monkeypatch.setenv("TERM", "xterm-256color")
    terminal = FakeTerminal()
    monkeypatch.setattr(sys, "stdout", terminal)
    print_status("here", HEALTH, METRICS)
    out = terminal.getvalue()
    assert ("\x1b[" in out) is not no_color
    for label in ("server", "progress", "clients", "episodes", "learner", "policy", "problem"):
        assert label in out
    assert "learner: died" in out


def _served(algorithms: dict[str, str], updates: dict[str, dict[str, float]]) -> dict[str, Any]:
    """A server's ``/v1/metrics`` (NaN as ``None``) after each policy's update."""
    stats = ServerStats()
    stats.configure_policies(list(algorithms), dict(algorithms))
    for pid, metrics in updates.items():
        stats.update_learner(pid, metrics)
    return {
        k: (None if isinstance(v, float) and math.isnan(v) else v)
        for k, v in stats.snapshot().items()
    }


def _learner_line(shown: str) -> str:
    return next(line for line in shown.splitlines() if line.startswith("learner"))


def test_a_dqn_run_shows_dqns_own_learner_figures() -> None:
    metrics = _served(
        {"default": "dqn"},
        {
            "default": {
                "learner/q_loss": 0.0123,
                "learner/q_mean": 4.5,
                "learner/epsilon": 0.05,
                "learner/replay_size": 10000.0,
            }
        },
    )
    line = _learner_line(format_status("here", {"status": "ok"}, metrics))
    assert "dqn: q loss 0.0123, q mean 4.500, epsilon 0.050, replay 10,000" in line
    assert "policy loss" not in line and "kl" not in line


def test_a_sac_run_shows_sacs_own_learner_figures() -> None:
    update = {
        "learner/critic_loss": 1.25,
        "learner/actor_loss": -3.5,
        "learner/alpha": 0.2,
        "learner/entropy": 1.367,
    }
    metrics = _served({"default": "sac"}, {"default": update})
    line = _learner_line(format_status("here", {"status": "ok"}, metrics))
    assert "sac: critic loss 1.2500, actor loss -3.5000, alpha 0.2000, entropy 1.367" in line
    assert "policy loss" not in line and "value loss" not in line


def test_a_ppo_run_keeps_its_figures() -> None:
    metrics = _served({"default": "ppo"}, {"default": {"learner/policy_loss": -0.01}})
    line = _learner_line(format_status("here", {"status": "ok"}, metrics))
    assert "ppo: policy loss -0.0100, value loss -, entropy -, kl -" in line


def test_each_policy_of_a_mixed_server_shows_its_own_algorithms_figures() -> None:
    metrics = _served(
        {"red": "ppo", "blue": "dqn"},
        {"red": {"learner/policy_loss": 0.5}, "blue": {"learner/q_loss": 0.25}},
    )
    shown = format_status("here", {"status": "ok"}, metrics)
    assert "algorithms dqn, ppo: see each policy" in _learner_line(shown)
    policy_lines = [line for line in shown.splitlines() if line.startswith("policy")]
    assert "ppo: policy loss 0.5000" in policy_lines[1]  # red, sorted after blue
    assert "dqn: q loss 0.2500" in policy_lines[0]
    assert "policy loss" not in policy_lines[0]


def test_the_figures_are_names_each_algorithm_reports() -> None:
    assert set(LEARNER_FIGURES) == set(ALGORITHMS)
    for name, figures in LEARNER_FIGURES.items():
        entry = ALGORITHMS[name]
        declared = set(entry.update_metrics) | set(entry.counter_metrics)
        for _, metric, _ in figures:
            assert metric in declared, (name, metric)
    # Each server lists only its own algorithms' names, so each one is recognised.
    for name in ALGORITHMS:
        assert learner_algorithm(_served({"default": name}, {})) == name
