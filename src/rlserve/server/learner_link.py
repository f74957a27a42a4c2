"""The serving side of learning: the experience log and a supervised learner process.

Every fragment the server acknowledges (cut from a remote episode, or in an accepted
``report_samples`` batch) is appended to the run's experience log
(:mod:`~rlserve.run.experience_log`) before any learner sees it; the learner process reads the
log itself, so fragments never cross the learner's socket and the serving process never blocks on
it. The server only announces how far the log goes (a reported batch at once, fragments of remote
episodes gathered for ``NOTIFY_DELAY`` seconds); the learner answers how far it has read.

A reported batch is acknowledged once it is in the log and taken by the learner: read by it, or
announced while it waited idle (it reads all it is told at once). This paces local-inference
clients to the learner. A written record survives a crash of either process; the log's sync
thread (:mod:`~rlserve.server.log_sync`) flushes it to the disk within ``SYNC_INTERVAL``
seconds, or before the acknowledgement with ``sync_reports`` (then it survives a power loss
too). When the backlog the learner finds is over ``max_queue_steps``, it skips the oldest
records (counted in ``samples/steps_dropped_queue_full``): the newest experience is the most
useful on-policy.

The learner process hosts every policy of the server (see
:mod:`~rlserve.training.learner_worker`); its messages name the policy they are about, and the log
is cleaned only past what every policy's kept checkpoints need.

The learner process is supervised: if it dies (kill -9, an exception), serving goes on with the
weights it has, the death is logged once, and a new learner starts from the newest intact
checkpoint and reads the log on from where that checkpoint had trained (``learner/restarts``).
Both ends of the socket are non-blocking on the server (asyncio streams), so shutdown cannot
deadlock: the learner gets a few seconds for a final checkpoint and is then killed, which loses
nothing, since the log holds every acknowledged step. The process is one child of a
:class:`~rlserve.processes.supervisor.ProcessSupervisor`, the supervisor of the env-runner and
env sub-processes too: it starts it (a fresh interpreter,
:class:`~rlserve.processes.launchers.InterpreterLauncher`), tells why it died, kills and reaps
it, and keeps the restart policy (never given up, backing off by deaths in a row); this link
reads the learner's socket itself, with asyncio.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rlserve.errors import ProtocolError
from rlserve.policy.weights import WeightsPackage
from rlserve.processes.launchers import InterpreterLauncher
from rlserve.processes.restarts import Failure
from rlserve.processes.supervisor import ProcessSupervisor
from rlserve.protocol.codec import decode, encode
from rlserve.protocol.episode_requests import DEFAULT_POLICY_ID
from rlserve.protocol.fragment import Fragment
from rlserve.protocol.framing import FrameDecoder, frame
from rlserve.run.experience_log import ExperienceLog, encode_payload
from rlserve.server.learner_checkpoints import LearnerCheckpoints, announce_ready
from rlserve.server.log_sync import sync_log_forever
from rlserve.server.pacing import LearnerPace
from rlserve.server.stats import ServerStats
from rlserve.server.throttled_log import SERVER_LOG
from rlserve.training.learner_logs import relay
from rlserve.training.learner_worker import IPC_LIMITS

logger = logging.getLogger("rlserve.server")

RESTART_DELAYS = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
"""Seconds before restarting a learner that died, by how many times in a row it died quickly."""

NOTIFY_DELAY = 0.02
"""Seconds for which fragments of remote episodes are gathered before the learner is told."""

HEALTHY_RUN_SECONDS = 60.0
"""A learner that ran this long before dying resets the restart back-off."""

EXIT_GRACE_S = 2.0
"""Seconds a learner whose socket closed gets to exit before it is killed."""

LEARNER_MODULE = "rlserve.training.learner_worker"
"""What the learner process runs (``python -m``)."""


class LearnerLink:
    """Writes acknowledged experience to the log and keeps a learner process training on it.

    The server sees the learner side through this handle only: experience in (:meth:`add`,
    :meth:`add_batch`), ``on_weights(policy_id, package)`` and ``on_checkpointed`` out. Whether
    its policies train in one process (as now) or one process each is this class's business.

    Args:
        setup: Plain-value set-up for :func:`~rlserve.training.learner_worker.run_learner`, with
            ``policies`` (one map per policy; ``policy_id`` names it); ``published_versions`` is
            added at each start.
        stats: Server counters.
        log: The opened experience log.
        on_weights: Persists then publishes a policy's weights package (awaited, in order).
        on_checkpointed: Called after each checkpoint with ``log_needed_after`` (the log
            position every policy's kept checkpoints have trained through: log clean-up) and
            that checkpoint's ``policy_id``, ``path``, weights ``version`` and ``reason``.
        published_versions: Returns the version the server serves now, per policy (-1: none).
        sync_reports: Acknowledge a report only once it is fsynced, not once it is written.
        pace: Told the learner's lag (unread logged steps, owed training), to hold replies while
            it is too far behind (None: no pacing).
    """

    def __init__(
        self,
        setup: dict[str, Any],
        stats: ServerStats,
        log: ExperienceLog,
        on_weights: Callable[[str, WeightsPackage], Awaitable[None]],
        on_checkpointed: Callable[[dict[str, Any]], Awaitable[None]],
        published_versions: Callable[[], dict[str, int]],
        sync_reports: bool = False,
        pace: LearnerPace | None = None,
    ):
        self._sync_reports = sync_reports
        self._pace = pace
        self._setup = setup
        self._policy_ids = [str(p["policy_id"]) for p in setup.get("policies", ())] or [
            DEFAULT_POLICY_ID
        ]
        self._stats = stats
        self.log = log
        self._on_weights = on_weights
        self._published_versions = published_versions
        self._loop: asyncio.AbstractEventLoop | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._children = self._supervisor_of_learner()
        self._supervisor: asyncio.Task[None] | None = None
        self._syncer: asyncio.Task[None] | None = None
        self._sync_executor = ThreadPoolExecutor(1, thread_name_prefix="rlserve-log-sync")
        self._unsynced = asyncio.Event()
        self._notify_handle: asyncio.Handle | asyncio.TimerHandle | None = None
        self._stopping = False
        # Records not yet read by any learner, and reported batches waiting for their reply.
        self._unread: deque[tuple[int, int]] = deque()
        self._tickets: dict[int, Callable[[int], None]] = {}
        self._dropped: dict[int, int] = {}
        self._consumed_through = 0
        # While the learner waits idle, what is appended is handed to it at once (it reads
        # everything announced as soon as it wakes), up to its backlog bound.
        self._waiting_budget = 0
        self._handed_through = 0
        self.failure: str | None = None
        """The last learner death, for the log and ``/v1/health``; None while healthy."""
        self.device = "unknown"
        self.checkpoints = LearnerCheckpoints(self._policy_ids, stats, on_checkpointed)
        """The checkpoints the learner process wrote while this server runs."""

    def _supervisor_of_learner(self) -> Any:
        """What starts, kills and restarts the learner (a :class:`ProcessSupervisor` here)."""
        return ProcessSupervisor(
            ["rlserve-learner"],
            ["the learner process"],
            InterpreterLauncher(LEARNER_MODULE),
            what="the learner process",
            wire=None,  # the link reads the learner's socket itself, with asyncio
            close_message=None,
            logger=logger,
            restart_note="it",
            success="run",
            max_restarts=None,  # serving goes on without a learner: it is never given up
            close_wait_s=EXIT_GRACE_S,
            back_off=RESTART_DELAYS,
            log_level=logging.ERROR,
        )

    @property
    def last_checkpoints(self) -> dict[str, str]:
        """Each policy's newest checkpoint written while this server runs."""
        return self.checkpoints.newest

    @property
    def requested_checkpoints(self) -> dict[str, int]:
        """Checkpoints written on :meth:`request_checkpoint`, per policy (counted)."""
        return self.checkpoints.requested

    # -- experience in ---------------------------------------------------------------------

    def add(self, fragment: Fragment) -> None:
        """Log a fragment cut from a remote episode.

        A failed write never reaches the client that stepped: its fragment is lost, counted in
        ``samples/steps_lost_storage`` and the server reports itself degraded.
        """
        try:
            self._append("fragments", [fragment], None)
        except OSError as exc:
            self._stats.steps_lost_storage += len(fragment)
            self._stats.storage_failed("experience log", exc)

    def add_batch(
        self,
        fragments: list[Fragment],
        batch_id: str,
        on_done: Callable[[int], None],
        source: str = "",
    ) -> None:
        """Log a reported batch; ``on_done(dropped_steps)`` once the learner has taken it.

        ``source`` (the reporting client's identity) is not needed here: the learner process
        trains on every client's experience alike.

        With ``sync_reports`` the batch must also be flushed to the disk first.

        Raises:
            OSError: The log could not be written; nothing of the batch was kept.
        """
        seq = self._append("report", fragments, batch_id)
        self._tickets[seq] = on_done
        if seq <= self._handed_through and self._loop is not None:
            self._loop.call_soon(self._settle_tickets)

    def _append(self, kind: str, fragments: list[Fragment], batch_id: str | None) -> int:
        steps = sum(len(f) for f in fragments)
        payload = encode_payload([f.to_wire() for f in fragments])
        seq = self.log.append(kind, steps, payload, batch_id)
        if self._waiting_budget >= steps and self._handed_through == seq - 1:
            self._waiting_budget -= steps
            self._handed_through = seq
        else:
            self._waiting_budget = 0
        self._unread.append((seq, steps))
        self._stats.steps_logged += steps
        self._stats.steps_queued += steps
        if self._pace is not None:
            self._pace.update(unread_steps=self._stats.steps_queued)
        self._unsynced.set()
        if self._loop is not None:
            self._schedule_notify(urgent=kind == "report")
        return seq

    def _schedule_notify(self, urgent: bool) -> None:
        # A reported batch waits for its reply: announce it in this loop iteration. Fragments
        # cut from remote episodes wait for nobody: gather NOTIFY_DELAY seconds of them into one
        # announcement, so a busy server does not wake the learner once per fragment.
        handle = self._notify_handle
        if handle is not None:
            if not urgent or not isinstance(handle, asyncio.TimerHandle):
                return
            handle.cancel()
        assert self._loop is not None
        if urgent:
            self._notify_handle = self._loop.call_soon(self._notify)
        else:
            self._notify_handle = self._loop.call_later(NOTIFY_DELAY, self._notify)

    def _notify(self) -> None:
        self._notify_handle = None
        self._send({"type": "available", "through": self.log.last_seq})

    def _send(self, message: dict[str, Any]) -> None:
        if self._writer is not None and not self._writer.is_closing():
            self._writer.write(frame(encode(message)))

    def _connected(self) -> bool:
        """Whether a learner is there to talk to."""
        return self._writer is not None

    def _close_channel(self) -> None:
        """Close the channel to the learner (it ends when it sees that)."""
        if self._writer is not None:
            self._writer.close()

    async def _sync_loop(self) -> None:
        await sync_log_forever(
            self.log,
            self._unsynced,
            self._sync_executor,
            self._stats,
            lambda: bool(self._tickets and self._sync_reports),
            self._settle_tickets,
        )

    def _settle_tickets(self) -> None:
        through = max(self._consumed_through, self._handed_through)
        if self._sync_reports:
            through = min(through, self.log.synced_seq)
        for seq in sorted(s for s in self._tickets if s <= through):
            self._tickets.pop(seq)(self._dropped.pop(seq, 0))

    # -- the learner process ---------------------------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the learner and its supervisor, and the log's sync thread."""
        self._loop = loop
        self._consumed_through = self.log.last_seq if not self._unread else 0
        self._supervisor = loop.create_task(self._supervise())
        self._syncer = loop.create_task(self._sync_loop())

    @property
    def pid(self) -> int | None:
        """The current learner process id."""
        return self._children.pids[0]

    async def _supervise(self) -> None:
        # A run longer than HEALTHY_RUN_SECONDS counts as a success: the back-off starts over.
        loop = asyncio.get_running_loop()
        while not self._stopping:
            started = time.monotonic()
            try:
                await self._run_learner()
            except Exception as exc:  # e.g. too many open files: the spawn itself failed
                self.failure = f"starting the learner failed: {exc!r}"
            finally:
                # The learner gets EXIT_GRACE_S to exit, then is killed (blocking: a thread).
                ended = await loop.run_in_executor(None, self._children.reap, 0, EXIT_GRACE_S)
            if self._stopping:
                return
            self.failure = self.failure or ended
            if time.monotonic() - started > HEALTHY_RUN_SECONDS:
                self._children.succeeded(0)
            self._stats.learner_restarts += 1
            self._children.fail(
                0,
                Failure(((self.failure or "").strip().splitlines() or ["no message"])[-1]),
                "training",
                note=self._restart_note,
            )
            await asyncio.sleep(self._children.restart_delay(0))
            self._children.policy.restarting()

    def _restart_note(self) -> str:
        return (
            f"it in {self._children.restart_delay(0):.1f} s from its newest checkpoint and the "
            f"experience log; serving goes on with weights {self._versions_text()}"
        )

    def _setup_now(self) -> dict[str, Any]:
        """The learner's set-up for a start now (with the versions served now)."""
        return {
            **self._setup,
            "published_versions": self._published_versions(),
            "log_level": logging.getLogger("rlserve").getEffectiveLevel(),
        }

    async def _run_learner(self) -> None:
        setup = self._setup_now()
        self._children.start(0)
        reader, writer = await asyncio.open_connection(sock=self._children.channel(0))
        self._writer = writer
        writer.write(frame(encode({"type": "setup", "setup": setup})))
        decoder = FrameDecoder(IPC_LIMITS.max_frame_bytes)
        try:
            while True:
                data = await reader.read(1 << 20)
                if not data:
                    break
                for body in decoder.feed(data):
                    await self._dispatch(decode(body, IPC_LIMITS))
        except (OSError, ProtocolError) as exc:
            self.failure = f"the learner's socket broke: {exc!r}"
        finally:
            self._writer = None
            self._waiting_budget = 0  # nothing more is handed to a learner that is gone
            if self._pace is not None:
                self._pace.update(connected=False)  # serving goes on unpaced meanwhile
            writer.close()
            self.checkpoints.final_in.set()  # nobody may wait for a checkpoint that cannot come
            with contextlib.suppress(OSError):
                await writer.wait_closed()  # the socket is closed before the reaper runs

    def _versions_text(self) -> str:
        versions = self._published_versions()
        if len(versions) == 1:
            return f"v{next(iter(versions.values()))}"
        return ", ".join(f"{pid} v{version}" for pid, version in versions.items())

    async def _dispatch(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind == "weights":
            policy_id = str(message["policy_id"])
            metrics = {k: float(v) for k, v in message["metrics"].items()}
            self._stats.update_learner(policy_id, metrics)
            await self._on_weights(policy_id, WeightsPackage.from_wire(message["package"]))
        elif kind == "metrics":
            metrics = {k: float(v) for k, v in message["metrics"].items()}
            self._stats.update_learner(str(message["policy_id"]), metrics)
        elif kind == "waiting":
            # It read through `through` and will read everything announced after that at once,
            # up to its backlog bound.
            through = int(message["through"])
            announced = sum(steps for seq, steps in self._unread if seq > through)
            budget = int(self._setup["max_queue_steps"]) - announced
            if budget >= 0:
                self._handed_through = self.log.last_seq
                self._waiting_budget = budget
                self._settle_tickets()
        elif kind == "consumed":
            self._consumed(int(message["through"]), message["dropped"])
            self._stats.learner["learner/steps_consumed"] = float(message["steps_consumed"])
        elif kind == "owed":
            if self._pace is not None:
                self._pace.update(owed_steps=int(message["steps"]))
        elif kind == "ready":
            self.device = str(message["device"])
            self.failure = None
            self._stats.learner["learner/steps_consumed"] = float(message["steps_consumed"])
            announce_ready(message["policies"])
            if self._pace is not None:
                self._pace.update(
                    unread_steps=self._stats.steps_queued,
                    owed_steps=int(message.get("owed_steps", 0)),
                    connected=True,
                )
            self._send({"type": "available", "through": self.log.last_seq})
        elif kind == "checkpointed":
            await self.checkpoints.written(message)
        elif kind == "failed":
            self.failure = str(message["message"])
            logger.error("rlserve: the learner process failed:\n%s", self.failure)
        elif kind == "log":
            relay(message)

    def _consumed(self, through: int, dropped: list[list[int]]) -> None:
        self._waiting_budget = 0  # busy until it says it waits again
        dropped_seqs = {int(seq): int(steps) for seq, steps in dropped}
        for seq, steps in dropped_seqs.items():
            if seq in self._tickets:
                self._dropped[seq] = steps
        lost_now = 0
        while self._unread and self._unread[0][0] <= through:
            seq, steps = self._unread.popleft()
            lost = dropped_seqs.get(seq, 0)
            lost_now += lost
            self._stats.steps_queued -= steps
            self._stats.steps_sent_to_learner += steps - lost
            self._stats.steps_dropped_queue_full += lost
        if lost_now:
            self._warn_dropped(lost_now)
        self._consumed_through = max(self._consumed_through, through)
        if self._pace is not None:
            self._pace.update(unread_steps=self._stats.steps_queued)
        self._settle_tickets()

    def _warn_dropped(self, lost_now: int) -> None:
        stats = self._stats
        SERVER_LOG.warn(
            "steps_dropped_queue_full",
            f"the learner fell behind and dropped {lost_now} steps unread "
            f"({stats.steps_dropped_queue_full} of "
            f"{stats.steps_dropped_queue_full + stats.steps_sent_to_learner} in all, "
            "samples/steps_dropped_queue_full): clients produce faster than it trains; use "
            "fewer clients, or raise --max-sample-queue-steps (now "
            f"{self._setup.get('max_queue_steps')}) to keep a longer backlog",
        )

    def request_checkpoint(self) -> None:
        """Ask the learner for a checkpoint now."""
        self._send({"type": "checkpoint"})

    async def stop(self, timeout: float = 6.0) -> dict[str, str]:
        """Ask the learner for final checkpoints, end it, flush the log; return the checkpoints.

        Returns:
            Each policy's newest checkpoint written while this server ran (the final one when it
            came in time).

        The learner gets ``timeout`` seconds; then it is killed, which loses nothing: the log
        holds every acknowledged step and the next learner reads on from its last checkpoint.
        """
        self._stopping = True
        if self._pace is not None:
            self._pace.close()  # nothing waits for a learner that is stopping
        if self._notify_handle is not None:
            self._notify_handle.cancel()
            self._notify()  # the learner hears of every record before its final checkpoint
        if self._connected():
            self.checkpoints.expect_final()
            self._send({"type": "stop"})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.checkpoints.final_in.wait(), timeout)
        self._close_channel()
        if self._supervisor is not None:
            # Its finally-block joins (and if needed kills) the process.
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._supervisor), 5.0)
        if self._syncer is not None:
            self._syncer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._syncer
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._sync_executor, self.log.close)
        except OSError as exc:
            self._stats.storage_failed("experience log", exc)
        self._sync_executor.shutdown(wait=False)
        return dict(self.last_checkpoints)
