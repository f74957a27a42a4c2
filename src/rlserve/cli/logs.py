"""Logging of the ``rlserve`` command: one format for rlserve's and uvicorn's records.

:func:`configured_logging` sets up the ``rlserve`` and ``uvicorn`` loggers for one command:
records at ``--log-level`` and above go to stderr (coloured by rich on a terminal, unless
``NO_COLOR`` is set; plain lines otherwise), never glued onto the progress line. Once the
command knows its run folder, :func:`log_to_run_folder` adds :data:`LOG_FILE` there, in the
plain format, rotated at :data:`LOG_FILE_BYTES`. uvicorn's own lines (start, shutdown) and its
access log (one line per HTTP request) appear only at ``--log-level debug``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import logging.handlers
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from rlserve.run.console import ON_STDOUT, progress_paused

LEVELS = ("debug", "info", "warning", "error")
"""The values of ``--log-level``."""
LOG_FILE = "rlserve.log"
"""The log file's name in the run folder."""
LOG_FILE_BYTES = 10 * 1024 * 1024
"""Size at which the log file is rotated (``rlserve.log.1`` .. ``.3`` keep older lines)."""
LOG_FILE_BACKUPS = 3
"""How many rotated log files are kept."""
FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"
"""The plain format of every line, rlserve's and uvicorn's alike."""
LOGGERS = ("rlserve", "uvicorn")
"""The loggers configured: rlserve's and the HTTP server's (uvicorn.error, uvicorn.access)."""

_active: _Setup | None = None


class PlainFormatter(logging.Formatter):
    """:data:`FORMAT`, without the ``rlserve: `` some messages start with.

    Those messages were written for bare stderr; the logger's name now says where they come from.
    """

    def __init__(self, fmt: str = FORMAT) -> None:
        super().__init__(fmt)

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        """The line of ``record``, its message without a leading ``rlserve: ``."""
        message = record.message
        if message.startswith("rlserve: "):
            record.message = message[len("rlserve: ") :]
        try:
            return super().formatMessage(record)
        finally:
            record.message = message


class TerminalHandler(logging.Handler):
    """Shows records on the terminal through ``inner``, clearing the progress line around them.

    Records an :func:`~rlserve.run.console.announce` already printed on stdout are skipped.
    """

    def __init__(self, inner: logging.Handler) -> None:
        super().__init__()
        self.inner = inner

    def emit(self, record: logging.LogRecord) -> None:
        """Write ``record`` on its own line(s), below the cleared progress line."""
        if getattr(record, ON_STDOUT, False):
            return
        with progress_paused():
            self.inner.handle(record)


def use_color(stream: TextIO) -> bool:
    """Whether ``stream`` is a terminal that takes colour (``NO_COLOR`` and ``TERM=dumb`` don't)."""
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def terminal_handler(stream: TextIO) -> TerminalHandler:
    """The handler of ``stream``: rich's on a colour terminal, else plain :data:`FORMAT` lines."""
    inner: logging.Handler
    if use_color(stream):
        from rich.console import Console
        from rich.logging import RichHandler

        inner = RichHandler(
            console=Console(file=stream),
            show_path=False,
            markup=False,
            log_time_format="%H:%M:%S",
        )
        inner.setFormatter(PlainFormatter("%(name)s: %(message)s"))
    else:
        inner = logging.StreamHandler(stream)
        inner.setFormatter(PlainFormatter())
    return TerminalHandler(inner)


class _Setup:
    """The handlers and levels one command set, and what they replaced (restored at the end)."""

    def __init__(self, level: int, stream: TextIO) -> None:
        self.handlers: list[logging.Handler] = [terminal_handler(stream)]
        self.levels = {
            "rlserve": level,
            # uvicorn's start and shutdown lines repeat rlserve's; its access log is one line
            # per request: both only when debugging.
            "uvicorn": level if level <= logging.DEBUG else max(level, logging.WARNING),
            "uvicorn.access": logging.DEBUG if level <= logging.DEBUG else logging.WARNING,
        }
        self._saved = {
            name: (logging.getLogger(name).level, logging.getLogger(name).propagate)
            for name in self.levels
        }

    def install(self) -> None:
        for name, level in self.levels.items():
            logger = logging.getLogger(name)
            logger.setLevel(level)
            # uvicorn.Config(access_log=False) cuts the access logger off; ours decides.
            logger.propagate = True
        for handler in self.handlers:
            self._add(handler)

    def _add(self, handler: logging.Handler) -> None:
        for name in LOGGERS:
            logging.getLogger(name).addHandler(handler)

    def add_file(self, path: Path) -> None:
        handler = logging.handlers.RotatingFileHandler(
            path, maxBytes=LOG_FILE_BYTES, backupCount=LOG_FILE_BACKUPS, encoding="utf-8"
        )
        handler.setFormatter(PlainFormatter())
        self.handlers.append(handler)
        self._add(handler)

    def remove(self) -> None:
        for handler in self.handlers:
            for name in LOGGERS:
                logging.getLogger(name).removeHandler(handler)
            handler.close()
        for name, (level, propagate) in self._saved.items():
            logging.getLogger(name).setLevel(level)
            logging.getLogger(name).propagate = propagate


@contextlib.contextmanager
def configured_logging(level: str = "info", stream: TextIO | None = None) -> Iterator[None]:
    """Log rlserve's and uvicorn's records at ``level`` and above on ``stream`` (stderr).

    Everything is as before once the block ends (the command may run inside another program,
    e.g. a test).
    """
    global _active
    setup = _Setup(logging.getLevelName(level.upper()), stream or sys.stderr)
    previous, _active = _active, setup
    setup.install()
    try:
        yield
    finally:
        setup.remove()
        _active = previous


def log_to_run_folder(run_dir: Path | str) -> Path | None:
    """Also write the command's log records to ``run_dir/rlserve.log`` (appended on resume).

    Returns:
        The log file, or None outside :func:`configured_logging` (nothing is written then).
    """
    if _active is None:
        return None
    path = Path(run_dir) / LOG_FILE
    _active.add_file(path)
    return path


def add_log_level(parser: argparse.ArgumentParser, group: Any = None) -> None:
    """Add ``--log-level`` to ``parser``, in ``group`` (default: a new ``logging`` group)."""
    if group is None:
        group = parser.add_argument_group("logging")
    group.add_argument(
        "--log-level",
        choices=LEVELS,
        default="info",
        help=f"the least severe log lines shown and written to the run folder's {LOG_FILE} "
        "(debug adds uvicorn's lines and one line per HTTP request; default: info)",
    )
