"""A policy's checkpoint folder: ``ckpt_<updates>.pt`` files, each with a ``.json`` side file.

The side file holds the experience-log position the checkpoint trained through, so the log's
clean-up and a restart can read it without torch. Needs only the standard library.
"""

from __future__ import annotations

import json
from pathlib import Path

from rlserve.run.durable import atomic_write_bytes


def checkpoints_in(folder: Path) -> list[Path]:
    """The checkpoints in ``folder``, oldest first (none when it does not exist)."""
    return sorted(folder.glob("ckpt_*.pt"))


def checkpoint_path(folder: Path, updates: int) -> Path:
    """The name of the checkpoint written after ``updates`` updates."""
    return folder / f"ckpt_{updates:07d}.pt"


def trained_through_of(checkpoint: Path) -> int:
    """The experience-log position a checkpoint trained through, from its side file (0: unknown).

    A checkpoint without the side file keeps the whole log, which is always safe.
    """
    try:
        return int(json.loads(checkpoint.with_suffix(".json").read_text())["trained_through"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def write_side_file(checkpoint: Path, trained_through: int) -> None:
    """Record (atomically) the log position ``checkpoint`` trained through."""
    atomic_write_bytes(
        checkpoint.with_suffix(".json"), json.dumps({"trained_through": trained_through}).encode()
    )


def prune(folder: Path, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` checkpoints (and their side files); return the kept."""
    for old in checkpoints_in(folder)[:-keep]:
        old.unlink(missing_ok=True)
        old.with_suffix(".json").unlink(missing_ok=True)
    return checkpoints_in(folder)


def log_needed_after(kept: list[Path]) -> int:
    """The log position the kept checkpoints need the log from (the oldest's trained position).

    The log must reach back to the oldest kept checkpoint: it is the fallback when a newer one
    turns out damaged.
    """
    return min((trained_through_of(path) for path in kept), default=0)
