"""The one learner loop: take experience, update when ready, publish, checkpoint.

A :class:`TrainingDriver` holds one :class:`~rlserve.training.policy_learner.PolicyLearner` per
policy. Every trainer drives it the same way, whatever samples for it: the learner process
(:mod:`rlserve.training.learner_worker`, experience read from the log) and the in-process
Algorithm (:mod:`rlserve.algorithm.algorithm`, experience from its samplers):

1. :meth:`TrainingDriver.take` routes each fragment to the policy it names (a fragment of a
   policy not hosted is skipped, and said once per policy);
2. :meth:`TrainingDriver.ingest` hands what was taken to the learners (one hand-off per policy)
   and settles every policy with nothing buffered at the log position read through;
3. :meth:`TrainingDriver.train` updates every ready policy in turn, one update each per pass,
   until none is ready (or each did ``max_updates_per_round``, or the caller interrupts),
   settling the log position and calling ``publish`` after each update, and checkpointing a
   policy every ``checkpoint_every`` of its updates;
4. :meth:`TrainingDriver.save_all` checkpoints every policy on request.

What happens with an update is the caller's ``publish``: the learner process sends the new
weights and metrics down its pipe; the Algorithm keeps the metrics and, once the round is over,
swaps the weights into its samplers' policies and publishes them to its attached server.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from rlserve.protocol.fragment import Fragment
from rlserve.training.policy_learner import PolicyLearner

logger = logging.getLogger("rlserve.training")

MAX_UPDATES_PER_ROUND = 64
"""The in-process Algorithm's bound on one policy's updates after one round of sampling: an
off-policy learner that is still ready after an update has a backlog (more steps came in than
one round trains on)."""

Publish = Callable[[PolicyLearner, dict[str, float]], None]
"""Called after each update with the policy (its new weights: ``policy.learner.weights()``, its
log position settled) and the update's metrics."""

Checkpointed = Callable[[dict[str, Any]], None]
"""Called with the ``checkpointed`` message of each checkpoint the driver writes."""


def _never() -> bool:
    return False


def _warn_unknown(policy_id: str) -> None:
    logger.warning("fragments of the policy '%s', which is not hosted, are skipped", policy_id)


class TrainingDriver:
    """Trains one learner per policy on the fragments it is given (see the module doc).

    Args:
        policies: Each policy's learner, by id, in the order they train.
        publish: Called after each update (:data:`Publish`).
        checkpointed: Called with each checkpoint's message (needed with ``checkpoint_every``
            or :meth:`save_all`).
        checkpoint_every: Checkpoint a policy after every this many of its updates (0: never).
        max_updates_per_round: Updates of one policy per :meth:`train` at most (None: until
            it is no longer ready).
        on_unknown: Called once per policy id that fragments name and no learner hosts
            (default: a warning on the ``rlserve.training`` logger).

    Attributes:
        position: The experience-log position read through (0 without a log).
        log_steps: Log steps read through ``position``.
        unknown_steps: Steps skipped per policy id that no learner hosts.
    """

    def __init__(
        self,
        policies: dict[str, PolicyLearner],
        publish: Publish,
        checkpointed: Checkpointed | None = None,
        checkpoint_every: int = 0,
        max_updates_per_round: int | None = None,
        on_unknown: Callable[[str], None] = _warn_unknown,
    ):
        self.policies = policies
        self._publish = publish
        self._checkpointed = checkpointed
        self.checkpoint_every = checkpoint_every
        self.max_updates_per_round = max_updates_per_round
        self._on_unknown = on_unknown
        self.unknown_steps: dict[str, int] = {}
        # Read on from the policy that trained least far; the others skip what they have.
        behind = min(policies.values(), key=lambda p: p.settled)
        self.position = behind.settled
        self.log_steps = behind.settled_log_consumed

    # -- experience --------------------------------------------------------------------------

    def take(self, fragments: Iterable[Fragment], seq: int | None = None) -> None:
        """Route fragments to their policies (kept there until :meth:`ingest`).

        Args:
            fragments: The fragments, in order.
            seq: The experience-log record they were read from: a policy that has trained
                past it skips them (None: not from the log, never skipped).
        """
        policies = self.policies
        for fragment in fragments:
            policy = policies.get(fragment.policy_id)
            if policy is not None:
                policy.take(seq, fragment)
                continue
            pid = fragment.policy_id
            if pid not in self.unknown_steps:
                self.unknown_steps[pid] = 0
                self._on_unknown(pid)
            self.unknown_steps[pid] += len(fragment)

    def ingest(self, through: int | None = None, log_steps: int = 0) -> None:
        """Hand each policy what it took to its learner; settle the policies at ``through``.

        Args:
            through: The experience-log position now read through (None: unchanged).
            log_steps: Log steps read since the last call.
        """
        for policy in self.policies.values():
            policy.ingest_taken()
        if through is not None:
            self.position = through
        self.log_steps += log_steps
        for policy in self.policies.values():
            policy.settle(self.position, self.log_steps)

    def restart_at(self, position: int) -> None:
        """Read on from ``position``: every policy's (restored) weights hold the log through it."""
        self.position = position
        for policy in self.policies.values():
            policy.settled = position

    @property
    def trained_through(self) -> int:
        """The log position through which every policy has every record in its weights."""
        return min(policy.settled for policy in self.policies.values())

    # -- updates -----------------------------------------------------------------------------

    def train(self, interrupted: Callable[[], bool] = _never) -> list[str]:
        """Update every ready policy in turn, one update per pass, until none is ready.

        Args:
            interrupted: Asked after each update; True ends the round there.

        Returns:
            The ids of the policies that updated, in policy order.
        """
        cap = self.max_updates_per_round
        updates: dict[str, int] = {}
        interrupt = False
        while not interrupt:
            ready = [
                p
                for p in self.policies.values()
                if p.ready() and (cap is None or updates.get(p.policy_id, 0) < cap)
            ]
            if not ready:
                break
            for policy in ready:
                metrics = policy.learner.update()
                updates[policy.policy_id] = updates.get(policy.policy_id, 0) + 1
                policy.settle(self.position, self.log_steps)
                self._publish(policy, metrics)
                every = self.checkpoint_every
                if every and policy.updates % every == 0:
                    self._checkpoint(policy, "interval")
                    self.save_idle()
                interrupt = interrupted()
                if interrupt:
                    break
        return [pid for pid in self.policies if pid in updates]

    # -- checkpoints -------------------------------------------------------------------------

    def _checkpoint(self, policy: PolicyLearner, reason: str) -> None:
        if self._checkpointed is None:
            raise RuntimeError("this driver checkpoints nothing: it has no checkpointed hook")
        self._checkpointed(policy.save(reason))

    def save_all(self, reason: str) -> None:
        """Checkpoint every policy (``reason``: ``request``, ``shutdown``...)."""
        for policy in self.policies.values():
            self._checkpoint(policy, reason)

    def save_idle(self) -> None:
        """Checkpoint again the idle policies that settled further in the log.

        Frozen ones and ones without traffic: so the log's clean-up moves on.
        """
        for policy in self.policies.values():
            if policy.idle_behind():
                self._checkpoint(policy, "idle")
