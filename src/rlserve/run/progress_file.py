"""``progress.csv``: one row per metrics report of a run, with the same columns in every mode.

A served run writes a row every ``--metrics-interval`` seconds and at shutdown, a hosted run
(an Algorithm, ``rlserve train``) one per training iteration. The header is
:data:`PROGRESS_COLUMNS`, whatever the mode; a value the run has not got (no episode finished
yet, no learner update) is an empty cell. A resumed run appends to its file.
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

PROGRESS_FILE = "progress.csv"
"""The file's name in the run folder."""

PROGRESS_COLUMNS = (
    "time",
    "samples/env_steps",
    "samples/env_steps_per_second",
    "episodes/completed",
    "episodes/return_mean",
    "episodes/return_min",
    "episodes/return_max",
    "episodes/length_mean",
    "learner/updates",
    "learner/steps_trained",
    "learner/weights_version",
)
"""The header: ``time`` (Unix seconds of the row) and metric names of docs/metrics.md."""


def _cell(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return ""
    if float(value).is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(float(value))


class ProgressFile:
    """Appends rows to a run folder's ``progress.csv``.

    An existing file with another header (written by another rlserve version) is moved aside to
    ``progress.<n>.csv`` so that the columns of one file never change.

    Args:
        folder: The run folder (or the folder of an attached server's metrics).
    """

    def __init__(self, folder: Path):
        self.path = folder / PROGRESS_FILE
        self._header_ok = False

    def _prepare(self) -> None:
        header = ",".join(PROGRESS_COLUMNS)
        if self.path.exists():
            with self.path.open(encoding="utf-8") as f:
                first = f.readline().rstrip("\r\n")
            if first == header:
                self._header_ok = True
                return
            if first:
                n = 1
                while (aside := self.path.with_name(f"progress.{n}.csv")).exists():
                    n += 1
                self.path.rename(aside)
        with self.path.open("w", encoding="utf-8", newline="") as f:
            f.write(header + "\n")
        self._header_ok = True

    def append(self, metrics: dict[str, float], now: float) -> None:
        """Append the row of ``metrics`` (names absent from it are empty), at time ``now``.

        Raises:
            OSError: The file cannot be written (the caller counts storage errors).
        """
        if not self._header_ok:
            self._prepare()
        row = [_cell(now)] + [_cell(metrics.get(name)) for name in PROGRESS_COLUMNS[1:]]
        with self.path.open("a", encoding="utf-8", newline="") as f:
            f.write(",".join(row) + "\n")


def read_progress(folder: Path) -> list[dict[str, float | None]]:
    """The rows of ``folder``'s ``progress.csv`` (empty cells are None), oldest first.

    A row that is not all numbers (a line cut short by a crash) is left out.

    Raises:
        FileNotFoundError: The folder has no ``progress.csv``.
    """
    text = (folder / PROGRESS_FILE).read_text(encoding="utf-8")
    rows = []
    for raw in csv.DictReader(io.StringIO(text)):
        try:
            rows.append({k: (float(v) if v else None) for k, v in raw.items() if k is not None})
        except (TypeError, ValueError):
            continue
    return rows
