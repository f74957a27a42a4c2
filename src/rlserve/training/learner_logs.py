"""The learner process's log lines, relayed to the serving process as messages on its pipe.

The learner is a child process with its own interpreter: left alone, its warnings (a skipped
update, an unreadable log record) would go straight to the inherited stderr, in another format,
across the server's progress line and outside the run's ``rlserve.log``. Instead its ``rlserve``
loggers hand each record to the pipe as a ``log`` message, and the server logs it again under the
same logger name (:func:`relay`), through its own handlers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

__all__ = ["MAX_MESSAGE_CHARS", "PipeLogHandler", "relay", "send_logs_to"]

MAX_MESSAGE_CHARS = 20_000
"""Longest relayed message (a traceback included); longer ones are cut."""


class PipeLogHandler(logging.Handler):
    """Sends each record as ``{"type": "log", "level", "name", "message"}`` with ``send``."""

    def __init__(self, send: Callable[[dict[str, Any]], None]) -> None:
        super().__init__()
        self._send = send
        self.setFormatter(logging.Formatter("%(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        """Send one record (its message with any traceback); dropped once the server is gone."""
        try:
            self._send(
                {
                    "type": "log",
                    "level": record.levelno,
                    "name": record.name,
                    "message": self.format(record)[:MAX_MESSAGE_CHARS],
                }
            )
        except OSError:
            pass  # the server is gone: there is nobody to tell (the learner exits on its own)
        except Exception:
            self.handleError(record)


def send_logs_to(send: Callable[[dict[str, Any]], None], level: int) -> PipeLogHandler:
    """Route this process's ``rlserve`` log records at ``level`` and above to ``send``."""
    handler = PipeLogHandler(send)
    root = logging.getLogger("rlserve")
    root.addHandler(handler)
    root.setLevel(level)
    root.propagate = False  # not also to the inherited stderr
    return handler


def relay(message: dict[str, Any]) -> None:
    """Log a learner's ``log`` message in this process, under its logger name."""
    name = str(message.get("name", ""))
    if name != "rlserve" and not name.startswith("rlserve."):
        name = "rlserve.learner"
    level = int(message.get("level", logging.WARNING))
    logging.getLogger(name).log(level, "%s", str(message.get("message", ""))[:MAX_MESSAGE_CHARS])
