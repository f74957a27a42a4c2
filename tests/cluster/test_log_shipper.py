"""A learner owed a long stretch of the experience log is shipped it in bounded batches."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from rlserve.cluster.log_shipper import LogShipper
from rlserve.run.experience_log import ExperienceLog


def _log_of(directory: Path, records: int) -> ExperienceLog:
    log = ExperienceLog(directory)
    log.open()
    for i in range(records):
        log.append("fragments", 1 + i % 3, bytes([i % 256]) * 8, None)
    log.sync()
    return log


def test_a_long_stretch_goes_in_batches_of_at_most_the_limit(tmp_path: Path) -> None:
    log = _log_of(tmp_path, 600)
    shipper = LogShipper(tmp_path, limit=256)
    sizes, after, seqs = [], 0, []
    while after < log.last_seq:
        records, after = shipper.take(after, log.last_seq)
        sizes.append(len(records))
        seqs += [r[0] for r in records]
        assert after == seqs[-1]
    assert sizes == [256, 256, 88]
    assert seqs == list(range(1, 601))  # each record once, in order
    assert shipper.take(600, 600) == ([], 600)
    assert shipper.take(10, 12)[0][0][:3] == (11, "fragments", 1 + 10 % 3)  # reading back
    shipper.close()
    log.close()


def test_a_stretch_that_cannot_be_read_is_skipped_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = _log_of(tmp_path, 5)
    log.close()
    shipper = LogShipper(tmp_path)
    for segment in tmp_path.iterdir():
        segment.unlink()
    with caplog.at_level(logging.WARNING, "rlserve.server"):
        assert shipper.take(0, 5) == ([], 5)
    assert "cannot read the experience log from seq 0 to 5" in caplog.text
