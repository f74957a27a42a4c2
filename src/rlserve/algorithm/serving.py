"""The network server of an in-process Algorithm: external clients as one more experience source.

:class:`AttachedServer` runs the ``rlserve serve`` machinery (:class:`PolicyServer`: both carriers,
token, TLS, ``/v1/health``, metrics, episode table, batched numpy inference, the experience log,
the batch ledger) on its own asyncio event loop in a background thread, with the learner process
replaced by :class:`AttachedLearner`, an in-process hand-off:

* every fragment cut from a remote-inference episode, and every accepted ``report_samples``
  batch, is appended to the run's experience log before it is acknowledged (as with ``rlserve
  serve``), then queued for the Algorithm under its *source*: the client identity that owns the
  episode or sent the report. A :class:`~rlserve.PolicyClient` sends a random, secret
  ``client_id`` in every ``hello`` (the same on every reconnection); its source is named
  ``client-<hash>`` (:func:`~rlserve.algorithm.source_queues.client_source`: a one-way hash,
  so the secret never reaches logs or metrics). A client that sends no id is one source per
  connection (``session-<n>``);
* each source has its own bounded queue (``max_queued_steps_per_source``): when it is full, that
  source's oldest steps are dropped (``dropped_steps_by_source``), never another's;
* :meth:`AttachedServer.take` hands the Algorithm's thread what was queued, at most ``max_steps``
  steps, shared max-min fairly between sources (each gets an equal share, a source with less
  queued gives its unused share to the others), so a fast client cannot crowd out a slow one;
* :meth:`AttachedServer.publish` persists a policy's weights in the run folder and swaps them into
  the service: remote-inference clients act with them from the next batch, local-inference
  clients fetch them. Until the first weights are published, ``get_action`` calls and reports
  wait (as they do before a learner process publishes).

A reported batch is acknowledged once it is logged and queued (with ``sync_reports``, once the
log is also fsynced); the ledger of batch ids makes a re-sent batch count once.

The queues are :class:`~rlserve.algorithm.source_queues.SourceQueues`; the settings,
:class:`~rlserve.algorithm.serving_settings.ServingSettings`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor

from rlserve.algorithm.server_thread import ServerThread
from rlserve.algorithm.serving_settings import ServingSettings
from rlserve.algorithm.source_queues import SourceQueues, source_name
from rlserve.errors import EpisodeError
from rlserve.experience.episode_records import EpisodeSummary
from rlserve.learners.registry import algorithm
from rlserve.policy.weights import WeightsPackage
from rlserve.protocol.fragment import Fragment
from rlserve.protocol.mapping import PolicyMapping
from rlserve.run.experience_log import LogReader, encode_payload
from rlserve.run.run_folder import RunFolder
from rlserve.server.app import PolicyServer
from rlserve.server.log_sync import sync_log_forever
from rlserve.server.policies import PolicySpec
from rlserve.server.stats import ServerStats
from rlserve.training.sampler import SampleRound

UNKNOWN_SOURCE = "unknown"
"""The source of a fragment whose episode's owner cannot be found (should not happen)."""

REPLAYED_SOURCE = "replayed"
"""The source of experience-log records queued again after a restart (:meth:`requeue_after`)."""

PUBLISH_TIMEOUT = 60.0
"""Seconds :meth:`AttachedServer.publish` waits for the weights to be stored and swapped in."""


ATTACHED_METRICS_FOLDER = "server"
"""The sub-folder of the run folder where an attached server writes its metrics (the run
folder's own TensorBoard events and ``progress.csv`` are the Algorithm's)."""


class _AttachedStats(ServerStats):
    """The server's counters, which also hand every ended episode's summary to the queues."""

    on_episode: Callable[[EpisodeSummary], None] | None = None

    def record_episode(self, summary: EpisodeSummary, tell: bool = True) -> None:
        super().record_episode(summary, tell)
        if self.on_episode is not None:
            self.on_episode(summary)


class AttachedLearner:
    """The learner side of an :class:`AttachedServer`: log, then queue by source.

    It has the methods :class:`PolicyServer` and the service call on a
    :class:`~rlserve.server.learner_link.LearnerLink`; nothing trains here: the Algorithm takes
    the queued experience with :meth:`AttachedServer.take`.
    """

    def __init__(self, server: PolicyServer, queues: SourceQueues):
        self._server = server
        self._queues = queues
        self._stats = server.stats
        self.log = server.log
        self._sync_reports = server.config.sync_reports
        self._loop: asyncio.AbstractEventLoop | None = None
        self._unsynced = asyncio.Event()
        self._tickets: dict[int, Callable[[int], None]] = {}
        self._syncer: asyncio.Task[None] | None = None
        self._sync_executor = ThreadPoolExecutor(1, thread_name_prefix="rlserve-log-sync")
        self.failure: str | None = None
        self.device = "in-process"

    @property
    def pid(self) -> int | None:
        """None: no learner process (the Algorithm trains)."""
        return None

    def _source_of(self, fragment: Fragment) -> str:
        # Fragments are handed on before their episode is closed: it is still in the table.
        try:
            owner = self._server.service.episodes.get(fragment.episode_id).owner
        except EpisodeError:
            return UNKNOWN_SOURCE
        return source_name(owner)

    def add(self, fragment: Fragment) -> None:
        """Log a fragment cut from a remote episode, then queue it under its episode's owner.

        A failed write is counted in ``samples/steps_lost_storage`` (the server reports itself
        degraded) and nothing is queued.
        """
        try:
            seq = self._append("fragments", [fragment], None)
        except OSError as exc:
            self._stats.steps_lost_storage += len(fragment)
            self._stats.storage_failed("experience log", exc)
            return
        self._queues.put(self._source_of(fragment), [fragment], seq)

    def add_batch(
        self,
        fragments: list[Fragment],
        batch_id: str,
        on_done: Callable[[int], None],
        source: str = "",
    ) -> None:
        """Log a reported batch and queue it under ``source``; ``on_done(0)`` then (soon).

        With ``sync_reports``, ``on_done`` waits until the log is fsynced through the batch.

        Raises:
            OSError: The log could not be written; nothing of the batch was kept.
        """
        seq = self._append("report", fragments, batch_id)
        self._queues.put(source_name(source) if source else UNKNOWN_SOURCE, fragments, seq)
        if self._sync_reports:
            self._tickets[seq] = on_done
        elif self._loop is not None:
            # After the service has counted the batch (it calls us first).
            self._loop.call_soon(on_done, 0)
        else:
            on_done(0)

    def _append(self, kind: str, fragments: list[Fragment], batch_id: str | None) -> int:
        steps = sum(len(f) for f in fragments)
        payload = encode_payload([f.to_wire() for f in fragments])
        seq = self.log.append(kind, steps, payload, batch_id)
        self._stats.steps_logged += steps
        self._unsynced.set()
        return seq

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
        synced = self.log.synced_seq
        for seq in sorted(s for s in self._tickets if s <= synced):
            self._tickets.pop(seq)(0)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the log's sync task on the server's loop."""
        self._loop = loop
        self._queues.start_at(self.log.last_seq)
        self._syncer = loop.create_task(self._sync_loop())

    def request_checkpoint(self) -> None:
        """Nothing to do: the Algorithm writes its own checkpoints."""

    async def stop(self) -> dict[str, str]:
        """Stop the sync task, flush and close the log. No checkpoints are written here."""
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
        return {}


class AttachedServer:
    """A network server whose clients feed an in-process Algorithm (see the module docstring).

    Args:
        settings: How it listens and queues.
        policies: The policies served, by id, in order (their spaces; the Algorithm's).
        run: The run folder (experience log, published weights, server state).
        mapping: Which policy acts for which agent (None: every agent maps to the only policy).
        fragment_length: Steps of a remote episode per fragment.
        seed: Seed of the server's action sampling.
        resume: ``run`` holds an earlier run of this server: continue its counters, weights,
            batch ledger and experience log (:meth:`requeue_after` hands its untrained
            records on again).
        algo: The Algorithm's algorithm, that of the policies that name none (None: PPO).
        frame_stacks: Each policy's ``frame_stack`` (missing: 1): its clients send single
            frames, the server stacks them per episode.
    """

    def __init__(
        self,
        settings: ServingSettings,
        policies: dict[str, PolicySpec],
        run: RunFolder,
        mapping: PolicyMapping | None = None,
        fragment_length: int = 200,
        seed: int = 0,
        resume: bool = False,
        algo: str | None = None,
        frame_stacks: dict[str, int] | None = None,
    ):
        self.settings = settings
        self.config = settings.server_config(fragment_length, seed)
        stats = _AttachedStats()
        self._queues = SourceQueues(settings.max_queued_steps_per_source, stats)
        stats.on_episode = self._queues.add_summary
        self.server = PolicyServer(
            self.config,
            {},
            policies,
            run,
            mapping,
            resume=resume,
            stats=stats,
            learner_factory=lambda server: AttachedLearner(server, self._queues),
            algo=algorithm(algo).name,
            metrics_folder=ATTACHED_METRICS_FOLDER,
            frame_stacks=frame_stacks,
        )
        self._thread = ServerThread(self.server, name="rlserve-attached-server")

    # -- as a sampler (rlserve.training.sampler.Sampler) --------------------------------------

    episodes_failed = 0
    """Episodes lost: none (a client's episode that idles out ends as ``idle_timeout``)."""
    num_healthy = 0
    """Sampling processes: none (the clients are not the server's to count)."""
    restarts = 0
    """Sampling processes restarted: none."""

    def sample(self, steps: int, packages: Mapping[str, WeightsPackage]) -> SampleRound:
        """One round: what clients produced since the last one (:meth:`take` of ``steps``).

        ``packages`` are not used: the trainer hands each new version to :meth:`publish`.
        """
        fragments, summaries = self.take(steps)
        return SampleRound(
            fragments,
            summaries,
            client_steps=sum(len(f) for f in fragments),
            log_position=self.taken_through,
        )

    # -- life cycle ------------------------------------------------------------------------

    def start(self) -> None:
        """Listen, serving from a background thread; return once listening.

        Raises:
            Exception: Whatever stopped the server from listening (a port in use, a TLS file).
            RuntimeError: It was started before.
        """
        self._thread.start()

    def stop(self) -> None:
        """Close both carriers, save the state and end the thread (idempotent)."""
        self._thread.stop()

    def __enter__(self) -> AttachedServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- where and what --------------------------------------------------------------------

    @property
    def address(self) -> str:
        """``host:port`` of the binary port (it answers HTTP too); known once started."""
        host = self.config.host
        return f"[{host}]:{self.server.port}" if ":" in host else f"{host}:{self.server.port}"

    @property
    def http_port(self) -> int | None:
        """The HTTP port (the binary port itself unless ``http_port >= 0``)."""
        return self.server.http_port

    def take(self, max_steps: int | None = None) -> tuple[list[Fragment], list[EpisodeSummary]]:
        """What network clients produced since the last take; thread-safe.

        Args:
            max_steps: At most this many steps (None: all queued), shared max-min fairly
                between sources; a fragment is cut where a source's share ends (the rest stays
                queued and is handed on next time), except a fragment of a policy with memory,
                which goes whole (a source may then get less than one fragment more).

        Returns:
            The fragments (every one is in the experience log), and the summaries of every
            episode that ended since the last take (remote and reported ones; ``reason`` says
            how it ended, idle time-outs included).
        """
        return self._queues.take(max_steps)

    @property
    def steps_by_source(self) -> dict[str, int]:
        """Steps each source (client identity) delivered since start, logged and queued."""
        return self._queues.counter("steps_by_source")

    @property
    def dropped_steps_by_source(self) -> dict[str, int]:
        """Steps each source lost from its own full queue before they were taken."""
        return self._queues.counter("dropped_steps_by_source")

    @property
    def taken_steps_by_source(self) -> dict[str, int]:
        """Steps of each source handed on by :meth:`take`."""
        return self._queues.counter("taken_steps_by_source")

    @property
    def queued_steps_by_source(self) -> dict[str, int]:
        """Steps each source has queued now."""
        return self._queues.queued_steps_by_source

    @property
    def taken_through(self) -> int:
        """The experience-log position through which every record was taken or dropped.

        Once the Algorithm's checkpoint has trained on everything taken so far, the log may be
        cleaned through it (:meth:`release_log`).
        """
        return self._queues.taken_through

    @property
    def stats(self) -> ServerStats:
        """The server's counters (read from the serving thread; a snapshot may be torn)."""
        return self.server.stats

    # -- calls into the serving thread -----------------------------------------------------

    def publish(self, policy_id: str, package: WeightsPackage) -> None:
        """Store a policy's weights in the run folder and serve them; thread-safe.

        Remote-inference clients act with them from the next batch; local-inference clients
        fetch them (their reports' replies name the new version). Returns once swapped in.

        Raises:
            KeyError: ``policy_id`` is not served.
            RuntimeError: The server is not running.
        """
        if policy_id not in self.server.policies:
            raise KeyError(f"unknown policy '{policy_id}'; served: {list(self.server.policies)}")
        self._thread.call(lambda: self.server._on_weights(policy_id, package), PUBLISH_TIMEOUT)

    def requeue_after(self, seq: int) -> int:
        """Queue again every experience-log record after ``seq`` (those a restart left untrained).

        Call it once, after :meth:`start`, with the position the restored checkpoint had
        trained through. The records are queued under the source ``replayed``. Returns the
        number of steps queued.

        Raises:
            LogCorruptError: A record the log holds cannot be read.
        """
        through = self.server.log.last_seq
        reader = LogReader(self.server.log.directory)
        steps = 0
        try:
            for record in reader.records(max(0, seq), through):
                fragments = [Fragment.from_wire(raw) for raw in record.fragments()]
                self._queues.put(REPLAYED_SOURCE, fragments, record.seq)
                steps += record.steps
        finally:
            reader.close()
        return steps

    def release_log(self, through: int) -> None:
        """Delete experience-log segments wholly at or before ``through`` (trained past).

        Pass at most :attr:`taken_through` as of the checkpoint that trained on what was taken.
        """
        through = min(through, self.taken_through)
        self._thread.call(
            lambda: self.server._on_checkpointed({"log_needed_after": through}), PUBLISH_TIMEOUT
        )
