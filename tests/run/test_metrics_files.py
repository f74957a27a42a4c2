"""The run folder's metrics files: TensorBoard scalars any reader takes, and ``progress.csv``."""

from __future__ import annotations

import math
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rlserve.run.metrics import MetricsWriter
from rlserve.run.progress_file import PROGRESS_COLUMNS, PROGRESS_FILE, read_progress


def test_metrics_are_tensorboard_scalars_and_nan_is_left_out(tmp_path: Path) -> None:
    writer = MetricsWriter(tmp_path)
    writer.write({"episodes/return_mean": float("nan"), "samples/env_steps": 10.0}, 10)
    writer.write({"episodes/return_mean": 2.5, "samples/env_steps": 20.0}, 20)
    writer.close()
    events = EventAccumulator(str(tmp_path)).Reload()
    assert set(events.Tags()["scalars"]) == {"episodes/return_mean", "samples/env_steps"}
    assert events.Tags()["tensors"] == []
    assert [(e.step, e.value) for e in events.Scalars("samples/env_steps")] == [
        (10, 10.0),
        (20, 20.0),
    ]
    assert [(e.step, e.value) for e in events.Scalars("episodes/return_mean")] == [(20, 2.5)]


def test_progress_rows_have_the_fixed_header_and_a_resumed_run_appends(tmp_path: Path) -> None:
    first = MetricsWriter(tmp_path)
    first.write({"samples/env_steps": 5.0, "episodes/return_mean": float("nan")}, 5)
    first.close()
    again = MetricsWriter(tmp_path)  # a resumed run
    again.write({"samples/env_steps": 9.0, "episodes/return_mean": 1.25, "other/x": 3.0}, 9)
    again.close()
    lines = (tmp_path / PROGRESS_FILE).read_text().splitlines()
    assert lines[0] == ",".join(PROGRESS_COLUMNS)
    assert len(lines) == 3
    rows = read_progress(tmp_path)
    assert [r["samples/env_steps"] for r in rows] == [5.0, 9.0]
    assert rows[0]["episodes/return_mean"] is None  # NaN: an empty cell
    assert rows[1]["episodes/return_mean"] == 1.25
    assert rows[1]["learner/updates"] is None  # not in the snapshot
    assert all(r["time"] is not None and math.isfinite(r["time"]) for r in rows)


def test_a_file_with_another_header_is_moved_aside_and_a_cut_line_skipped(tmp_path: Path) -> None:
    (tmp_path / PROGRESS_FILE).write_text("step,return\n1,2\n")
    writer = MetricsWriter(tmp_path)
    writer.write({"samples/env_steps": 1.0}, 1)
    writer.close()
    assert (tmp_path / "progress.1.csv").read_text() == "step,return\n1,2\n"
    with (tmp_path / PROGRESS_FILE).open("a") as f:
        f.write("17000")  # a row cut short by a crash
    with (tmp_path / PROGRESS_FILE).open("a") as f:
        f.write("00.5,1e")
    assert [r["samples/env_steps"] for r in read_progress(tmp_path)] == [1.0]
