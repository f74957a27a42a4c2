"""The command's logging: one format for rlserve and uvicorn, --log-level, plain text off a
terminal, and never a log line glued onto the progress line."""

from __future__ import annotations

import io
import logging
import re
from pathlib import Path

import pytest

from rlserve.cli.logs import LOG_FILE, configured_logging, log_to_run_folder
from rlserve.run.console import ProgressLine, announce

LINE = re.compile(
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR) +(rlserve|uvicorn)[.\w]*: "
)
ANSI = re.compile(r"\x1b\[[0-9;]*m")


class FakeTerminal(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def screen(text: str) -> list[str]:
    """The lines a terminal shows for ``text``: each ``\\r`` returns to the first column."""
    shown = []
    for raw in text.split("\n"):
        line: list[str] = []
        for part in raw.split("\r"):
            for column, char in enumerate(part):
                if column < len(line):
                    line[column] = char
                else:
                    line.append(char)
        shown.append("".join(line).rstrip())
    return shown


@pytest.mark.parametrize("color", [False, True])
def test_a_log_line_never_shares_the_progress_line(
    color: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if color:
        monkeypatch.delenv("NO_COLOR", raising=False)
        monkeypatch.setenv("TERM", "xterm-256color")
    else:
        monkeypatch.setenv("NO_COLOR", "1")
    terminal = FakeTerminal()
    progress = ProgressLine(True, terminal)
    with configured_logging("info", terminal):
        progress.show("steps 1,000 | 250 steps/s")
        logging.getLogger("rlserve.server").warning("rlserve: disk full")
        progress.show("steps 2,000 | 260 steps/s")
        logging.getLogger("uvicorn.error").error("uvicorn went away")
        progress.finish()
    assert ("\x1b[" in terminal.getvalue()) is color
    lines = [line for line in screen(ANSI.sub("", terminal.getvalue())) if line]
    logged = [line for line in lines if "disk full" in line or "went away" in line]
    assert len(logged) == 2, lines
    assert all("steps" not in line for line in logged), lines
    # The progress line is redrawn below each log line and is the last one.
    assert lines[-1] == "steps 2,000 | 260 steps/s", lines
    if not color:
        assert all(LINE.match(line) for line in logged), lines


def test_plain_lines_when_not_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    stream = io.StringIO()
    progress = ProgressLine(True, stream)
    with configured_logging("info", stream):
        progress.show("steps 1")
        logging.getLogger("rlserve.server").info("rlserve: resumed")
        progress.show("steps 2")
        progress.finish()
    text = stream.getvalue()
    assert "\x1b" not in text and "\r" not in text
    lines = text.splitlines()
    assert lines[0] == "steps 1" and lines[2] == "steps 2"
    # The "rlserve: " of a message written for bare stderr is not repeated after the name.
    assert LINE.match(lines[1]) and lines[1].endswith(" INFO    rlserve.server: resumed")


def test_no_color_is_honoured_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    terminal = FakeTerminal()
    with configured_logging("info", terminal):
        logging.getLogger("rlserve").warning("careful")
    assert "\x1b" not in terminal.getvalue()
    assert LINE.match(terminal.getvalue())


def test_the_log_level_hides_less_severe_lines() -> None:
    stream = io.StringIO()
    with configured_logging("warning", stream):
        logging.getLogger("rlserve.server").info("an info line")
        logging.getLogger("rlserve.server").warning("a warning line")
        logging.getLogger("uvicorn.access").info("GET /v1/health 200")
    assert "a warning line" in stream.getvalue()
    assert "an info line" not in stream.getvalue() and "GET" not in stream.getvalue()
    stream = io.StringIO()
    with configured_logging("debug", stream):
        logging.getLogger("rlserve.server").debug("a debug line")
        logging.getLogger("uvicorn.access").info("GET /v1/health 200")
    assert "a debug line" in stream.getvalue() and "GET /v1/health" in stream.getvalue()


def test_uvicorn_lifecycle_lines_only_when_debugging() -> None:
    stream = io.StringIO()
    with configured_logging("info", stream):
        logging.getLogger("uvicorn.error").info("Started server process")
        logging.getLogger("rlserve.server").info("listening")
    assert "Started server process" not in stream.getvalue()
    assert "listening" in stream.getvalue()


def test_everything_is_restored_after_the_command() -> None:
    names = ("rlserve", "uvicorn", "uvicorn.access")
    before = {n: (logging.getLogger(n).level, list(logging.getLogger(n).handlers)) for n in names}
    with configured_logging("debug", io.StringIO()):
        assert logging.getLogger("rlserve").level == logging.DEBUG
    after = {n: (logging.getLogger(n).level, list(logging.getLogger(n).handlers)) for n in names}
    assert after == before


def test_the_run_folder_log_file_keeps_announced_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stream = io.StringIO()
    assert log_to_run_folder(tmp_path) is None  # outside a command: nothing written
    with configured_logging("info", stream):
        assert log_to_run_folder(tmp_path) == tmp_path / LOG_FILE
        announce(logging.getLogger("rlserve.server"), "rlserve listening on 127.0.0.1:1")
        logging.getLogger("uvicorn.error").warning("uvicorn says")
    assert capsys.readouterr().out == "rlserve listening on 127.0.0.1:1\n"
    # On stdout already: not repeated on the terminal's stderr.
    assert "listening" not in stream.getvalue() and "uvicorn says" in stream.getvalue()
    lines = (tmp_path / LOG_FILE).read_text().splitlines()
    assert len(lines) == 2 and all(LINE.match(line) for line in lines), lines
    assert "rlserve.server: rlserve listening on 127.0.0.1:1" in lines[0]
    assert "uvicorn.error: uvicorn says" in lines[1]
