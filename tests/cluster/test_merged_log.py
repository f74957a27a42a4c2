"""The merged log's state at a position, its clean-up, and a log started anew from a point."""

from __future__ import annotations

from pathlib import Path

from rlserve.cluster.merged_log import STATE_FILE, MergedLog, read_records
from rlserve.run.experience_log import segment_files


def _record(seq: int, batch_id: str | None = None) -> tuple[object, ...]:
    kind = "report" if batch_id else "fragments"
    return (seq, kind, 10, batch_id, b"payload-%d" % seq + b"." * 100)


def _fill(merged: MergedLog) -> None:
    """A and B interleaved: merged positions 1..8."""
    for seq in range(1, 5):
        merged.merge("A", [_record(seq, f"a{seq}")])
        merged.merge("B", [_record(seq)])


def test_the_state_at_a_position_is_what_was_merged_through_it(tmp_path: Path) -> None:
    merged = MergedLog(tmp_path)
    _fill(merged)
    # Position 5 is A's 3rd record; B's 2nd was merged at 4.
    state = merged.state_at(5)
    assert state["position"] == 5
    assert state["merged_through"] == {"A": 3, "B": 2}
    assert state["seen"] == ["a1", "a2", "a3"]
    assert merged.state_at(8)["merged_through"] == merged.merged_through == {"A": 4, "B": 4}
    merged.close()


def test_a_cleaned_log_keeps_its_state_for_the_next_learner(tmp_path: Path) -> None:
    merged = MergedLog(tmp_path, segment_bytes=100)  # one record a segment
    _fill(merged)
    assert len(segment_files(tmp_path)) == 8
    assert merged.clean(6) == 6
    assert (tmp_path / STATE_FILE).exists()
    assert segment_files(tmp_path)[0][0] == 7  # what a restart from 6 reads stays
    assert [r[0] for r in read_records(tmp_path, 6, 8)] == [7, 8]
    merged.close()
    again = MergedLog(tmp_path)  # a restarted learner on the same disk
    assert again.base_position == 6
    assert again.merged_through == {"A": 4, "B": 4}
    assert again.log.last_seq == 8
    # A copy of a batch merged before the clean-up, re-sent to C, is still skipped.
    assert again.merge("C", [_record(1, "a2"), _record(2, "c2")]) == 1
    assert again.log.last_seq == 9
    assert again.state_at(6)["merged_through"] == {"A": 3, "B": 3}
    # Nothing older than the saved state is cleaned twice, nor past the log's end.
    assert again.clean(5) == 0 and again.clean(99) == 0
    again.close()


def test_a_log_started_anew_goes_on_after_the_point(tmp_path: Path) -> None:
    old = MergedLog(tmp_path / "old")
    _fill(old)
    kept = read_records(tmp_path / "old", 6, 8)
    state = old.state_at(8)
    old.close()
    MergedLog.install(tmp_path / "new", state, kept)
    new = MergedLog(tmp_path / "new")
    assert new.log.last_seq == 8
    assert new.merged_through == {"A": 4, "B": 4}
    assert [r[1] for r in read_records(tmp_path / "new", 6, 8)] == ["report A 4", "fragments B 4"]
    # Replayed records are skipped, new ones follow the point's position.
    assert new.merge("A", [_record(4, "a4"), _record(5, "a5")]) == 1
    assert new.log.last_seq == 9
    new.close()
    # A point with no records to keep: the log starts right after its position.
    MergedLog.install(tmp_path / "bare", old.state_at(5), [])
    bare = MergedLog(tmp_path / "bare")
    assert bare.log.last_seq == 5
    assert bare.merge("B", [_record(2), _record(3), _record(4)]) == 2  # B merged through 2
    assert bare.merged_through == {"A": 3, "B": 4}
    assert [r[0] for r in read_records(tmp_path / "bare", 5, 7)] == [6, 7]
    bare.close()
