"""``rlserve status`` prints plain labelled lines off a terminal and a rich table on one."""

from __future__ import annotations

import io
import sys

import pytest

from rlserve.cli.status import format_status, print_status

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
