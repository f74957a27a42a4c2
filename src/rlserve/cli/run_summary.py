"""``rlserve status RUN_FOLDER`` for a run no server answers for: a summary from its files.

A finished served run, or a hosted one (``rlserve train``, an Algorithm with a run folder), is
summarised from the last row of its ``progress.csv``, its checkpoints and ``endpoints.json``.
Standard library only.
"""

from __future__ import annotations

import json
import math
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from rlserve.errors import ConfigError
from rlserve.run.progress_file import PROGRESS_FILE, read_progress


def server_gone(endpoints: dict[str, Any]) -> bool:
    """Whether the server process ``endpoints.json`` names is gone (killed, crashed).

    Its ``state`` stays ``running`` then: only a server that stops cleanly rewrites it. Only
    checked on the machine that wrote it (a run folder may be shared with a container).
    """
    if sys.platform == "win32" or endpoints.get("machine") != socket.gethostname():
        return False  # Windows: os.kill(pid, 0) would send CTRL_C_EVENT
    pid = endpoints.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # alive, another user's
        return False
    return False


def run_checkpoints(folder: Path) -> list[Path]:
    """The run's checkpoints, every policy's, oldest first within a policy."""
    found = sorted(folder.glob("checkpoints/ckpt_*.pt"))
    found += sorted(folder.glob("policies/*/checkpoints/ckpt_*.pt"))
    return found


def _state(folder: Path) -> str:
    """The run's state: finished, running, not running (its server is gone), or hosted."""
    try:
        endpoints = json.loads((folder / "endpoints.json").read_text())
    except (OSError, ValueError):
        return "hosted"
    if endpoints.get("state") == "stopped":
        return (
            f"finished (stopped {endpoints.get('stopped', '?')}; 'rlserve serve --resume "
            f"{folder}' continues it)"
        )
    if server_gone(endpoints):
        return (
            f"not running (its server, process {endpoints['pid']}, is gone: killed or crashed; "
            f"'rlserve serve --resume {folder}' continues it)"
        )
    return "running"


def folder_summary(folder: Path) -> dict[str, Any]:
    """What ``rlserve status`` shows of a run folder, as a JSON-able dict.

    Raises:
        ConfigError: The folder has no ``progress.csv`` or no row in it.
    """
    try:
        rows = read_progress(folder)
    except FileNotFoundError:
        raise ConfigError(
            f"{folder} has no {PROGRESS_FILE} (a run of rlserve older than 0.2, or one that "
            "never reported); pass the HTTP address of a running server instead, e.g. "
            "localhost:9901"
        ) from None
    except OSError as exc:
        raise ConfigError(f"{folder / PROGRESS_FILE}: unreadable ({exc})") from None
    if not rows:
        raise ConfigError(
            f"{folder / PROGRESS_FILE} has no row yet: the run has not reported; wait for its "
            "first metrics interval or training iteration"
        )
    return {
        "run": str(folder),
        "state": _state(folder),
        "reports": len(rows),
        "first": rows[0],
        "last": rows[-1],
        "checkpoints": [str(p.relative_to(folder)) for p in run_checkpoints(folder)],
    }


def _number(value: float | None, digits: int = 0) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    return f"{value:,.{digits}f}"


def _when(stamp: float | None) -> str:
    if stamp is None:
        return "?"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stamp))


def format_summary(summary: dict[str, Any]) -> str:
    """The summary of :func:`folder_summary` as a few labelled lines."""
    last, first = summary["last"], summary["first"]
    version = last.get("learner/weights_version")
    span = (last.get("time") or 0.0) - (first.get("time") or 0.0)
    checkpoints = summary["checkpoints"]
    return "\n".join(
        [
            f"run       {summary['run']}: {summary['state']}, {summary['reports']} reports "
            f"from {_when(first.get('time'))} to {_when(last.get('time'))} ({span:,.0f} s)",
            f"progress  {_number(last.get('samples/env_steps'))} env steps, "
            f"{_number(last.get('samples/env_steps_per_second'), 1)} steps/s at the last report, "
            + (f"weights v{version:.0f}" if version is not None and version >= 0 else "no weights"),
            f"episodes  {_number(last.get('episodes/completed'))} completed; "
            f"return(100) {_number(last.get('episodes/return_mean'), 2)} "
            f"(min {_number(last.get('episodes/return_min'), 2)}, "
            f"max {_number(last.get('episodes/return_max'), 2)}), "
            f"length(100) {_number(last.get('episodes/length_mean'), 1)}",
            f"learner   {_number(last.get('learner/updates'))} updates, "
            f"{_number(last.get('learner/steps_trained'))} steps trained",
            f"saved     {len(checkpoints)} checkpoints"
            + (f", newest {checkpoints[-1]}" if checkpoints else ""),
        ]
    )
