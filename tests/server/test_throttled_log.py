"""Repeated warnings are written once per interval, with a count of the rest."""

from __future__ import annotations

import io
import logging

import pytest

from rlserve.server.throttled_log import ThrottledLog


def test_one_line_per_kind_and_interval_with_a_count() -> None:
    now = [0.0]
    stream = io.StringIO()
    log = ThrottledLog(interval=10.0, stream=stream, clock=lambda: now[0])
    assert log.warn("a", "first")
    assert not log.warn("a", "second")
    assert not log.warn("a", "third")
    assert log.warn("b", "other kind")
    now[0] = 10.0
    assert log.warn("a", "later")
    assert stream.getvalue().splitlines() == [
        "rlserve: first",
        "rlserve: other kind",
        "rlserve: later (and 2 more like it since the last such line)",
    ]


def test_the_learner_link_warns_about_dropped_steps_once_per_interval() -> None:
    """Steps the learner skipped are never silent: one line with the count and the remedies."""
    from rlserve.server import learner_link
    from rlserve.server.stats import ServerStats

    stream, now = io.StringIO(), [0.0]
    log = ThrottledLog(interval=60.0, stream=stream, clock=lambda: now[0])
    original, learner_link.SERVER_LOG = learner_link.SERVER_LOG, log
    try:
        link = learner_link.LearnerLink(
            {"max_queue_steps": 100},
            ServerStats(),
            None,  # type: ignore[arg-type]
            None,  # type: ignore[arg-type]
            None,  # type: ignore[arg-type]
            lambda: 0,
        )
        for seq in (1, 2, 3):
            link._unread.append((seq, 50))
        link._consumed(1, [[1, 30]])
        link._consumed(2, [[2, 50]])  # within the interval: counted, not printed
        link._consumed(3, [])
    finally:
        learner_link.SERVER_LOG = original
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1, lines
    assert "dropped 30 steps unread (30 of 50 in all" in lines[0]
    assert "fewer clients" in lines[0] and "--max-sample-queue-steps (now 100)" in lines[0]


def test_without_a_stream_the_lines_go_to_the_server_log(caplog: pytest.LogCaptureFixture) -> None:
    """So they share the log's format, its file in the run folder, and the progress line's care."""
    log = ThrottledLog(interval=10.0, clock=lambda: 0.0)
    with caplog.at_level(logging.WARNING, logger="rlserve.server"):
        assert log.warn("a", "first")
        assert not log.warn("a", "second")
    assert [(r.name, r.levelname, r.getMessage()) for r in caplog.records] == [
        ("rlserve.server", "WARNING", "rlserve: first")
    ]
