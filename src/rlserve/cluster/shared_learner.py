"""The one learner of several serving front-ends, as a Ray actor (``rlserve serve --replicas``).

Each front-end keeps its own experience log and ships its records here (see
:mod:`~rlserve.cluster.front_end_link`). The learner merges them into a log of its own, on its
node's disk, and runs the learner process's loop
(:func:`~rlserve.training.learner_worker.learn`) over that merged log, so training, checkpoints
and their trained-through positions are those of one server.

Merging is where exactly-once comes from (:mod:`~rlserve.cluster.merged_log`): a replayed
record, or a batch re-sent to another front-end, is merged once.

The learner's node may be lost with its disk: after each checkpoint the learner hands the driver
(the owning front-end) a recovery point (:mod:`~rlserve.cluster.recovery`) in its exchange
answer, and once the driver says it holds it, the front-ends clean their logs through what it
includes (``held_through``) and the learner its merged log. A learner started on any node takes
the driver's point unless its own disk holds one at least as new.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from rlserve.cluster.merged_log import SEEN_BATCHES, MergedLog
from rlserve.cluster.ray_import import import_ray
from rlserve.cluster.recovery import RecoveryPoints, covered_locally, install_point, point_key
from rlserve.training.learner_worker import learn

__all__ = ["SEEN_BATCHES", "MergedLog", "SharedLearner"]

logger = logging.getLogger("rlserve.learner")

EXCHANGE_WAIT_S = 0.02
"""Seconds an exchange waits for a message of the learner before answering with none."""

MAX_OUTBOX = 1_000
"""Messages kept for a front-end that does not call (weights replace older ones anyway)."""

_PER_FRONT_END = ("waiting", "consumed", "owed")
"""Messages of the learner about its position in the merged log: not passed on as they are."""


class _FanOut:
    """The learner loop's channel: its messages copied to every front-end's outbox.

    A ``weights`` message's package is put in Ray's object store once (``package_ref``).
    """

    def __init__(
        self, put: Callable[[Any], Any], on_checkpointed: Callable[[dict[str, Any]], None]
    ) -> None:
        self._put = put
        self._on_checkpointed = on_checkpointed
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
        elif kind == "checkpointed":
            self._on_checkpointed(message)
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
            its ``run_dir`` is where the merged log is kept (``experience/`` in it), and
            ``recovery`` the recovery point the driver holds (None: none).
    """

    def __init__(self, setup: dict[str, Any]) -> None:
        point = setup.get("recovery")
        setup = {k: v for k, v in setup.items() if k != "recovery"}
        policies = list(setup.get("policies", ()))
        directory = Path(setup["run_dir"]) / "experience"
        self._merged = MergedLog(directory)
        if point is not None and not covered_locally(point, self._merged, policies):
            # This disk is not the one the point was made on (or lost it): go on from the point.
            self._merged.close()
            install_point(point, directory, policies)
            self._merged = MergedLog(directory)
            logger.warning(
                "rlserve: the learner goes on from the driver's recovery point (merged position "
                "%d): its own disk has no state as new",
                int(point["position"]),
            )
        self._points = RecoveryPoints([str(p["policy_id"]) for p in policies], point)
        self._lock = threading.Lock()
        self._pipe = _FanOut(import_ray("the shared learner").put, self._checkpointed)
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

    def _checkpointed(self, message: dict[str, Any]) -> None:
        """A checkpoint was written (on the learner's thread): make a recovery point of it."""
        with self._lock:
            self._points.checkpointed(message, self._merged)

    def exchange(
        self,
        front_end: str,
        life: str,
        records: list[Sequence[Any]],
        messages: list[dict[str, Any]],
        held: list[int] | None = None,
    ) -> dict[str, Any]:
        """Merge ``front_end``'s records, take its messages; the learner's messages for it.

        ``life`` tells one run of a front-end from the next (a restarted one is told the
        learner's newest state first). ``held``: the driver's only, the key of the recovery
        point it holds (:func:`~rlserve.cluster.recovery.point_key`).

        Returns:
            ``merged_through`` (the newest seq of its log that is merged: acknowledged),
            ``held_through`` (the newest seq of its log the driver's recovery point includes:
            its log is cleaned through it), ``recovery`` (to the driver: a newer point to
            hold, else None), ``messages``, ``steps_consumed`` (merged steps the learner has
            read), ``running``.
        """
        point = None
        with self._lock:
            if self._merged.merge(front_end, records):
                self._pipe.put([{"type": "available", "through": self._merged.log.last_seq}])
            merged_through = self._merged.merged_through.get(front_end, 0)
            if held is not None:
                if self._points.held(held):
                    self._clean()
                offered = self._points.offered
                if offered is not None and point_key(offered) > list(held):
                    point = offered
            held_through = self._points.held_through.get(front_end, 0)
        self._pipe.put(messages)
        taken = self._pipe.take(front_end, life, EXCHANGE_WAIT_S, self._done)
        return {
            "merged_through": merged_through,
            "held_through": held_through,
            "recovery": point,
            "messages": taken,
            "steps_consumed": self._pipe.steps_consumed,
            "duplicate_steps": self._merged.duplicate_steps,
            "running": not (self._done.is_set() and not taken),
        }

    def _clean(self) -> None:
        """Clean the merged log through what the held point and the kept checkpoints need."""
        try:
            self._merged.clean(self._points.log_needed_after())
        except OSError as exc:
            logger.warning("rlserve: cleaning the learner's merged log failed (%s)", exc)

    def close(self) -> None:
        """Flush the merged log."""
        with self._lock:
            self._merged.close()
