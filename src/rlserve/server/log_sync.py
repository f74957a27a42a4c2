"""The experience log's flushes to the disk: one fsync task per server, with group commit.

Both learner sides of a server, :class:`~rlserve.server.learner_link.LearnerLink` (a learner
process) and an Algorithm's in-process hand-off, run :func:`sync_log_forever` on the server's
event loop; the fsync itself runs on an executor thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from rlserve.run.experience_log import ExperienceLog
from rlserve.server.stats import ServerStats

SYNC_INTERVAL = 1.0
"""Seconds between fsyncs of the log when no reported batch waits for one."""


async def sync_log_forever(
    log: ExperienceLog,
    unsynced: asyncio.Event,
    executor: ThreadPoolExecutor,
    stats: ServerStats,
    someone_waits: Callable[[], bool],
    after_sync: Callable[[], None],
) -> None:
    """Fsync the log whenever ``unsynced`` is set, then call ``after_sync``; runs until cancelled.

    When nobody waits for the flush, a few fractions of a second of records are gathered into
    one fsync (group commit). A failing fsync is counted and retried a second later.
    """
    loop = asyncio.get_running_loop()
    while True:
        await unsynced.wait()
        if not someone_waits():
            await asyncio.sleep(SYNC_INTERVAL)
        unsynced.clear()
        try:
            await loop.run_in_executor(executor, log.sync)
        except OSError as exc:
            stats.storage_failed("experience log", exc)
            unsynced.set()
            await asyncio.sleep(1.0)
            continue
        stats.storage_ok("experience log")
        after_sync()
