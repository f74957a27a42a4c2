"""The experience network clients queued for an in-process Algorithm, one queue per source.

A source is the client identity that owns the episode or sent the report (:func:`source_name`,
:func:`client_source`: a one-way hash of a client's secret id). Each source has its own bounded
queue: when it is full, that source's oldest steps are dropped, never another's. A take shares
its steps max-min fairly between sources (:func:`fair_shares`), cutting a fragment where a
source's share ends (:func:`split_fragment`), so a fast client cannot crowd out a slow one.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import deque
from dataclasses import dataclass

from rlserve.experience.episode_records import EpisodeSummary
from rlserve.protocol.fragment import Fragment
from rlserve.server.sessions import identity_key, source_name
from rlserve.server.stats import ServerStats
from rlserve.server.throttled_log import SERVER_LOG

MAX_QUEUED_SUMMARIES = 100_000
"""Episode summaries kept for :meth:`SourceQueues.take`; past it the oldest are dropped."""


def client_source(client_id: str) -> str:
    """The source name of the client with this ``client_id`` (``PolicyClient.client_id``)."""
    return source_name(identity_key(client_id))


def split_fragment(fragment: Fragment, steps: int) -> tuple[Fragment, Fragment]:
    """Cut a fragment after its first ``steps`` steps (``0 < steps < len(fragment)``).

    The head ends in the observation that follows its last action and goes on (neither flag);
    the tail starts from that observation and keeps the fragment's flags.

    Raises:
        ValueError: ``steps`` is out of range, or the fragment has a ``state_in`` (a policy
            with memory: the tail would need the recurrent state at the cut, which is not
            known here; the queues move such fragments whole).
    """
    if not 0 < steps < len(fragment):
        raise ValueError(f"cannot split a fragment of {len(fragment)} steps after {steps}")
    if fragment.state_in is not None:
        raise ValueError("a fragment of a policy with memory (state_in) is never split")
    infos = fragment.infos
    head = dataclasses.replace(
        fragment,
        obs=fragment.obs[: steps + 1],
        actions=fragment.actions[:steps],
        rewards=fragment.rewards[:steps],
        behaviour_logp=fragment.behaviour_logp[:steps],
        policy_chosen=fragment.policy_chosen[:steps],
        weights_version=fragment.weights_version[:steps],
        terminated=False,
        truncated=False,
        infos=None if infos is None else infos[:steps],
    )
    tail = dataclasses.replace(
        fragment,
        obs=fragment.obs[steps:],
        actions=fragment.actions[steps:],
        rewards=fragment.rewards[steps:],
        behaviour_logp=fragment.behaviour_logp[steps:],
        policy_chosen=fragment.policy_chosen[steps:],
        weights_version=fragment.weights_version[steps:],
        infos=None if infos is None else infos[steps:],
    )
    return head, tail


def fair_shares(queued: dict[str, int], budget: int, first: int = 0) -> dict[str, int]:
    """Share ``budget`` steps max-min fairly between sources with ``queued`` steps each.

    Every source gets the same share, except that one with fewer steps queued takes only what
    it has and leaves the rest to the others. A remainder of one step each goes to the sources
    in turn from position ``first`` (rotated by the caller between takes).
    """
    shares = {source: 0 for source in queued}
    left = budget
    order = sorted(queued, key=lambda s: queued[s])
    rest: list[str] = []
    for i, source in enumerate(order):
        if queued[source] <= left // (len(order) - i):
            shares[source] = queued[source]
            left -= queued[source]
        else:
            rest = order[i:]
            break
    if rest:
        base, extra = divmod(left, len(rest))
        names = list(queued)
        rest.sort(key=lambda s: (names.index(s) - first) % len(names))
        for j, source in enumerate(rest):
            shares[source] = base + (1 if j < extra else 0)
    return shares


@dataclass(slots=True)
class _Queued:
    fragment: Fragment
    seq: int
    """The experience-log record it came in."""


class SourceQueues:
    """One bounded queue of fragments per source; thread-safe.

    Args:
        max_steps_per_source: Steps a source may have queued; past it its oldest are dropped.
        stats: The server's counters (``samples/steps_queued`` and the like are kept up to date).
    """

    def __init__(self, max_steps_per_source: int, stats: ServerStats):
        self.max_steps_per_source = max_steps_per_source
        self._stats = stats
        self._lock = threading.Lock()
        self._queues: dict[str, deque[_Queued]] = {}
        self._queued: dict[str, int] = {}
        self._summaries: deque[EpisodeSummary] = deque(maxlen=MAX_QUEUED_SUMMARIES)
        self._turn = 0
        self._last_seq = 0
        self.steps_by_source: dict[str, int] = {}
        """Steps each source delivered (logged), since start."""
        self.dropped_steps_by_source: dict[str, int] = {}
        """Steps of each source dropped from its full queue before they were taken."""
        self.taken_steps_by_source: dict[str, int] = {}
        """Steps of each source handed to the Algorithm."""

    def start_at(self, log_seq: int) -> None:
        """Records up to ``log_seq`` are not queued (logged before this server started)."""
        with self._lock:
            self._last_seq = max(self._last_seq, log_seq)

    def put(self, source: str, fragments: list[Fragment], seq: int) -> None:
        """Queue the fragments of log record ``seq`` under ``source``; trim its queue."""
        steps = sum(len(f) for f in fragments)
        with self._lock:
            queue = self._queues.setdefault(source, deque())
            queue.extend(_Queued(f, seq) for f in fragments)
            self._queued[source] = self._queued.get(source, 0) + steps
            self.steps_by_source[source] = self.steps_by_source.get(source, 0) + steps
            self._stats.steps_queued += steps
            self._last_seq = max(self._last_seq, seq)
            excess = self._queued[source] - self.max_steps_per_source
            if excess > 0:
                self._drop_oldest(source, queue, excess)

    def _drop_oldest(self, source: str, queue: deque[_Queued], excess: int) -> None:
        dropped = 0
        while dropped < excess:
            head = queue[0]
            size = len(head.fragment)
            if size <= excess - dropped:
                queue.popleft()
                dropped += size
            elif head.fragment.state_in is not None:
                break  # never split (split_fragment): over the limit by less than a fragment
            else:
                _, tail = split_fragment(head.fragment, excess - dropped)
                queue[0] = _Queued(tail, head.seq)
                dropped = excess
        if not dropped:
            return
        self._queued[source] -= dropped
        self.dropped_steps_by_source[source] = self.dropped_steps_by_source.get(source, 0) + dropped
        self._stats.steps_queued -= dropped
        self._stats.steps_dropped_queue_full += dropped
        SERVER_LOG.warn(
            f"steps_dropped_queue_full:{source}",
            f"client {source} produces faster than the Algorithm takes its experience: its "
            f"oldest steps are dropped ({self.dropped_steps_by_source[source]} so far); raise "
            f"max_queued_steps_per_source (now {self.max_steps_per_source}) or take more often",
        )

    def add_summary(self, summary: EpisodeSummary) -> None:
        """Keep an ended episode's summary for the next take."""
        with self._lock:
            self._summaries.append(summary)

    def take(self, max_steps: int | None = None) -> tuple[list[Fragment], list[EpisodeSummary]]:
        """Everything queued, or at most ``max_steps`` steps shared fairly; all summaries."""
        with self._lock:
            summaries = list(self._summaries)
            self._summaries.clear()
            queued = {s: n for s, n in self._queued.items() if n > 0}
            if not queued:
                return [], summaries
            sources = list(queued)
            if max_steps is None:
                shares = queued
            else:
                shares = fair_shares(queued, max(0, max_steps), self._turn % len(sources))
            self._turn += 1
            # Sources in turn, so the order of a take does not always favour the same one.
            start = self._turn % len(sources)
            fragments: list[Fragment] = []
            for source in sources[start:] + sources[:start]:
                fragments.extend(self._take_from(source, shares[source]))
            return fragments, summaries

    def _take_from(self, source: str, steps: int) -> list[Fragment]:
        queue = self._queues[source]
        taken: list[Fragment] = []
        left = steps
        while left > 0 and queue:
            head = queue[0]
            if len(head.fragment) <= left or head.fragment.state_in is not None:
                # A fragment of a policy with memory goes whole (never split): the share may
                # be exceeded by less than one fragment.
                queue.popleft()
                taken.append(head.fragment)
                left -= len(head.fragment)
            else:
                part, tail = split_fragment(head.fragment, left)
                queue[0] = _Queued(tail, head.seq)
                taken.append(part)
                left = 0
        got = steps - left
        self._queued[source] -= got
        self.taken_steps_by_source[source] = self.taken_steps_by_source.get(source, 0) + got
        self._stats.steps_queued -= got
        self._stats.steps_sent_to_learner += got
        return taken

    def counter(self, name: str) -> dict[str, int]:
        """A copy of one per-source counter (e.g. ``steps_by_source``), taken under the lock."""
        with self._lock:
            return dict(getattr(self, name))

    @property
    def queued_steps_by_source(self) -> dict[str, int]:
        """Steps each source has queued now."""
        with self._lock:
            return {s: n for s, n in self._queued.items() if n > 0}

    @property
    def taken_through(self) -> int:
        """The experience-log position every record through which was taken (or dropped)."""
        with self._lock:
            heads = [queue[0].seq for queue in self._queues.values() if queue]
            return min(heads) - 1 if heads else self._last_seq
