"""An Algorithm's checkpoint folder: each policy's learner checkpoints and its counters file.

The folder is a run folder (``rlserve export`` reads it): every policy's learner writes
``checkpoints/ckpt_*.pt`` under its own path (the newest ``keep_checkpoints`` are kept), and the
Algorithm's own counters go to :data:`STATE_FILE`, which names each policy's checkpoint and
algorithm.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rlserve.errors import ConfigError
from rlserve.learners.base import Learner
from rlserve.run.durable import atomic_write_bytes
from rlserve.server.policies import policy_paths
from rlserve.training.policy_learner import write_checkpoint

STATE_FILE = "algorithm.json"
"""The Algorithm's own counters in a checkpoint folder (next to the learners' files)."""


def save_learners(
    folder: Path, learners: dict[str, Learner], flat: bool, iteration: int, keep: int
) -> dict[str, str]:
    """Checkpoint every policy's learner into ``folder``; keep the newest ``keep`` of each.

    Args:
        folder: The checkpoint (run) folder.
        learners: Each policy's learner, by id.
        flat: Whether the folder has the single-policy layout.
        iteration: The Algorithm's iteration, stored with each checkpoint.
        keep: Checkpoints kept per policy.

    Returns:
        Each policy's checkpoint, relative to ``folder``.
    """
    files = {}
    for pid, learner in learners.items():
        checkpoints = policy_paths(folder, pid, flat).checkpoints
        checkpoints.mkdir(parents=True, exist_ok=True)
        path, _ = write_checkpoint(learner, checkpoints, {"iteration": iteration}, keep)
        files[pid] = str(path.relative_to(folder))
    return files


def write_state(folder: Path, state: dict[str, Any]) -> None:
    """Write the Algorithm's counters to ``folder``'s :data:`STATE_FILE` (atomically)."""
    atomic_write_bytes(folder / STATE_FILE, json.dumps(state, indent=2).encode())


def read_state(folder: Path) -> dict[str, Any]:
    """The Algorithm's counters of a checkpoint folder.

    Raises:
        ConfigError: ``folder`` is not an Algorithm checkpoint (no readable :data:`STATE_FILE`).
    """
    try:
        state: dict[str, Any] = json.loads((folder / STATE_FILE).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"{folder} is not an Algorithm checkpoint ({STATE_FILE} unreadable: {exc}); "
            "pass the folder algo.save() returned"
        ) from exc
    return state


def check_restorable(folder: Path, state: dict[str, Any], algorithms: dict[str, str]) -> None:
    """Check that the checkpoint ``state`` of ``folder`` can continue each policy.

    Args:
        folder: The checkpoint folder (for messages).
        state: Its counters (:func:`read_state`).
        algorithms: Each policy's algorithm in the Algorithm restoring it, by id.

    Raises:
        ConfigError: A policy has no checkpoint there, or one of another algorithm.
    """
    saved_algorithms = state.get("algorithms") or {}
    for pid, algo in algorithms.items():
        relative = state["checkpoints"].get(pid)
        if relative is None:
            raise ConfigError(f"{folder} has no checkpoint of the policy '{pid}'")
        before = saved_algorithms.get(pid, algo)
        if before != algo:
            raise ConfigError(
                f"the checkpoint of policy '{pid}' in {folder} is {before}'s, and this "
                f"Algorithm trains it with {algo}, which cannot continue "
                f"it; declare the policy with algo='{before}' (or restore without a config: "
                "Algorithm.from_checkpoint(folder)), or start a new run"
            )
