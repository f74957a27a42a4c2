"""Local inference: the client computes actions itself and ships experience in batches.

The policy runs with numpy (:class:`~rlserve.policy.NumpyPolicy`) from weights the server
publishes; its episode bookkeeping is :class:`~rlserve.experience.episodes.EpisodeTable`, the
server's own, so the rules and errors (a step's info limit too) are identical in both modes.
Two background threads, each with its own connection, keep the network off the caller's path:

* the *refresher* fetches weights every ``update_interval`` seconds, and as soon as a sample
  report's reply shows a newer version; only a changed version is transferred, and the swap is
  one reference assignment, so ``get_action`` always sees a whole policy;
* the *shipper* sends fragments in batches (by step count and by time) with a unique batch id,
  and re-sends the same batch after a lost reply or a server restart; the server trains on each
  batch id once. The server answers a batch when it hands it to the learner, which paces the
  shipper to the learner (after a move to another front-end, the unanswered batch goes there
  with its batch id, and that one's weights are fetched whole). What is ready is cut into
  reports that each fit the server's ``max_frame_bytes`` and ``max_array_elements`` (a fragment
  is split by steps when needed), so a backlog after an outage drains report after report; a
  single step too large for any report is dropped and counted in
  :attr:`LocalInference.rejected_steps`.

Each client samples actions from its own random stream: a ``SeedSequence`` of the client's seed
(fresh entropy by default) spawns a child for every policy it swaps in.

The buffer of unshipped steps is bounded: past ``max_buffered_steps`` the oldest unsent
fragments are dropped (``when_full="drop"``, the default: the simulator never waits; a warning at
most every ``DROP_WARNING_INTERVAL`` seconds and :attr:`LocalInference.dropped_steps` say what was
lost and what to do) or ``get_action`` waits for room (``when_full="block"``, for simulators that
can pause). Steps the server's learner dropped unread (it fell behind) are counted in
:attr:`LocalInference.server_dropped_steps` and warned about the same way.

An unclosed client ships what it holds at interpreter exit (:mod:`rlserve.client.exit_flush`);
what it cannot deliver, then or at :meth:`LocalInference.close`, is named in a warning.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

from rlserve.client.connection import Connection, Timeouts
from rlserve.client.engine import ServerView
from rlserve.client.exit_flush import forget_closed, track_unclosed
from rlserve.client.local_config import LocalConfig
from rlserve.client.reports import (
    halve_report,
    memory_fragment_length,
    plan_policy_reports,
    report_message,
)
from rlserve.client.weights_source import WeightsSource
from rlserve.errors import (
    ConfigError,
    ConnectionLostError,
    FrameTooLargeError,
    ServerError,
    SpaceError,
)
from rlserve.experience.collector import Collector
from rlserve.experience.episode_records import EpisodeSummary
from rlserve.protocol.fragment import Fragment
from rlserve.protocol.replies import SamplesAccepted

logger = logging.getLogger("rlserve.client")

T = TypeVar("T")

DROP_WARNING_INTERVAL = 30.0
"""Seconds between two warnings about dropped steps (each says the count so far)."""

RECONNECT_SLICE = 0.25
"""Seconds a background thread tries to reconnect before it checks whether it should stop."""


class LocalInference(Collector):
    """The local-mode engine behind :class:`~rlserve.PolicyClient`: a collector plus transport.

    The episode calls and the acting are :class:`~rlserve.experience.collector.Collector`'s; this
    class adds
    the network: a refresher thread that swaps in newer weights and a shipper thread that sends
    the collector's fragments and episode summaries in ``report_samples`` batches.

    Args:
        weights_conn: An open connection for fetching weights.
        make_connection: Opens another connection (for the shipper).
        view: The server's welcome: its policies and agent mapping; this client holds every
            policy (one weights fetch each) and ships each policy's experience in its own
            reports.
        update_interval: Seconds between weight refreshes; None: only on request.
        config: Batching and buffering.
        timeouts: Connection timeouts.
        seed: Entropy of this client's sampling ``SeedSequence``; None: fresh entropy.
        on_close: Called once when it closes, whoever closes it (the PolicyClient then refuses
            every call).
    """

    def __init__(
        self,
        weights_conn: Connection,
        make_connection: Any,
        view: ServerView,
        update_interval: float | None,
        config: LocalConfig,
        timeouts: Timeouts,
        seed: int | None = None,
        on_close: Callable[[], None] | None = None,
    ):
        self.update_interval = update_interval
        self.config = config
        self._timeouts = timeouts
        self._lock = threading.Condition()
        self._outbox: deque[Fragment] = deque()
        self._summaries: list[EpisodeSummary] = []
        self._buffered_steps = 0
        self._stopping = False
        self._enqueued_steps = 0
        """Steps ever queued for shipping (what close hands on is the difference it makes)."""
        self._closed = False
        self._closing = False
        """Set by :meth:`stop_waiting`: a call waiting for room gives up waiting."""
        self._on_close = on_close
        self._flushing = 0  # flush() calls waiting: the shipper sends what it has at once
        # The reports the shipper has taken from the outbox and not yet had answered.
        self._in_flight: list[tuple[str, list[Fragment], list[EpisodeSummary]]] = []
        self._ship_error: str | None = None
        self._wake_refresher = threading.Event()
        self.dropped_steps = 0
        """Steps dropped because the buffer was full."""
        self.rejected_steps = 0
        """Steps the server refused (see the log for why)."""
        self.shipped_steps = 0
        """Steps the server has accepted."""
        self.server_dropped_steps = 0
        """Accepted steps the server's learner dropped unread (it fell behind)."""
        self._warned_at: dict[str, float] = {}
        self._weights_conn = weights_conn
        self._weights = WeightsSource(weights_conn, timeouts, seed)
        self._weights_lock = self._weights.lock
        self._policies = {}
        self._view = view
        first = {pid: self._weights.fetch_retrying(pid, None) for pid in view.policies.policies}
        super().__init__(
            view.policies,
            first,
            memory_fragment_length(config.fragment_length, first, weights_conn.limits),
            config.max_episodes,
            self._enqueue,
            self._add_summary,
            holder="this client",
            limit_setting="LocalConfig(max_episodes=...)",
            max_info_bytes=weights_conn.limits.max_info_bytes,
        )
        if view.policies.map_agents:
            self.ask_policies = self._weights.map_agents
        self._ship_conn: Connection = make_connection()
        self._shipper = threading.Thread(
            target=self._ship_loop, name="rlserve-shipper", daemon=True
        )
        self._refresher = threading.Thread(
            target=self._refresh_loop, name="rlserve-refresher", daemon=True
        )
        self._shipper.start()
        self._refresher.start()
        track_unclosed(self)

    # -- weights -----------------------------------------------------------------------------

    @property
    def weights_version(self) -> int | None:
        """Version of the weights acting in single-agent episodes of the default policy."""
        return self.policy.version

    def get_actions(self, episode_ids: list[str], observations: Any, keyed: bool) -> Any:
        """Act in several episodes at once: a dict keyed by id when ``keyed``, else stacked."""
        actions = self.get_action(episode_ids, observations)
        if keyed:
            return self._view.by_episode(episode_ids, actions)
        return actions

    def update_weights(self) -> None:
        """Fetch the newest weights of every policy now (a round trip each, or more to retry)."""
        for policy_id, policy in list(self._policies.items()):
            self._policies[policy_id] = self._weights.fetch_retrying(policy_id, policy)

    def _refresh_loop(self) -> None:
        while not self._stopping:
            timeout = self.update_interval
            if timeout is None:
                self._wake_refresher.wait()
            else:
                self._wake_refresher.wait(timeout)
            self._wake_refresher.clear()
            if self._stopping:
                return
            try:
                for policy_id, policy in list(self._policies.items()):
                    self._policies[policy_id] = self._weights.fetch(policy_id, policy)
            except ConnectionLostError:
                if self._reconnect(self._weights_conn, self._weights_lock):
                    self._wake_refresher.set()  # fetch from the server found at once
            except ServerError as exc:
                logger.warning("rlserve: fetching weights failed: %s", exc)

    # -- shipping ----------------------------------------------------------------------------

    def _add_summary(self, summary: EpisodeSummary) -> None:
        with self._lock:
            self._summaries.append(summary)

    def _enqueue(self, fragment: Fragment) -> None:
        with self._lock:
            self._outbox.append(fragment)
            self._buffered_steps += len(fragment)
            self._enqueued_steps += len(fragment)
            if self._buffered_steps >= self.config.batch_steps:
                self._lock.notify_all()
            while self._buffered_steps > self.config.max_buffered_steps and not self._stopping:
                if self._closed or self._closing:
                    break  # close never waits, nor drops: its flush and warning deal with it
                if self.config.when_full == "block":
                    self._lock.wait(1.0)
                    continue
                if not self._outbox:
                    break
                dropped = self._outbox.popleft()
                self._buffered_steps -= len(dropped)
                self.dropped_steps += len(dropped)
                self._warn_dropped(
                    "buffer",
                    f"the experience buffer is full ({self.config.max_buffered_steps} steps: the "
                    "server is unreachable or takes experience slower than this client makes "
                    f"it); dropped {self.dropped_steps} steps so far (client.local.dropped_steps)"
                    "; pass local=LocalConfig(when_full='block') to make get_action wait "
                    "instead, a larger max_buffered_steps, or run fewer clients",
                )

    def _warn_dropped(self, kind: str, message: str) -> None:
        """Log ``message`` unless a warning of ``kind`` was logged in the last interval."""
        now = time.monotonic()
        last = self._warned_at.get(kind)
        if last is None or now - last >= DROP_WARNING_INTERVAL:
            self._warned_at[kind] = now
            logger.warning("rlserve: %s", message)

    def _take_batch(self) -> tuple[list[Fragment], list[EpisodeSummary]]:
        with self._lock:
            deadline = time.monotonic() + self.config.batch_interval
            while (
                not self._stopping
                and not self._flushing
                and self._buffered_in_outbox() < self.config.batch_steps
                and time.monotonic() < deadline
            ):
                self._lock.wait(max(0.0, deadline - time.monotonic()))
            fragments = list(self._outbox)
            self._outbox.clear()
            summaries, self._summaries = self._summaries, []
            return fragments, summaries

    def _buffered_in_outbox(self) -> int:
        return sum(len(f) for f in self._outbox)

    def _ship_loop(self) -> None:
        while True:
            fragments, summaries = self._take_batch()
            if fragments or summaries:
                reports, too_big = plan_policy_reports(
                    fragments, summaries, self.default_policy_id, self._ship_conn.limits
                )
                for fragment in too_big:
                    self._drop_oversized([fragment])
                self._in_flight = reports
                while reports:
                    if not self._ship(*reports[0]):
                        return  # closing while the server is unreachable
                    reports.pop(0)
            with self._lock:
                if self._stopping and not self._outbox and not self._summaries:
                    return

    def _drop_oversized(self, fragments: list[Fragment]) -> None:
        steps = sum(len(f) for f in fragments)
        self.rejected_steps += steps
        self._release(steps)
        logger.error(
            "rlserve: dropped %d steps: one step of %s does not fit in a report under the "
            "server's limits (max_frame_bytes %d, max_array_elements %d); raise the server's "
            "--max-frame-bytes",
            steps,
            ", ".join(sorted({f.episode_id for f in fragments})),
            self._ship_conn.limits.max_frame_bytes,
            self._ship_conn.limits.max_array_elements,
        )

    def _ship(
        self, policy_id: str, fragments: list[Fragment], summaries: list[EpisodeSummary]
    ) -> bool:
        """Send one report until the server answers it; False when closing gave up on it."""
        steps = sum(len(f) for f in fragments)
        message = report_message(policy_id, fragments, summaries)
        while True:
            try:
                reply = SamplesAccepted.from_wire(self._ship_conn.request(dict(message)))
                break
            except FrameTooLargeError:
                # The size estimate was short: ship the batch in two halves.
                halves = halve_report(fragments, summaries)
                if halves is None:
                    self._drop_oversized(fragments)
                    return True
                return self._ship(policy_id, *halves[0]) and self._ship(policy_id, *halves[1])
            except ConnectionLostError as exc:
                if not self._stopping:  # else close() gave up waiting and aborted the read
                    self._ship_error = f"the server could not be reached ({exc})"
                if not self._reconnect(self._ship_conn, None):
                    return False
                if self._ship_conn.moved_from is not None and self.update_interval is not None:
                    self._wake_refresher.set()  # act with the new front-end's weights soon
            except (ServerError, SpaceError) as exc:
                logger.error("rlserve: the server refused %d steps: %s", steps, exc)
                self.rejected_steps += steps
                self._release(steps)
                self._wake_refresher.set()
                return True
        self._ship_error = None
        self.shipped_steps += steps
        self._release(steps)
        dropped = reply.dropped_steps
        if dropped is not None and dropped > 0:
            self.server_dropped_steps += dropped
            self._warn_dropped(
                "server",
                f"the server's learner fell behind and dropped {self.server_dropped_steps} of "
                f"the {self.shipped_steps} steps this client shipped "
                "(client.local.server_dropped_steps); run fewer clients or raise the server's "
                "--max-sample-queue-steps",
            )
        served = reply.weights_version
        newer = served is not None and served > self._policies[policy_id].version
        if newer and self.update_interval is not None:
            self._wake_refresher.set()
        return True

    def _release(self, steps: int) -> None:
        with self._lock:
            self._buffered_steps -= steps
            self._lock.notify_all()

    def _reconnect(self, conn: Connection, lock: threading.Lock | None) -> bool:
        """Re-open ``conn`` with backoff while not stopping; True when reopened.

        Tried in short slices: :meth:`close` stops a thread waiting for a down server at once.
        """
        warned = False
        while not self._stopping:
            try:
                with lock if lock is not None else contextlib.nullcontext():
                    conn.reconnect(time.monotonic() + RECONNECT_SLICE)
                return True
            except ConnectionLostError:
                if not warned:
                    logger.warning(
                        "rlserve: lost the connection to the server at %s; retrying until "
                        "it%s is back (%d steps buffered)",
                        conn.front_end,
                        " or another front-end" if conn.several else "",
                        self._buffered_steps,
                    )
                    warned = True
            except ConfigError as exc:  # a front-end of another run: wait for a right one
                self._warn_dropped("front-end", f"{exc}; {self._buffered_steps} steps buffered")
                time.sleep(RECONNECT_SLICE)
        return False

    @property
    def buffered_steps(self) -> int:
        """Steps collected and not yet accepted by the server."""
        return self._buffered_steps

    def flush(self, timeout: float) -> bool:
        """Ship everything buffered; True when all of it was answered within ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._lock:
            self._flushing += 1
            try:
                self._lock.notify_all()
                while self._buffered_steps > 0 and time.monotonic() < deadline:
                    self._lock.wait(0.05)
                    self._lock.notify_all()
            finally:
                self._flushing -= 1
            return self._buffered_steps == 0

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (the client then refuses every call)."""
        return self._closed

    def stop_waiting(self) -> None:
        """Wake a call waiting for room in a full buffer (``when_full="block"``).

        Its steps stay buffered, for :meth:`close` (which follows) to ship or name as lost.
        """
        with self._lock:
            self._closing = True
            self._lock.notify_all()

    def close(self, timeout: float = 30.0) -> None:
        """Ship what is buffered, stop the threads and disconnect, within ``timeout`` seconds.

        What could not be shipped in time (e.g. the server is down) is named in a warning and
        lost. A second call does nothing.
        """
        self._close(timeout, "pass close() a longer timeout, or keep the server up till it returns")

    def close_at_exit(self, timeout: float) -> None:
        """:meth:`close` at interpreter exit, for a client the program never closed."""
        self._close(
            timeout,
            "call client.close() before the program ends, or use "
            "'with PolicyClient(...) as client:', while the server is up",
        )

    def _close(self, timeout: float, fix: str) -> None:
        with self._lock:  # an exit-time close and a close of another thread: one runs
            if self._closed:
                return
            self._closed = True
        if self._on_close is not None:
            self._on_close()
        forget_closed(self)
        deadline = time.monotonic() + timeout
        self._hand_on_open_episodes()
        # Keep a little of the time for the threads to notice the stop.
        self.flush(max(0.0, timeout - min(1.0, timeout / 4)))
        with self._lock:
            self._stopping = True
            self._lock.notify_all()
        self._wake_refresher.set()
        for thread, conn in (
            (self._shipper, self._ship_conn),
            (self._refresher, self._weights_conn),
        ):
            thread.join(max(0.0, deadline - time.monotonic() - 0.1))
            if thread.is_alive():
                conn.abort()  # blocked waiting for a reply: make the read return
                thread.join(max(0.05, deadline - time.monotonic()))
        if self._buffered_steps:
            logger.warning(
                "rlserve: %d steps of %d episodes were not delivered to the server at %s:%d: "
                "%s; %s",
                self._buffered_steps,
                len(self._undelivered_episodes()),
                self._ship_conn.host,
                self._ship_conn.port,
                self._ship_error or f"it did not take them within {timeout:.1f} s",
                fix,
            )
        for conn in (self._ship_conn, self._weights_conn):
            conn.abort()
            with contextlib.suppress(ConnectionLostError, ServerError):
                conn.close()

    def _hand_on_open_episodes(self) -> None:
        """Queue the steps of episodes still open at close, as a server does at idle expiry.

        They are trained on (bootstrapping from their last observation); the episodes are not
        counted as finished, since they did not end.
        """
        try:
            left_open = self.table.open_episodes()
            if not left_open:
                return
            before = self._enqueued_steps
            for episode in left_open:
                self.table.abandon(episode, "client_closed")  # its summary is not reported
        except Exception as exc:  # another thread still calls (at exit): flush what is queued
            logger.warning("rlserve: close(): open episodes were not handed on (%r)", exc)
            return
        logger.warning(
            "rlserve: close(): %d episodes were still open; %d of their steps are shipped for "
            "training (the last step of each has no next observation), but they are not "
            "counted as finished episodes (call end_episode before close to count them)",
            len(left_open),
            self._enqueued_steps - before,
        )

    def _undelivered_episodes(self) -> set[str]:
        """Ids of the episodes with steps or a summary the server has not accepted."""
        with self._lock:
            fragments = list(self._outbox)
            summaries = list(self._summaries)
        for _, shipping, closing in list(self._in_flight):
            fragments += shipping
            summaries += closing
        return {f.episode_id for f in fragments} | {s.episode_id for s in summaries}
