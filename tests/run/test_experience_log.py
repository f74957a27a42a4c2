"""The experience log: records survive, torn tails are cut, readers follow segments."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from rlserve.protocol.fragment import Fragment
from rlserve.run.experience_log import (
    ExperienceLog,
    LogCorruptError,
    LogReader,
    encode_payload,
    segment_files,
)


def fragment(steps: int, value: float = 0.0) -> Fragment:
    return Fragment(
        episode_id="e",
        agent_id="agent0",
        policy_id="default",
        obs=np.full((steps + 1, 4), value, dtype=np.float32),
        actions=np.zeros(steps, dtype=np.int64),
        rewards=np.ones(steps, dtype=np.float32),
        behaviour_logp=np.zeros(steps, dtype=np.float32),
        policy_chosen=np.ones(steps, dtype=bool),
        weights_version=np.zeros(steps, dtype=np.int64),
        terminated=False,
        truncated=False,
    )


def append(log: ExperienceLog, steps: int, value: float = 0.0, batch_id: str | None = None) -> int:
    kind = "fragments" if batch_id is None else "report"
    return log.append(kind, steps, encode_payload([fragment(steps, value).to_wire()]), batch_id)


def test_records_read_back_in_order_with_their_headers(tmp_path: Path) -> None:
    log = ExperienceLog(tmp_path)
    assert log.open() == []
    assert [append(log, 3, 1.0), append(log, 2, 2.0, batch_id="b1")] == [1, 2]
    log.close()
    records = ExperienceLog(tmp_path).open()
    assert [(r.seq, r.kind, r.steps, r.batch_id) for r in records] == [
        (1, "fragments", 3, None),
        (2, "report", 2, "b1"),
    ]
    restored = Fragment.from_wire(records[1].fragments()[0])
    assert restored.obs[0, 0] == 2.0 and len(restored) == 2


def test_a_torn_tail_is_cut_and_appending_continues(tmp_path: Path) -> None:
    log = ExperienceLog(tmp_path)
    log.open()
    append(log, 3)
    append(log, 4)
    log.close()
    ((_, path),) = segment_files(tmp_path)
    size = path.stat().st_size
    os.truncate(path, size - 5)  # a crash in the middle of the second record
    log = ExperienceLog(tmp_path)
    records = log.open()
    assert [r.seq for r in records] == [1]
    assert append(log, 5) == 2  # the torn record's seq was never announced: it is reused
    log.close()
    assert [(r.seq, r.steps) for r in ExperienceLog(tmp_path).open()] == [(1, 3), (2, 5)]


def test_a_flipped_byte_fails_the_checksum(tmp_path: Path) -> None:
    log = ExperienceLog(tmp_path)
    log.open()
    append(log, 3)
    append(log, 3)
    log.close()
    ((_, path),) = segment_files(tmp_path)
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF
    path.write_bytes(bytes(data))
    assert [r.seq for r in ExperienceLog(tmp_path).open()] == [1]


def test_reader_follows_segments_and_resumes_from_any_position(tmp_path: Path) -> None:
    log = ExperienceLog(tmp_path, segment_bytes=300)
    log.open()
    for i in range(10):
        append(log, 2, float(i))
    assert len(segment_files(tmp_path)) > 2
    reader = LogReader(tmp_path)
    assert [r.seq for r in reader.records(0, 4)] == [1, 2, 3, 4]
    assert [r.seq for r in reader.records(4, 10)] == [5, 6, 7, 8, 9, 10]
    assert [r.seq for r in LogReader(tmp_path).records(6, 8)] == [7, 8]
    with pytest.raises(LogCorruptError, match="ends at seq 10"):
        list(LogReader(tmp_path).records(8, 12))
    log.close()


def test_delete_through_keeps_every_segment_with_a_later_record(tmp_path: Path) -> None:
    log = ExperienceLog(tmp_path, segment_bytes=300)
    log.open()
    for _ in range(10):
        append(log, 2)
    firsts = [first for first, _ in segment_files(tmp_path)]
    log.delete_through(firsts[2] - 1)
    assert [first for first, _ in segment_files(tmp_path)] == firsts[2:]
    assert next(r.seq for r in LogReader(tmp_path).records(firsts[2] - 1, 10)) == firsts[2]
    log.delete_through(10**9)  # the newest segment is never deleted
    assert len(segment_files(tmp_path)) == 1
    log.close()


def test_a_failed_write_leaves_no_record_and_no_seq_gap(tmp_path: Path) -> None:
    log = ExperienceLog(tmp_path)
    log.open()
    append(log, 2)
    assert log._fd is not None
    os.close(log._fd)  # the next write fails with EBADF, as a full disk would fail it
    with pytest.raises(OSError):
        append(log, 2)
    assert log.last_seq == 1
    assert append(log, 3) == 2  # the log recovers with a fresh segment
    log.close()
    assert [(r.seq, r.steps) for r in ExperienceLog(tmp_path).open()] == [(1, 2), (2, 3)]


def test_sync_reports_the_synced_position(tmp_path: Path) -> None:
    log = ExperienceLog(tmp_path)
    log.open()
    append(log, 2)
    append(log, 2)
    assert log.synced_seq == 0
    assert log.sync() == 2
    log.close()
