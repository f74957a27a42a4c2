"""What the dashboard shows: a sample of the server's metrics every second, and their history.

:class:`DashboardFeed` reads :meth:`ServerStats.snapshot` (nothing else of the counters) and turns
it into the page's series through the two tables :data:`TOTAL_SERIES` and :data:`POLICY_SERIES`,
the one place that names metric keys for the dashboard. The page draws every series these tables
name; a key missing from the snapshot gives ``null`` (a gap), never an error.

The history keeps the whole run in a bounded number of points: when it is full, every other
point is dropped and points are taken half as often from then on.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from rlserve.server.client_activity import ClientActivity
from rlserve.server.stats import ServerStats
from rlserve.server.throttled_log import SERVER_LOG

TOTAL_SERIES: dict[str, str] = {
    "env_steps": "samples/env_steps",
    "steps_per_s": "samples/env_steps_per_second",
    "return_mean": "episodes/return_mean",
    "length_mean": "episodes/length_mean",
    "episodes_completed": "episodes/completed",
    "episodes_open": "server/episodes_active",
    "clients": "server/clients",
    "weights_version": "server/weights_version",
    "learner_restarts": "learner/restarts",
    "learner_lag_steps": "samples/learner_lag_steps",
    "steps_queued": "samples/steps_queued",
    "errors": "server/errors",
    "uptime_s": "server/uptime_seconds",
}
"""Server-wide series: dashboard name -> :meth:`ServerStats.snapshot` key."""

POLICY_SERIES: dict[str, tuple[str, str]] = {
    "return_mean": ("episodes/return_mean", "episodes/return_mean"),
    "policy_loss": ("learner/policy_loss", "learner/policy_loss"),
    "value_loss": ("learner/value_loss", "learner/value_loss"),
    "entropy": ("learner/entropy", "learner/entropy"),
    "kl": ("learner/approx_kl", "learner/approx_kl"),
    "weights_version": ("weights_version", "server/weights_version"),
    "updates": ("learner/updates", "learner/updates"),
    "steps_trained": ("learner/steps_trained", "learner/steps_trained"),
    "update_seconds": ("learner/update_seconds", "learner/update_seconds"),
}
"""Per-policy series: dashboard name -> (key under ``policies/<id>/`` on a server of several
policies, key of the one policy's server)."""

HISTORY_POINTS = 2000
"""Most points kept in the history (per series)."""

SAMPLE_SECONDS = 1.0
"""Seconds between samples (and between the page's updates)."""


def _finite(value: Any) -> float | None:
    """A number for JSON: NaN and infinities become None."""
    if value is None:
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def newest_checkpoint(folder: Path) -> dict[str, Any] | None:
    """The newest ``*.pt`` file in ``folder`` (``name`` and ``age_s``), or None."""
    newest: tuple[float, str] | None = None
    with contextlib.suppress(OSError), os.scandir(folder) as entries:
        for entry in entries:
            if entry.name.endswith(".pt") and entry.is_file():
                mtime = entry.stat().st_mtime
                if newest is None or mtime > newest[0]:
                    newest = (mtime, entry.name)
    if newest is None:
        return None
    return {"name": newest[1], "age_s": max(0.0, time.time() - newest[0])}


class History:
    """At most ``capacity`` points spread over the whole run (see the module docstring)."""

    def __init__(self, capacity: int = HISTORY_POINTS) -> None:
        self.capacity = max(2, capacity)
        self.points: list[dict[str, Any]] = []
        self._stride = 1
        self._skipped = 0

    def add(self, point: dict[str, Any]) -> None:
        """Offer a point; it is kept when it falls on the current stride."""
        self._skipped += 1
        if self._skipped < self._stride:
            return
        self._skipped = 0
        if len(self.points) >= self.capacity:
            self.points = self.points[::2]
            self._stride *= 2
        self.points.append(point)


class DashboardFeed:
    """Samples the server's state for the dashboard and wakes the pages that follow it.

    Args:
        stats: The server's counters (read through :meth:`ServerStats.snapshot`).
        activity: Requests per client.
        open_episodes: Open episodes per client identity.
        health: What ``GET /v1/health`` adds: ``status`` and ``problems``.
        checkpoint_folders: Each policy's checkpoint folder, by id.
        capacity: Points the history keeps.
    """

    def __init__(
        self,
        stats: ServerStats,
        activity: ClientActivity,
        open_episodes: Callable[[], dict[str, int]],
        health: Callable[[], dict[str, Any]],
        checkpoint_folders: dict[str, Path],
        capacity: int = HISTORY_POINTS,
    ) -> None:
        self._stats = stats
        self._activity = activity
        self._open_episodes = open_episodes
        self._health = health
        self._checkpoints = checkpoint_folders
        self.history = History(capacity)
        self.latest: dict[str, Any] | None = None
        self.stopped = False
        self._next = asyncio.Event()

    @property
    def policy_ids(self) -> tuple[str, ...]:
        """The policies, in the server's order."""
        return self._stats.policy_ids

    def sample(self) -> dict[str, Any]:
        """Take a sample now: keep it in the history, and wake the pages waiting for one."""
        snapshot = self._stats.snapshot()
        several = self._stats.several
        policies = {}
        for pid in self.policy_ids:
            prefix = f"policies/{pid}/"
            policies[pid] = {
                name: _finite(snapshot.get(prefix + many if several else one))
                for name, (many, one) in POLICY_SERIES.items()
            }
        totals = {name: _finite(snapshot.get(key)) for name, key in TOTAL_SERIES.items()}
        point = {"env_steps": totals["env_steps"] or 0, "totals": totals, "policies": policies}
        health = self._health()
        sample = {
            **point,
            "clients": self._activity.table(self._open_episodes()),
            "checkpoints": {
                pid: newest_checkpoint(folder) for pid, folder in self._checkpoints.items()
            },
            "health": {"status": health.get("status", "ok"), "problems": health.get("problems")},
        }
        self.history.add(point)
        self.latest = sample
        waking, self._next = self._next, asyncio.Event()
        waking.set()
        return sample

    def opening(self) -> dict[str, Any]:
        """What a page gets first: the policies, the history, and the latest sample."""
        return {
            "policies": list(self.policy_ids),
            "history": self.history.points,
            "latest": self.latest if self.latest is not None else self.sample(),
        }

    async def follow(self) -> AsyncIterator[dict[str, Any]]:
        """Each new sample, until :meth:`stop`."""
        while not self.stopped:
            waiting = self._next
            await waiting.wait()
            if self.stopped or self.latest is None:
                return
            yield self.latest

    async def run(self, interval: float = SAMPLE_SECONDS) -> None:
        """Sample every ``interval`` seconds until cancelled or :meth:`stop`.

        A sample that fails (an odd metric, a file read) is logged, at most once a minute, and
        the next one is tried: the open pages must not freeze on one bad second.
        """
        while not self.stopped:
            try:
                self.sample()
            except Exception as exc:
                SERVER_LOG.warn("dashboard", f"rlserve: a dashboard sample failed: {exc!r}")
            await asyncio.sleep(interval)

    def stop(self) -> None:
        """End every :meth:`follow` (the pages' streams close, so the server can stop)."""
        self.stopped = True
        self._next.set()
