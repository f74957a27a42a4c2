"""The shared learner's merged log: each front-end's records once, across replays and re-sends."""

from __future__ import annotations

from pathlib import Path

from rlserve.cluster.shared_learner import MergedLog
from rlserve.run.experience_log import LogReader


def _record(seq: int, steps: int, batch_id: str | None = None) -> tuple[object, ...]:
    return (seq, "report" if batch_id else "fragments", steps, batch_id, b"payload-%d" % seq)


def _merged(directory: Path) -> list[tuple[str, int, str | None]]:
    log = MergedLog(directory)  # reopened: what a restarted learner reads back
    reader = LogReader(directory)
    try:
        return [(r.kind, r.steps, r.batch_id) for r in reader.records(0, log.log.last_seq)]
    finally:
        reader.close()
        log.log.close()


def test_a_replayed_log_is_merged_once(tmp_path: Path) -> None:
    merged = MergedLog(tmp_path)
    assert merged.merge("A", [_record(1, 10, "a1"), _record(2, 5)]) == 2
    # A front-end back from the dead ships its log from an older position: nothing again.
    assert merged.merge("A", [_record(1, 10, "a1"), _record(2, 5), _record(3, 7, "a3")]) == 1
    assert merged.merged_through == {"A": 3}
    merged.log.close()
    assert _merged(tmp_path) == [
        ("report A 1", 10, "a1"),
        ("fragments A 2", 5, None),
        ("report A 3", 7, "a3"),
    ]


def test_a_batch_re_sent_to_another_front_end_is_merged_once(tmp_path: Path) -> None:
    merged = MergedLog(tmp_path)
    # A logged batch x but died before acknowledging it; its client re-sent x to B.
    merged.merge("B", [_record(1, 8, "x")])
    # A comes back and replays its log: x is skipped, its other records are merged.
    assert merged.merge("A", [_record(1, 8, "x"), _record(2, 4, "y")]) == 1
    assert merged.duplicate_steps == 8
    assert merged.merged_through == {"A": 2, "B": 1}
    merged.log.close()
    # The learner restarted: positions and seen batch ids come back from its log.
    again = MergedLog(tmp_path)
    assert again.merged_through == {"A": 2, "B": 1}
    assert again.merge("C", [_record(1, 8, "x"), _record(2, 4, "y"), _record(3, 1)]) == 1
    again.log.close()
    assert [kind for kind, _, _ in _merged(tmp_path)] == [
        "report B 1",
        "report A 2",
        "fragments C 3",
    ]
