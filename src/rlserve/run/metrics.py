"""Metrics output: TensorBoard scalars and ``progress.csv`` in the run folder, the progress line.

Served (``rlserve serve``) and hosted (:class:`~rlserve.algorithm.algorithm.Algorithm`,
``rlserve train``) runs write one metric stream under the same names for the same quantities
(docs/metrics.md lists them), so the same TensorBoard charts and the same ``progress.csv`` columns
serve both.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from rlserve.run.console import ProgressLine
from rlserve.run.progress_file import ProgressFile

__all__ = ["MetricsWriter", "ProgressLine"]


class MetricsWriter:
    """Writes metric snapshots as TensorBoard scalars and as rows of ``progress.csv``.

    The scalars are plain ``simple_value`` summaries, which every TensorBoard reader
    (``EventAccumulator.Scalars``, the dashboard, pandas exporters) takes as scalars; the
    writer needs neither torch nor TensorFlow, so the serving process stays torch-free.

    Args:
        run_dir: The folder of the event files and ``progress.csv``.
    """

    def __init__(self, run_dir: Path):
        run_dir.mkdir(parents=True, exist_ok=True)
        self._events = EventFileWriter(str(run_dir))
        self.progress = ProgressFile(run_dir)

    def write(self, metrics: dict[str, float], step: int) -> None:
        """Write every finite metric at ``step`` (env steps), and one ``progress.csv`` row."""
        now = time.time()
        values = [
            summary_pb2.Summary.Value(tag=name, simple_value=float(value))
            for name, value in metrics.items()
            if math.isfinite(value)
        ]
        self._events.add_event(
            event_pb2.Event(wall_time=now, step=step, summary=summary_pb2.Summary(value=values))
        )
        self._events.flush()
        self.progress.append(metrics, now)

    def close(self) -> None:
        """Flush and close the event file (``progress.csv`` is closed after each row)."""
        self._events.close()
