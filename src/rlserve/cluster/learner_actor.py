"""The server's learner as a Ray actor: the learner process's loop, fed through calls.

The actor runs :func:`~rlserve.training.learner_worker.learn` (the loop of the learner process)
on a thread of its own. It cannot read the server's experience log, which is on another node's
disk, so the server ships the log records with its messages; the loop reads them as it reads
the log (:class:`ShippedRecords`). Each call is an *exchange*
(:meth:`LearnerActorWorker.handle`): the server's messages and records in, the learner's
messages out, answered as soon as the learner has one or after :data:`EXCHANGE_WAIT_S`.

Its checkpoints are on its node's disk, which may be lost with the node: each ``checkpointed``
message carries the checkpoint's files, which the server holds as its recovery point
(:class:`~rlserve.cluster.recovery.HeldCheckpoints`), and a learner started with a point
(``recovery`` in its set-up) takes the point's checkpoints unless its own disk has some as new.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from rlserve.cluster.recovery import checkpoint_files, checkpoints_cover, install_checkpoints
from rlserve.cluster.supervisor import Stamp
from rlserve.run.experience_log import LogCorruptError, LogRecord
from rlserve.training.learner_worker import learn

__all__ = ["EXCHANGE_WAIT_S", "ActorPipe", "LearnerActorWorker", "ShippedRecords"]

logger = logging.getLogger("rlserve.learner")

EXCHANGE_WAIT_S = 0.02
"""Seconds an exchange waits for a message of the learner before answering with none."""


class ShippedRecords:
    """The log records a server shipped, read by the learner loop in seq order.

    Records at or before a position the loop reads from are dropped: it never reads back.
    """

    def __init__(self) -> None:
        self._records: dict[int, LogRecord] = {}
        self._lock = threading.Lock()

    def add(self, records: Iterable[Sequence[Any]]) -> None:
        """Keep shipped records, each ``(seq, kind, steps, batch_id, payload)``."""
        with self._lock:
            for seq, kind, steps, batch_id, payload in records:
                self._records[int(seq)] = LogRecord(int(seq), kind, int(steps), batch_id, payload)

    def records(self, after: int, through: int) -> Iterator[LogRecord]:
        """The records with ``after < seq <= through``, in order.

        Raises:
            LogCorruptError: One of them was never shipped.
        """
        with self._lock:
            for seq in [s for s in self._records if s <= after]:
                del self._records[seq]
            wanted = []
            for seq in range(after + 1, through + 1):
                record = self._records.get(seq)
                if record is None:
                    raise LogCorruptError(f"the server did not ship record {seq}")
                wanted.append(record)
        yield from wanted

    def close(self) -> None:
        """Nothing to release: the records are in memory."""


class ActorPipe:
    """The learner loop's channel in an actor: the server's messages in, the learner's out.

    Of several unsent ``weights`` messages of a policy only the newest is kept, as the learner
    process's pipe does. A ``checkpointed`` message gets the checkpoint's files (``files``), read
    as it is written, before a newer one can prune it.
    """

    def __init__(self) -> None:
        self._inbox: queue.Queue[dict[str, Any]] = queue.Queue()
        self._outbox: deque[dict[str, Any]] = deque()
        self._ready = threading.Condition()

    def send(self, message: dict[str, Any]) -> None:
        """Queue one message for the server."""
        if message.get("type") == "checkpointed":
            try:
                message = {**message, "files": checkpoint_files(message)}
            except OSError as exc:  # the server holds the point it has; the next one comes
                logger.warning("rlserve: no recovery point of %s (%s)", message["path"], exc)
        with self._ready:
            if message.get("type") == "weights":
                policy_id = message.get("policy_id")
                self._outbox = deque(
                    m
                    for m in self._outbox
                    if m.get("type") != "weights" or m.get("policy_id") != policy_id
                )
            self._outbox.append(message)
            self._ready.notify_all()

    def receive(self, block: bool = True) -> dict[str, Any] | None:
        """One message of the server; None when ``block`` is False and none is waiting."""
        try:
            return self._inbox.get(block=block)
        except queue.Empty:
            return None

    def put(self, messages: Iterable[dict[str, Any]]) -> None:
        """Hand the server's messages to the learner loop."""
        for message in messages:
            self._inbox.put(message)

    def take(self, wait_s: float, done: threading.Event) -> list[dict[str, Any]]:
        """The learner's messages, waiting up to ``wait_s`` for one (not once ``done``)."""
        with self._ready:
            if not self._outbox and not done.is_set():
                self._ready.wait(wait_s)
            taken = list(self._outbox)
            self._outbox.clear()
            return taken

    def wake(self) -> None:
        """End a :meth:`take` that waits."""
        with self._ready:
            self._ready.notify_all()


class LearnerActorWorker:
    """The learner loop on a thread of its actor (a :class:`~rlserve.cluster.actor.Worker`).

    Args:
        setup: The learner's set-up, as the learner process gets it (see
            :func:`~rlserve.training.learner_worker.run_learner`), and ``recovery``: the
            server's recovery point (None: none).
    """

    def __init__(self, setup: dict[str, Any]) -> None:
        point = setup.get("recovery")
        setup = {k: v for k, v in setup.items() if k != "recovery"}
        policies = list(setup.get("policies", ()))
        if point is not None and not checkpoints_cover(point, policies):
            # This disk is not the one the point was made on (or lost it): go on from the point.
            install_checkpoints(point, policies)
            logger.warning(
                "rlserve: the learner goes on from the server's recovery point (log position "
                "%d): its own disk has no checkpoints as new",
                int(point["after"]),
            )
        self.greeting: Any = {"type": "started"}
        self._stamp = Stamp(time.monotonic())
        self._pipe = ActorPipe()
        self._records = ShippedRecords()
        self._done = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(setup,), name="rlserve-learner", daemon=True
        )
        self._thread.start()

    @property
    def stamp(self) -> Stamp:
        """When the server last called."""
        return self._stamp

    def _run(self, setup: dict[str, Any]) -> None:
        try:
            with contextlib.suppress(EOFError, BrokenPipeError, ConnectionResetError):
                learn(self._pipe, setup, self._records)
        finally:
            self._done.set()
            self._pipe.wake()

    def handle(self, message: dict[str, Any]) -> dict[str, Any]:
        """One exchange: ``records`` and ``messages`` in; the learner's ``messages`` out.

        ``running`` is False once the loop has ended (after ``stop``, or a failure it sent).
        """
        self._stamp.value = time.monotonic()
        self._records.add(message.get("records", ()))
        self._pipe.put(message.get("messages", ()))
        taken = self._pipe.take(EXCHANGE_WAIT_S, self._done)
        return {"messages": taken, "running": not (self._done.is_set() and not taken)}

    def close(self) -> None:
        """Ask the loop to stop (it checkpoints first); the actor is killed after."""
        self._pipe.put([{"type": "stop"}])
