"""Reading a server's experience log for a learner on another node, a bounded batch at a time.

A learner actor cannot read the serving node's disk, so the server reads its log and ships the
records in the actor calls. A learner that comes back after a long absence may be owed a long
stretch of the log: it goes in several calls of at most :data:`MAX_RECORDS_PER_EXCHANGE`
records each, so each call stays small and the learner's answers (weights, checkpoints) keep
coming while it catches up.
"""

from __future__ import annotations

import logging
from pathlib import Path

from rlserve.run.experience_log import LogCorruptError, LogReader

__all__ = ["MAX_RECORDS_PER_EXCHANGE", "LogShipper", "Shipped"]

logger = logging.getLogger("rlserve.server")

MAX_RECORDS_PER_EXCHANGE = 256
"""Records shipped in one exchange at most (a long replay goes in several)."""

Shipped = tuple[int, str, int, "str | None", bytes]
"""One shipped record: ``(seq, kind, steps, batch_id, payload)``."""


class LogShipper:
    """Reads the records of the experience log in ``directory`` to ship them.

    Args:
        directory: The experience log's folder.
        limit: Records one :meth:`take` returns at most.
    """

    def __init__(self, directory: Path, limit: int = MAX_RECORDS_PER_EXCHANGE) -> None:
        self.directory = directory
        self.limit = limit
        self._reader: LogReader | None = None

    def take(self, after: int, through: int) -> tuple[list[Shipped], int]:
        """The next records (at most :attr:`limit`) after ``after``, and the seq they go through.

        Only records with ``after < seq <= through`` are taken. A stretch that cannot be read
        is logged and skipped: no records, and its end.
        """
        through = min(through, after + self.limit)
        if through <= after:
            return [], after
        if self._reader is None:
            self._reader = LogReader(self.directory)
        try:
            shipped = [
                (r.seq, r.kind, r.steps, r.batch_id, r.payload)
                for r in self._reader.records(after, through)
            ]
        except (LogCorruptError, OSError) as exc:
            logger.warning(
                "rlserve: cannot read the experience log from seq %d to %d for the learner (%s)",
                after,
                through,
                exc,
            )
            self.close()
            return [], through
        return shipped, through

    def close(self) -> None:
        """Close the log file it reads (the next :meth:`take` opens it again)."""
        if self._reader is not None:
            self._reader.close()
            self._reader = None
