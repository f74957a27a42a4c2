"""Local inference: weights sent to clients that act themselves, and the samples they report.

A local-inference client fetches a policy's weights (``get_weights``) and later reports what it
collected with them (``report_samples``). Both wait for the learner's first weights. A reported
batch is checked against the versions this server published, stored durably by the sink, and
answered once a learner has it; a re-sent batch is answered as a duplicate
(:class:`~rlserve.server.reports.BatchLedger`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any, Protocol

from rlserve.errors import RLServeError, ServerError, SpaceError
from rlserve.policy.weights import WeightsPackage
from rlserve.protocol.fragment import Fragment
from rlserve.protocol.limits import Limits
from rlserve.protocol.messages import GetWeights, ReportSamples
from rlserve.protocol.replies import WeightsReply
from rlserve.server.batching import PolicySlot, named_slot
from rlserve.server.replies import Respond
from rlserve.server.reports import BatchLedger, check_summaries
from rlserve.server.sessions import Session, source_name
from rlserve.server.stats import ServerStats


class SampleSink(Protocol):
    """Where finished fragments go (the learner link)."""

    def add(self, fragment: Fragment) -> None:
        """Queue one fragment."""

    def add_batch(
        self,
        fragments: list[Fragment],
        batch_id: str,
        on_done: Callable[[int], None],
        source: str = "",
    ) -> None:
        """Store a reported batch durably; ``on_done(dropped_steps)`` once a learner has it.

        ``source`` is the client identity that reported it (the session's key).

        Raises:
            OSError: It could not be stored; nothing of it was kept.
        """


def weights_reply(request: GetWeights, package: WeightsPackage) -> dict[str, Any]:
    """The ``weights`` reply: the package, or only its version when the client has it."""
    if request.have_version == package.version:
        reply = WeightsReply(request.id, request.policy_id, package.version, unchanged=True)
    else:
        reply = WeightsReply(
            request.id,
            request.policy_id,
            package.version,
            unchanged=False,
            model=package.spec.to_wire(),
            arrays=package.arrays,
        )
    return reply.to_wire()


class LocalInference:
    """Answers ``get_weights`` and ``report_samples``.

    Args:
        slots: The policies served, by id; a request waits in its policy's slot until the
            learner publishes.
        limits: Wire limits (of reported episodes).
        ledger: The reported batches: new, waiting for a learner, or answered.
        sink: Stores reported batches.
        stats: Counters for metrics.
    """

    def __init__(
        self,
        slots: dict[str, PolicySlot],
        limits: Limits,
        ledger: BatchLedger,
        sink: SampleSink,
        stats: ServerStats,
    ):
        self.slots = slots
        self.limits = limits
        self.ledger = ledger
        self._sink = sink
        self.stats = stats

    def get_weights(self, request: GetWeights, respond: Respond) -> bool:
        """Answer with the policy's weights; return True when they are not published yet."""
        slot = named_slot(self.slots, request.policy_id)
        if slot.package is None:
            # The learner has not published yet: answer as soon as it does.
            slot.weight_waiters.append((request, respond))
            return True
        respond(weights_reply(request, slot.package))
        return False

    def report_samples(self, request: ReportSamples, session: Session, respond: Respond) -> bool:
        """Check and store a reported batch; return True when ``respond`` will be called later.

        Raises:
            RLServeError: The batch is malformed or out of bounds, or the server cannot store
                it now (:class:`~rlserve.errors.ServerError`); nothing of it was kept.
        """
        slot = named_slot(self.slots, request.policy_id)
        if slot.package is None:
            # Nothing can be checked against published versions yet: wait for the learner.
            slot.report_waiters.append((request, session, respond))
            return True
        state = self.ledger.begin(request, respond)
        if state != "new":
            return state == "waiting"
        try:
            where = f"report_samples '{request.batch_id}'"
            check = slot.fragment_checker.check
            version = slot.package.version
            state_size = 0 if slot.policy is None else slot.policy.state_size
            fragments = [
                check(raw, version, f"{where}.fragments[{i}]", state_size)
                for i, raw in enumerate(request.fragments)
            ]
            summaries = check_summaries(
                request.episodes, self.limits, where, request.policy_id, self.slots
            )
        except RLServeError:
            self.ledger.abandon(request.batch_id)
            raise
        except (TypeError, ValueError, OverflowError) as exc:
            self.ledger.abandon(request.batch_id)
            raise SpaceError(f"report_samples '{request.batch_id}': malformed: {exc}") from exc
        steps = sum(len(f) for f in fragments)

        def handed(dropped: int) -> None:
            # The version of this report's policy: a local client compares it with its own.
            served = slot.package.version if slot.package is not None else -1
            self.ledger.finish(request, steps, dropped, served)

        if fragments:
            try:
                self._sink.add_batch(fragments, request.batch_id, handed, session.key)
            except OSError as exc:
                self.ledger.abandon(request.batch_id)
                raise ServerError(
                    f"report_samples '{request.batch_id}': the server cannot store experience "
                    f"now ({exc}); nothing was kept: send the batch again later"
                ) from exc
        # Counted once it is in the experience log: from then on it is never lost, and a
        # re-sent copy is answered as a duplicate, even after a crash.
        self.stats.count_reported(steps)
        # A training_enabled=False episode's steps travel in no fragment, only its length.
        self.stats.count_unreported(sum(s.length for s in summaries if not s.training_enabled))
        for summary in summaries:
            self.stats.record_reported_episode(replace(summary, source=source_name(session.key)))
        if not fragments:
            handed(0)
        return True
