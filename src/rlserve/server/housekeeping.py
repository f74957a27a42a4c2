"""The serving process's periodic chores: idle episodes, counters, metrics files, state on disk.

Every ``metrics_interval`` seconds :class:`Housekeeping` closes the episodes whose clients went
silent, ticks the counters, writes the TensorBoard events and ``progress.csv``, saves the server's
state (counters and the experience log's position) and shows the progress line; at shutdown
:meth:`Housekeeping.finish` does the last round and closes the files.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

from rlserve.run.experience_log import ExperienceLog
from rlserve.run.metrics import MetricsWriter, ProgressLine
from rlserve.run.state_store import StateStore
from rlserve.server.config import ServerConfig
from rlserve.server.service import Service
from rlserve.server.stats import ServerStats

logger = logging.getLogger("rlserve.server")


class Housekeeping:
    """The policy server's periodic chores and their files.

    Args:
        config: The server's configuration (``metrics_interval``, ``idle_timeout``,
            ``progress``).
        service: The service whose idle episodes are closed.
        stats: The counters ticked, written and saved.
        store: Where the server's state is saved.
        log: The experience log, whose position is saved with the state.
        metrics_folder: Where the TensorBoard events and ``progress.csv`` go.
    """

    def __init__(
        self,
        config: ServerConfig,
        service: Service,
        stats: ServerStats,
        store: StateStore,
        log: ExperienceLog,
        metrics_folder: Path,
    ):
        self.config = config
        self.service = service
        self.stats = stats
        self.store = store
        self.log = log
        self.metrics_folder = metrics_folder
        self._metrics: MetricsWriter | None = None
        self._progress = ProgressLine(config.progress)

    async def run(self, stopping: asyncio.Event) -> None:
        """Do the chores every ``metrics_interval`` seconds until ``stopping`` is set."""
        # Each chore is guarded on its own: a failing write (disk full, read-only folder, too
        # many open files) is logged, counted and retried next time, and never stops reaping
        # idle episodes or serving.
        while not stopping.is_set():
            await asyncio.sleep(self.config.metrics_interval)
            try:
                self.service.expire_idle(self.config.idle_timeout)
            except Exception:
                logger.exception("rlserve: closing idle episodes failed")
            self.stats.tick()
            await self.write_metrics()
            await self.save_state()
            self._progress.show(self.stats.progress_line())

    async def write_metrics(self) -> None:
        """Append the counters to the metrics files (a failure is counted, not raised)."""
        snapshot, step = self.stats.snapshot(), self.stats.env_steps

        def write() -> None:
            if self._metrics is None:
                self._metrics = MetricsWriter(self.metrics_folder)
            try:
                self._metrics.write(snapshot, step)
            except BaseException:
                self._metrics = None  # start a fresh event file next time
                raise

        try:
            await asyncio.get_running_loop().run_in_executor(None, write)
            self.stats.storage_ok("metrics files")
        except Exception as exc:
            self.stats.storage_failed("metrics files", exc)

    async def save_state(self) -> None:
        """Save the counters and the log's position (a failure is counted, not raised)."""
        state = {**self.stats.state(), "log_seq": self.log.last_seq}
        try:
            await asyncio.get_running_loop().run_in_executor(None, self.store.save_state, state)
            self.stats.storage_ok("server state")
        except OSError as exc:
            self.stats.storage_failed("server state", exc)

    async def finish(self) -> None:
        """The last round at shutdown: tick, save the state, write the metrics, close them."""
        self.stats.tick()
        await self.save_state()
        await self.write_metrics()
        if self._metrics is not None:
            with contextlib.suppress(Exception):
                self._metrics.close()
        self._progress.finish()
