"""A serving front-end's link to the one learner of several (``rlserve serve --replicas N``).

Every front-end is a serving process with its own experience log. Its link ships the records
the learner has not merged (read back from its log) in each exchange with the
:class:`~rlserve.cluster.shared_learner.SharedLearner` actor, and a reported batch is
acknowledged once it is on this front-end's disk and merged into the learner's log (on the
learner's disk), which the exchange's answer says (``merged_through``). A restarted front-end
reopens its log and ships what the learner has not merged: its replay.

The first front-end (the ``rlserve serve`` driver) owns the learner: it creates the actor, by
name, where its resources are, restarts it when it dies, and stops it at the end. The others
find it by name (``--front-end-of NAME``) and wait while it is away.

The owner also holds the learner's recovery point (:mod:`~rlserve.cluster.recovery`) in its run
folder: the learner hands it a new one after each checkpoint, and hands the newest to a learner
it starts. A front-end's log is cleaned only through what that held point includes
(``held_through``), so a learner that lost its node and its disk goes on from the point and is
shipped everything after it again.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from pathlib import Path
from typing import Any

from rlserve.cluster.connect import LearnerPlacement
from rlserve.cluster.failures import actor_failure
from rlserve.cluster.learner_link import LearnerActorSlot, RayLearnerLink
from rlserve.cluster.log_shipper import Shipped
from rlserve.cluster.recovery import RECOVERY_FILE, load_point, point_key, save_point
from rlserve.cluster.shared_learner import SharedLearner
from rlserve.processes.restarts import Failure
from rlserve.server.learner_link import LearnerLink

__all__ = ["NAMESPACE", "FrontEndLink"]

logger = logging.getLogger("rlserve.server")

NAMESPACE = "rlserve"
"""The Ray namespace the learner actor's name is found in."""

ATTACH_RETRY_S = 0.5
"""Seconds between looks for a learner that is away (its owner restarts it)."""


class FrontEndLink(RayLearnerLink):
    """The learner side of one front-end (the link's arguments, and these).

    Args:
        front_end: This front-end's name (its node address), the same after a restart.
        learner_name: The learner actor's name.
        owner: Whether this front-end creates, restarts and stops the learner.
        placement: The learner's resources (the owner's).
    """

    def __init__(
        self,
        *args: Any,
        front_end: str,
        learner_name: str,
        owner: bool,
        placement: LearnerPlacement | None = None,
        **kwargs: Any,
    ) -> None:
        self._front_end = front_end
        self._learner_name = learner_name
        self._owner = owner
        self._merged_through: int | None = None
        self._held_through = 0
        """The newest seq of this log that the driver's recovery point includes."""
        self._held_key = point_key(None)
        self._life = uuid.uuid4().hex
        self.duplicate_steps = 0
        """Steps the learner skipped as copies of batches merged from another front-end."""
        super().__init__(*args, placement=placement, **kwargs)

    def _supervisor_of_learner(self) -> LearnerActorSlot:
        if self._owner:
            return _OwnedLearner(self._ray, self._placement, self._learner_name)
        return _FoundLearner(self._ray, self._placement, self._learner_name)

    def _setup_now(self) -> dict[str, Any]:
        # Not the one front-end's recovery point: the owner hands the shared learner its own.
        setup = LearnerLink._setup_now(self)
        # The merged log is the learner's own, beside (not in) the owner's experience log.
        setup = {**setup, "run_dir": str(self.log.directory.parent / "learner")}
        if self._owner:
            point = load_point(self._point_file())
            self._held_key = point_key(point)
            setup["recovery"] = point
        return setup

    def _point_file(self) -> Path:
        return self.log.directory.parent / RECOVERY_FILE

    async def _hold(self, point: dict[str, Any]) -> None:
        """Write the learner's new recovery point into the run folder (the owner's)."""
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, save_point, self._point_file(), point)
        except OSError as exc:
            self._stats.storage_failed("learner recovery point", exc)
            return
        self._stats.storage_ok("learner recovery point")
        self._held_key = point_key(point)

    def _connected(self) -> bool:
        # Only the owner waits for the learner's final checkpoints when it stops.
        return self._owner and self._actor is not None

    def _send(self, message: dict[str, Any]) -> None:
        if self._actor is None or message["type"] == "available":
            return  # every exchange ships what is not merged: no announcements needed
        if message["type"] == "stop" and not self._owner:
            return
        self._outgoing.append(message)

    async def _dispatch(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind == "checkpointed":
            # This log is needed after what the driver's recovery point includes: a learner
            # that lost its disk goes on from that point.
            message = {**message, "log_needed_after": self._held_through}
        elif kind == "ready":
            logger.info(
                "rlserve: front-end %s joined the learner (%s; device %s)",
                self._front_end,
                self._learner_name,
                message.get("device"),
            )
        await LearnerLink._dispatch(self, message)

    def _unmerged(self) -> list[Shipped]:
        """The records of this front-end's log the learner has not merged (some of them)."""
        if self._merged_through is None:
            return []
        return self._shipper.take(self._merged_through, self.log.last_seq)[0]

    async def _run_learner(self) -> None:
        actor = self._actor = self._children.start(self._setup_now())
        self._merged_through, self._outgoing = None, []
        try:
            while True:
                records = self._unmerged()
                messages, self._outgoing = self._outgoing, []
                held = self._held_key if self._owner else None
                call = actor.exchange.remote(self._front_end, self._life, records, messages, held)
                answer = await asyncio.wrap_future(call.future())
                self._merged_through = int(answer["merged_through"])
                self._held_through = int(answer["held_through"])
                if answer["recovery"] is not None:
                    await self._hold(answer["recovery"])
                self.duplicate_steps = int(answer["duplicate_steps"])
                self._consumed(self._merged_through, [])
                for message in answer["messages"]:
                    if message["type"] == "weights":
                        ref = message["package_ref"][0]
                        package = await asyncio.wrap_future(ref.future())
                        message = {**message, "package": package}
                    await self._dispatch(message)
                self._stats.learner["learner/steps_consumed"] = float(answer["steps_consumed"])
                if not answer["running"] or (self._stopping and not self._owner):
                    break
        except Exception as exc:  # Ray's error for a lost actor or node
            self.failure = f"the learner actor is away: {actor_failure(exc)}"
        finally:
            self._actor = None
            self._merged_through = None
            self._outgoing = []
            if self._pace is not None:
                self._pace.update(connected=False)
            self.checkpoints.final_in.set()


class _OwnedLearner(LearnerActorSlot):
    """The learner actor, named, created (and killed) by the owning front-end."""

    def __init__(self, ray: Any, placement: LearnerPlacement, name: str) -> None:
        super().__init__(ray, placement)
        self._name = name

    def _create(self, setup: dict[str, Any]) -> Any:
        cls = self._ray.remote(max_restarts=0, max_concurrency=64)(SharedLearner)
        options = {**self._placement.options(), "name": self._name, "namespace": NAMESPACE}
        return cls.options(**options).remote(setup)


class _FoundLearner(LearnerActorSlot):
    """The learner actor as another front-end finds it by name; never killed from here."""

    def __init__(self, ray: Any, placement: LearnerPlacement, name: str) -> None:
        super().__init__(ray, placement)
        self._name = name

    def _create(self, setup: dict[str, Any]) -> Any:
        try:
            return self._ray.get_actor(self._name, namespace=NAMESPACE)
        except ValueError:
            raise RuntimeError(f"the learner {self._name} is not running (yet)") from None

    def _kill(self) -> None:
        self._actor = None  # the owner's: it restarts or stops it

    def fail(self, slot: int, failure: Failure, during: str, note: Any = None) -> None:
        """Count it and say so once per absence (the owner restarts the learner)."""
        if not self.policy.in_a_row(slot):
            logger.warning(
                "rlserve: front-end lost the learner (%s); waiting for it", failure.reason
            )
        self.policy.failed(slot)
        self._kill()

    def restart_delay(self, slot: int) -> float:
        """Look again soon."""
        return ATTACH_RETRY_S
