"""Metrics output: TensorBoard event files in the run folder and the terminal progress line."""

from __future__ import annotations

import math
import sys
from pathlib import Path

from tensorboard.summary import Writer


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


class ProgressLine:
    """A one-line progress display: redrawn in place on a terminal, else a line per update."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self._tty = sys.stderr.isatty()
        self._width = 0

    def show(self, line: str) -> None:
        """Display ``line``."""
        if not self.enabled:
            return
        if self._tty:
            sys.stderr.write("\r" + line.ljust(self._width))
            self._width = len(line)
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def finish(self) -> None:
        """End the in-place line so later output starts on a new line."""
        if self.enabled and self._tty and self._width:
            sys.stderr.write("\n")
            sys.stderr.flush()
