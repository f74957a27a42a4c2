"""Metrics output: TensorBoard event files in the run folder (and the progress line's import)."""

from __future__ import annotations

import math
from pathlib import Path

from tensorboard.summary import Writer

from rlserve.run.console import ProgressLine

__all__ = ["MetricsWriter", "ProgressLine"]


class MetricsWriter:
    """Writes the server's metric snapshots as TensorBoard scalars.

    ``tensorboard.summary.Writer`` writes event files without torch or TensorFlow, so the serving
    process stays torch-free.

    Args:
        run_dir: The run folder; event files go directly into it.
    """

    def __init__(self, run_dir: Path):
        run_dir.mkdir(parents=True, exist_ok=True)
        self._writer = Writer(str(run_dir))

    def write(self, metrics: dict[str, float], step: int) -> None:
        """Write every finite metric at ``step`` (env steps)."""
        for name, value in metrics.items():
            if not math.isnan(value):
                self._writer.add_scalar(name, float(value), step)
        self._writer.flush()

    def close(self) -> None:
        """Flush and close the event file."""
        self._writer.close()
