"""Repeated warnings are written once per interval, with a count of the rest."""

from __future__ import annotations

import io

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
