"""The learner process's log records reach the server's loggers as ``log`` messages."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

from rlserve.protocol.codec import decode, encode
from rlserve.training.learner_logs import (
    MAX_MESSAGE_CHARS,
    PipeLogHandler,
    relay,
    send_logs_to,
)


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def sent() -> Iterator[list[dict[str, Any]]]:
    """What the learner side sends; the test then plays the server side with :func:`serving`."""
    messages: list[dict[str, Any]] = []
    root = logging.getLogger("rlserve")
    saved = (root.level, root.propagate, list(root.handlers))
    send_logs_to(lambda m: messages.append(decode(encode(m))), logging.INFO)
    yield messages
    root.handlers[:] = saved[2]
    root.setLevel(saved[0])
    root.propagate = saved[1]


def serving() -> _Records:
    """Turn this process into the server side: no pipe handler; what its loggers log."""
    root = logging.getLogger("rlserve")
    root.handlers[:] = [h for h in root.handlers if not isinstance(h, PipeLogHandler)]
    logged = _Records()
    root.addHandler(logged)
    return logged


def test_a_learner_warning_travels_and_is_logged_under_its_name(
    sent: list[dict[str, Any]],
) -> None:
    logging.getLogger("rlserve.learner").warning("log record %d unreadable", 7)
    logging.getLogger("rlserve.learner").debug("below the server's level: not sent")
    assert [(m["type"], m["name"], m["message"]) for m in sent] == [
        ("log", "rlserve.learner", "log record 7 unreadable")
    ]
    logged = serving()
    relay(sent[0])
    assert [(r.name, r.levelno, r.getMessage()) for r in logged.records] == [
        ("rlserve.learner", logging.WARNING, "log record 7 unreadable")
    ]


def test_a_traceback_travels_and_a_foreign_name_or_long_text_is_bounded(
    sent: list[dict[str, Any]],
) -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        logging.getLogger("rlserve.training").exception("update failed")
    assert "ValueError: boom" in sent[0]["message"] and "Traceback" in sent[0]["message"]
    logged = serving()
    relay({"type": "log", "level": logging.ERROR, "name": "root", "message": "x" * 10**6})
    (record,) = logged.records
    assert record.name == "rlserve.learner" and len(record.getMessage()) == MAX_MESSAGE_CHARS
