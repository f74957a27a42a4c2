"""The shared learner's merged log: every front-end's records, each merged once.

Merging is where exactly-once comes from. Per front-end the log knows the newest seq of that
front-end's log it has merged (a replayed record is skipped), and it keeps the newest
:data:`SEEN_BATCHES` report batch ids it merged (a batch logged by a front-end that died before
acknowledging it, re-sent by its client to another front-end, is merged once, whichever copy
comes first). Each merged record's ``kind`` names its front-end and seq (``"report fe1 42"``).

That *merge state* can be told as of any position of the merged log (:meth:`MergedLog.state_at`):
a recovery point (:mod:`~rlserve.cluster.recovery`) carries it, so a learner that lost its disk
starts a new merged log after the recovery point's position (:meth:`MergedLog.install`) and the
front-ends ship it what came after. The log is cleaned through a position once the state there
is saved beside it (``merge_state.bin``): a learner that starts again reads that file and the
records after it.
"""

from __future__ import annotations

import shutil
from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from rlserve.protocol.codec import decode, encode
from rlserve.run.durable import atomic_write_bytes
from rlserve.run.experience_log import (
    DEFAULT_SEGMENT_BYTES,
    LOG_LIMITS,
    ExperienceLog,
    LogReader,
)

__all__ = ["SEEN_BATCHES", "STATE_FILE", "MergedLog", "read_records"]

SEEN_BATCHES = 100_000
"""How many merged report batch ids the learner remembers (the newest)."""

STATE_FILE = "merge_state.bin"
"""The merge state at the position the log is cleaned through (msgpack, in the log's folder)."""


def _fold(
    through: dict[str, int],
    seen: OrderedDict[str, None],
    front_end: str,
    seq: int,
    batch_id: str | None,
) -> None:
    through[front_end] = max(through.get(front_end, 0), seq)
    if batch_id is not None:
        seen[batch_id] = None
        seen.move_to_end(batch_id)
        while len(seen) > SEEN_BATCHES:
            seen.popitem(last=False)


def read_records(directory: Path, after: int, through: int) -> list[tuple[Any, ...]]:
    """The merged records with ``after < seq <= through``, as shipped ``(seq, kind, ...)``."""
    if through <= after:
        return []
    reader = LogReader(directory)
    try:
        return [
            (r.seq, r.kind, r.steps, r.batch_id, r.payload) for r in reader.records(after, through)
        ]
    finally:
        reader.close()


class MergedLog:
    """The learner's log of every front-end's records, each merged once.

    Args:
        directory: The merged log's folder (on the learner's node).
        segment_bytes: Size at which the log starts a new segment (cleaning deletes whole ones).
    """

    def __init__(self, directory: Path, segment_bytes: int = DEFAULT_SEGMENT_BYTES) -> None:
        self.directory = directory
        self.log = ExperienceLog(directory, segment_bytes)
        self.merged_through: dict[str, int] = {}
        """Per front-end, the newest seq of its log that is merged (or skipped as a copy)."""
        self.seen: OrderedDict[str, None] = OrderedDict()
        self.duplicate_steps = 0
        """Steps of report batches skipped because another front-end's copy was merged."""
        base = _read_state(directory)
        self._base_position = int(base.get("position", 0))
        self._base_through = {str(k): int(v) for k, v in base.get("merged_through", {}).items()}
        self._base_seen: OrderedDict[str, None] = OrderedDict.fromkeys(
            str(b) for b in base.get("seen", ())
        )
        self.merged_through = dict(self._base_through)
        self.seen = OrderedDict(self._base_seen)
        # What was merged after the base position: (merged seq, front-end, its seq, batch id).
        self._since: deque[tuple[int, str, int, str | None]] = deque()
        records = self.log.open()
        if self.log.last_seq < self._base_position:
            self.log.last_seq = self.log.synced_seq = self._base_position  # a log started anew
        for record in records:
            if record.seq > self._base_position:
                _, front_end, seq = record.kind.split(" ")
                self._merged(record.seq, front_end, int(seq), record.batch_id)

    @property
    def base_position(self) -> int:
        """The position whose merge state is saved (the log is cleaned through it)."""
        return self._base_position

    def _merged(self, position: int, front_end: str, seq: int, batch_id: str | None) -> None:
        _fold(self.merged_through, self.seen, front_end, seq, batch_id)
        self._since.append((position, front_end, seq, batch_id))

    def merge(self, front_end: str, records: Iterable[Sequence[Any]]) -> int:
        """Append the records of ``front_end`` not merged yet; how many were appended.

        Each record is ``(seq, kind, steps, batch_id, payload)`` of the front-end's log. The
        appended ones are flushed to the disk before this returns.
        """
        appended = 0
        for seq, kind, steps, batch_id, payload in records:
            if int(seq) <= self.merged_through.get(front_end, 0):
                continue  # replayed: merged already
            if batch_id is not None and batch_id in self.seen:
                self.duplicate_steps += int(steps)  # a copy re-sent to another front-end
                self.merged_through[front_end] = int(seq)
                continue
            position = self.log.append(
                f"{kind} {front_end} {int(seq)}", int(steps), payload, batch_id
            )
            self._merged(position, front_end, int(seq), batch_id)
            appended += 1
        if appended:
            self.log.sync()
        return appended

    def state_at(self, position: int) -> dict[str, Any]:
        """The merge state as of ``position`` (at least the base position).

        A copy skipped after ``position`` is not in it: shipped again after a restart from
        there, it is skipped again (its batch id is in ``seen``, or merged anew once).

        Returns:
            ``position``, ``merged_through`` (per front-end) and ``seen`` (batch ids, oldest
            first).
        """
        position = max(position, self._base_position)
        through = dict(self._base_through)
        seen = OrderedDict(self._base_seen)
        for merged, front_end, seq, batch_id in self._since:
            if merged > position:
                break
            _fold(through, seen, front_end, seq, batch_id)
        return {"position": position, "merged_through": through, "seen": list(seen)}

    def clean(self, position: int) -> int:
        """Delete the segments through ``position`` once its merge state is saved; how many.

        Raises:
            OSError: The state could not be saved (nothing is deleted then).
        """
        if position <= self._base_position or position > self.log.last_seq:
            return 0
        state = self.state_at(position)
        atomic_write_bytes(self.directory / STATE_FILE, encode(state))
        self._base_position = position
        self._base_through = dict(state["merged_through"])
        self._base_seen = OrderedDict.fromkeys(state["seen"])
        while self._since and self._since[0][0] <= position:
            self._since.popleft()
        return self.log.delete_through(position)

    @staticmethod
    def install(directory: Path, state: dict[str, Any], records: Sequence[Sequence[Any]]) -> None:
        """Start ``directory``'s merged log anew from a recovery point.

        Args:
            directory: The merged log's folder (what is there is deleted).
            state: The merge state at the recovery point (:meth:`state_at`'s).
            records: The merged records up to its position that it keeps (``(seq, kind,
                steps, batch_id, payload)`` with the merged log's seqs, in order).
        """
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        atomic_write_bytes(directory / STATE_FILE, encode(dict(state)))
        log = ExperienceLog(directory)
        log.open()
        if records:
            log.last_seq = int(records[0][0]) - 1
        for _, kind, steps, batch_id, payload in records:
            log.append(str(kind), int(steps), bytes(payload), batch_id)
        log.close()

    def close(self) -> None:
        """Flush and close the log."""
        self.log.close()


def _read_state(directory: Path) -> dict[str, Any]:
    try:
        data = (directory / STATE_FILE).read_bytes()
    except FileNotFoundError:
        return {}
    return decode(data, LOG_LIMITS)
