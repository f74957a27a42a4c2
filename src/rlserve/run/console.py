"""The terminal's stderr, shared: the in-place progress line and the lines written around it.

:class:`ProgressLine` redraws one line in place on a terminal. Anything else written to the
terminal while it is drawn, a log record or an :func:`announce`, runs inside
:func:`progress_paused`: the line is cleared first and redrawn after, so no output is ever glued
onto it. Off a terminal the progress is printed as plain lines and nothing needs clearing.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
from collections.abc import Iterator
from typing import TextIO

ON_STDOUT = "rlserve_on_stdout"
"""Attribute of a log record that :func:`announce` already printed on stdout (a terminal
handler skips it; the run folder's log file keeps it)."""

_lock = threading.RLock()
_drawn: ProgressLine | None = None


class ProgressLine:
    """A one-line progress display: redrawn in place on a terminal, else a line per update.

    Args:
        enabled: Whether anything is shown.
        stream: Where the line goes (default: stderr).
    """

    def __init__(self, enabled: bool, stream: TextIO | None = None):
        self.enabled = enabled
        self._stream = stream if stream is not None else sys.stderr
        self._tty = self._stream.isatty()
        self._width = 0
        self._text = ""

    def show(self, line: str) -> None:
        """Display ``line``."""
        global _drawn
        if not self.enabled:
            return
        with _lock:
            if self._tty:
                self._stream.write("\r" + line.ljust(self._width))
                self._width = len(line)
                self._text = line
                _drawn = self
            else:
                self._stream.write(line + "\n")
            self._stream.flush()

    def finish(self) -> None:
        """End the in-place line so later output starts on a new line."""
        global _drawn
        with _lock:
            if self.enabled and self._tty and self._width:
                self._stream.write("\n")
                self._stream.flush()
            self._width = 0
            if _drawn is self:
                _drawn = None

    def _clear(self) -> None:
        self._stream.write("\r" + " " * self._width + "\r")
        self._stream.flush()

    def _redraw(self) -> None:
        self._stream.write(self._text)
        self._stream.flush()


@contextlib.contextmanager
def progress_paused() -> Iterator[None]:
    """Clear the drawn progress line (if any) while the block writes to the terminal.

    The line is redrawn after the block, below what it wrote. Re-entrant and thread-safe: the
    progress line is not redrawn in between.
    """
    with _lock:
        drawn = _drawn
        if drawn is not None and drawn._width:
            drawn._clear()
        try:
            yield
        finally:
            if drawn is not None and _drawn is drawn and drawn._width:
                drawn._redraw()


def announce(logger: logging.Logger, text: str) -> None:
    """Print ``text`` on stdout (launchers read it there) and log it at INFO.

    The record is marked :data:`ON_STDOUT`, so a terminal handler does not show it twice; the
    run folder's log file keeps it with the other lines.
    """
    with progress_paused():
        print(text, flush=True)
    logger.info(text, extra={ON_STDOUT: True})
