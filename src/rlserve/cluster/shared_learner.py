"""The one learner of several serving front-ends, as a Ray actor (``rlserve serve --replicas``).

Each front-end keeps its own experience log and ships its records here (see
:mod:`~rlserve.cluster.front_end_link`). The learner merges them into a log of its own, on its
node's disk, and runs the learner process's loop
(:func:`~rlserve.training.learner_worker.learn`) over that merged log, so training, checkpoints
and their trained-through positions are those of one server.

Merging is where exactly-once comes from. Per front-end the learner knows the newest seq of
that front-end's log it has merged (a replayed record is skipped), and it keeps the newest
:data:`SEEN_BATCHES` report batch ids it merged (a batch logged by a front-end that died before
acknowledging it, re-sent by its client to another front-end, is merged once, whichever copy
comes first). Both are read back from the merged log when the actor starts again: each merged
record's ``kind`` names its front-end and seq there (``"report fe1 42"``).
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from rlserve.cluster.ray_import import import_ray
from rlserve.run.experience_log import ExperienceLog
from rlserve.training.learner_worker import learn

__all__ = ["SEEN_BATCHES", "MergedLog", "SharedLearner"]

SEEN_BATCHES = 100_000
"""How many merged report batch ids the learner remembers (the newest)."""

EXCHANGE_WAIT_S = 0.02
"""Seconds an exchange waits for a message of the learner before answering with none."""

MAX_OUTBOX = 1_000
"""Messages kept for a front-end that does not call (weights replace older ones anyway)."""

_PER_FRONT_END = ("waiting", "consumed", "owed")
"""Messages of the learner about its position in the merged log: not passed on as they are."""


class MergedLog:
    """The learner's log of every front-end's records, each merged once.

    Args:
        directory: The merged log's folder (on the learner's node).
    """

    def __init__(self, directory: Path) -> None:
        self.log = ExperienceLog(directory)
        self.merged_through: dict[str, int] = {}
        """Per front-end, the newest seq of its log that is merged (or skipped as a copy)."""
        self.seen: OrderedDict[str, None] = OrderedDict()
        self.duplicate_steps = 0
        """Steps of report batches skipped because another front-end's copy was merged."""
        for record in self.log.open():
            _, front_end, seq = record.kind.split(" ")
            self._merged(front_end, int(seq), record.batch_id)

    def _merged(self, front_end: str, seq: int, batch_id: str | None) -> None:
        self.merged_through[front_end] = max(self.merged_through.get(front_end, 0), seq)
        if batch_id is not None:
            self.seen[batch_id] = None
            while len(self.seen) > SEEN_BATCHES:
                self.seen.popitem(last=False)

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
            else:
                self.log.append(f"{kind} {front_end} {int(seq)}", int(steps), payload, batch_id)
                appended += 1
            self._merged(front_end, int(seq), batch_id)
        if appended:
            self.log.sync()
        return appended


class _FanOut:
    """The learner loop's channel: its messages copied to every front-end's outbox.

    A ``weights`` message's package is put in Ray's object store once (``package_ref``).
    """

    def __init__(self, put: Callable[[Any], Any]) -> None:
        self._put = put
        self.inbox: deque[dict[str, Any]] = deque()
        self._arrived = threading.Condition()
        self._outboxes: dict[str, deque[dict[str, Any]]] = {}
        self._lives: dict[str, str] = {}
        self._latest: dict[str, dict[str, Any]] = {}
        """The newest ready, per-policy weights and metrics: what a newcomer is told first."""
        self._ready = threading.Condition()
        self.steps_consumed = 0.0

    def send(self, message: dict[str, Any]) -> None:
        kind = str(message["type"])
        if kind == "consumed":
            self.steps_consumed = float(message["steps_consumed"])
        if kind in _PER_FRONT_END:
            return
        if kind == "weights":
            # Put in the object store once, fetched by each front-end (once per node).
            message = {**message, "package": None, "package_ref": [self._put(message["package"])]}
        with self._ready:
            if kind in ("ready", "weights", "metrics"):
                self._latest[f"{kind}:{message.get('policy_id', '')}"] = message
            for outbox in self._outboxes.values():
                if kind == "weights":
                    pid = message.get("policy_id")
                    kept = [m for m in outbox if m["type"] != "weights" or m["policy_id"] != pid]
                    outbox.clear()
                    outbox.extend(kept)
                elif len(outbox) == outbox.maxlen:
                    continue  # a front-end away this long is told the newest state on return
                outbox.append(message)
            self._ready.notify_all()

    def receive(self, block: bool = True) -> dict[str, Any] | None:
        with self._arrived:
            while block and not self.inbox:
                self._arrived.wait()
            return self.inbox.popleft() if self.inbox else None

    def put(self, messages: Iterable[dict[str, Any]]) -> None:
        with self._arrived:
            self.inbox.extend(messages)
            self._arrived.notify_all()

    def take(
        self, front_end: str, life: str, wait_s: float, done: threading.Event
    ) -> list[dict[str, Any]]:
        with self._ready:
            outbox = self._outboxes.get(front_end)
            if outbox is None or self._lives.get(front_end) != life:
                # A new front-end, or one back from the dead: the newest state first, not what
                # piled up for its last life.
                latest = sorted(self._latest.values(), key=lambda m: m["type"] != "ready")
                outbox = self._outboxes[front_end] = deque(latest, maxlen=MAX_OUTBOX)
                self._lives[front_end] = life
            if not outbox and not done.is_set():
                self._ready.wait(wait_s)
            taken = list(outbox)
            outbox.clear()
            return taken

    def wake(self) -> None:
        with self._ready:
            self._ready.notify_all()


class SharedLearner:
    """The learner of every front-end (made a Ray actor by the owner's link).

    Args:
        setup: The learner's set-up (see :func:`~rlserve.training.learner_worker.run_learner`);
            its ``run_dir`` is where the merged log is kept (``experience/`` in it).
    """

    def __init__(self, setup: dict[str, Any]) -> None:
        self._merged = MergedLog(Path(setup["run_dir"]) / "experience")
        self._lock = threading.Lock()
        self._pipe = _FanOut(import_ray("the shared learner").put)
        self._done = threading.Event()
        # What a restarted learner merged before: read from its checkpoint's position on.
        self._pipe.put([{"type": "available", "through": self._merged.log.last_seq}])
        self._thread = threading.Thread(
            target=self._run, args=(setup,), name="rlserve-learner", daemon=True
        )
        self._thread.start()

    def _run(self, setup: dict[str, Any]) -> None:
        try:
            with contextlib.suppress(EOFError, BrokenPipeError, ConnectionResetError):
                learn(self._pipe, setup)
        finally:
            self._done.set()
            self._pipe.wake()

    def greet(self) -> dict[str, Any]:
        """Where it runs."""
        import os

        import ray

        return {"pid": os.getpid(), "node": ray.util.get_node_ip_address()}

    def exchange(
        self,
        front_end: str,
        life: str,
        records: list[Sequence[Any]],
        messages: list[dict[str, Any]],
    ) -> dict[str, Any]:
        """Merge ``front_end``'s records, take its messages; the learner's messages for it.

        ``life`` tells one run of a front-end from the next (a restarted one is told the
        learner's newest state first).

        Returns:
            ``merged_through`` (the newest seq of its log that is merged: acknowledged),
            ``messages``, ``steps_consumed`` (merged steps the learner has read), ``running``.
        """
        with self._lock:
            if self._merged.merge(front_end, records):
                self._pipe.put([{"type": "available", "through": self._merged.log.last_seq}])
            merged_through = self._merged.merged_through.get(front_end, 0)
        self._pipe.put(messages)
        taken = self._pipe.take(front_end, life, EXCHANGE_WAIT_S, self._done)
        return {
            "merged_through": merged_through,
            "messages": taken,
            "steps_consumed": self._pipe.steps_consumed,
            "duplicate_steps": self._merged.duplicate_steps,
            "running": not (self._done.is_set() and not taken),
        }

    def close(self) -> None:
        """Flush the merged log."""
        with self._lock:
            self._merged.log.close()
