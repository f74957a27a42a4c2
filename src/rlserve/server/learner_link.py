"""The serving side of the learner process: a bounded sample queue and the pipe to the learner.

Fragments from the episode table wait in a queue bounded by ``max_sample_queue_steps``. When it
is full the oldest fragments are dropped (and counted in ``samples/steps_dropped_queue_full``):
for an on-policy learner the newest experience is the most useful, and serving never blocks on a
slow learner. The learner pulls: it asks for samples when it is ready, and everything queued is
sent at once, so the pipe never fills while the learner is busy and the event loop never blocks
on it.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlserve.algorithms.base import WeightsPackage
from rlserve.errors import RLServeError
from rlserve.samples import Fragment
from rlserve.server.learner_worker import receive, run_learner, send
from rlserve.server.stats import ServerStats


class LearnerFailedError(RLServeError):
    """The learner process raised; its traceback is in the message."""


@dataclass(slots=True)
class _BatchTicket:
    """Tracks a reported batch's fragments through the queue."""

    remaining: int
    on_done: Callable[[int], None]
    dropped: int = 0

    def leave(self, fragment: Fragment, dropped: bool) -> None:
        self.remaining -= 1
        if dropped:
            self.dropped += len(fragment)
        if self.remaining == 0:
            self.on_done(self.dropped)


class LearnerLink:
    """Starts the learner process and moves fragments to it and weights from it.

    Args:
        setup: Plain-value set-up for :func:`run_learner`.
        stats: Server counters (queue sizes, learner metrics, counters sent with checkpoints).
        on_weights: Called with each published weights package.
        on_restored: Called with the server state found in a resumed checkpoint.
        max_queue_steps: Bound of the sample queue.
        state: Returns the server state a checkpoint keeps (counters, reported batch ids).
    """

    def __init__(
        self,
        setup: dict[str, Any],
        stats: ServerStats,
        on_weights: Callable[[WeightsPackage], None],
        on_restored: Callable[[dict[str, Any]], None],
        max_queue_steps: int,
        state: Callable[[], dict[str, Any]],
    ):
        self._state = state
        self._setup = setup
        self._stats = stats
        self._on_weights = on_weights
        self._on_restored = on_restored
        self._max_queue_steps = max_queue_steps
        self._queue: deque[tuple[Fragment, _BatchTicket | None]] = deque()
        self._queued_steps = 0
        self._learner_waiting = False
        self._send_scheduled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._conn: Any = None
        self._process: Any = None
        self.failure: str | None = None
        self.device = "unknown"
        self.last_checkpoint: str | None = None
        self._checkpointed: asyncio.Event | None = None
        self._stopping = False

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Spawn the learner process and watch its end of the pipe."""
        self._loop = loop
        self._checkpointed = asyncio.Event()
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe(duplex=True)
        self._process = ctx.Process(
            target=run_learner, args=(child, self._setup), name="rlserve-learner", daemon=True
        )
        self._process.start()
        child.close()
        self._conn = parent
        loop.add_reader(parent.fileno(), self._on_readable)

    @property
    def pid(self) -> int | None:
        """The learner process id."""
        return None if self._process is None else self._process.pid

    def add(self, fragment: Fragment, ticket: _BatchTicket | None = None) -> None:
        """Queue a fragment for the learner (drops the oldest when the queue is full)."""
        self._queue.append((fragment, ticket))
        self._queued_steps += len(fragment)
        while self._queued_steps > self._max_queue_steps and len(self._queue) > 1:
            dropped, dropped_ticket = self._queue.popleft()
            self._queued_steps -= len(dropped)
            self._stats.steps_dropped_queue_full += len(dropped)
            if dropped_ticket is not None:
                dropped_ticket.leave(dropped, dropped=True)
        self._stats.steps_queued = self._queued_steps
        if self._learner_waiting and not self._send_scheduled and self._loop is not None:
            self._send_scheduled = True
            self._loop.call_soon(self._send_fragments)

    def add_batch(self, fragments: list[Fragment], on_done: Callable[[int], None]) -> None:
        """Queue a reported batch.

        ``on_done(dropped_steps)`` runs once all of it left the queue: sent to the learner, or
        dropped because the queue was full.
        """
        ticket = _BatchTicket(len(fragments), on_done)
        for fragment in fragments:
            self.add(fragment, ticket)

    def _send_fragments(self) -> None:
        self._send_scheduled = False
        if not self._learner_waiting or not self._queue or self._conn is None or self._stopping:
            return
        entries, self._queue = list(self._queue), deque()
        steps, self._queued_steps = self._queued_steps, 0
        self._learner_waiting = False
        self._stats.steps_queued = 0
        self._stats.steps_sent_to_learner += steps
        # Settle the batches first, so the state sent along (kept by the next checkpoint)
        # already remembers their ids: a checkpoint never holds training on a batch it forgot.
        for fragment, ticket in entries:
            if ticket is not None:
                ticket.leave(fragment, dropped=False)
        try:
            send(
                self._conn,
                {
                    "type": "fragments",
                    "fragments": [fragment.to_wire() for fragment, _ in entries],
                    "server_state": self._state(),
                },
            )
        except OSError as exc:
            self._lost(f"writing to the learner failed: {exc!r}")

    def _on_readable(self) -> None:
        try:
            message = receive(self._conn)
        except (EOFError, OSError, RLServeError) as exc:
            self._lost(f"reading from the learner failed: {exc!r}")
            return
        kind = message["type"]
        if kind == "request":
            self._learner_waiting = True
            self._send_fragments()
        elif kind == "weights":
            self.device = message.get("device", self.device)
            self._stats.learner.update({k: float(v) for k, v in message["metrics"].items()})
            self._on_weights(WeightsPackage.from_wire(message["package"]))
        elif kind == "restored":
            self._on_restored(message["server_state"])
        elif kind == "checkpointed":
            self.last_checkpoint = message["path"]
            if "untrained_steps" in message:
                self._stats.learner["learner/steps_untrained_at_shutdown"] = float(
                    message["untrained_steps"]
                )
            assert self._checkpointed is not None
            self._checkpointed.set()
        elif kind == "failed":
            self.failure = message["message"]
            self._detach()

    def _lost(self, what: str) -> None:
        self._detach()
        if self.failure is None:
            self._process.join(1.0)
            self.failure = f"{what}; learner exit code {self._process.exitcode}"

    def _detach(self) -> None:
        if self._checkpointed is not None:
            self._checkpointed.set()  # nobody may wait for a checkpoint that cannot come
        if self._conn is not None and self._loop is not None:
            self._loop.remove_reader(self._conn.fileno())
        self._conn = None

    async def stop(self, timeout: float = 60.0) -> str | None:
        """Ask the learner to write a final checkpoint and exit; return the checkpoint path.

        Nothing is handed to the learner after this: what is still queued was not acknowledged
        to its clients, which re-send it to the next server.
        """
        self._stopping = True
        if self._conn is not None and self._checkpointed is not None:
            self._checkpointed.clear()
            try:
                send(self._conn, {"type": "stop", "server_state": self._state()})
                await asyncio.wait_for(self._checkpointed.wait(), timeout)
            except (OSError, TimeoutError):
                pass
        self._detach()
        if self._process is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._process.join, 10)
            if self._process.is_alive():
                # It ignores SIGTERM (see run_learner), so end it for good.
                self._process.kill()
                self._process.join(5)
        return self.last_checkpoint
