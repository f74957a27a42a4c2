"""The serving process's learner as a Ray actor, placed by resources (``rlserve serve --ray``).

:class:`RayLearnerLink` is the process link (:class:`~rlserve.server.learner_link.LearnerLink`)
with its child process replaced by a learner actor
(:class:`~rlserve.cluster.learner_actor.LearnerActorWorker`) anywhere in the cluster that has
the resources asked for (the GPU node). The log appends, acknowledgement tickets, pacing,
checkpoints and the restart policy are the process link's. What changes is the channel: the
learner cannot read this node's experience log, so each exchange (one actor call at a time)
carries the records appended since the last one, read back from the log, with the server's
messages; its answer carries the learner's. A restarted learner says from which position it
reads (``ready``), and is sent the records after it.

The learner's checkpoints are on its node's disk, which may be lost with it, so the link holds a
recovery point in the run folder (:class:`~rlserve.cluster.recovery.HeldCheckpoints`: the
checkpoints' files, which each ``checkpointed`` message carries), cleans the log only through
what the held point's checkpoints have trained, and hands the point to each learner it starts.
See ``docs/scaling.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from rlserve.cluster.actor import actor_class
from rlserve.cluster.connect import LearnerPlacement
from rlserve.cluster.failures import actor_failure
from rlserve.cluster.learner_actor import LearnerActorWorker
from rlserve.cluster.log_shipper import LogShipper, Shipped
from rlserve.cluster.ray_import import import_ray
from rlserve.cluster.recovery import RECOVERY_FILE, HeldCheckpoints
from rlserve.cluster.resources import free_resources_note, unready_actor_note
from rlserve.processes.restarts import Failure, RestartPolicy
from rlserve.server.learner_link import RESTART_DELAYS, LearnerLink

__all__ = ["LearnerActorSlot", "RayLearnerLink"]

logger = logging.getLogger("rlserve.server")

PLACEMENT_WARN_S = 30.0
"""How long a new learner actor may wait for Ray to place it before the log says why it waits."""


def _available(through: int | None) -> dict[str, Any]:
    """The message that tells the learner the log's records through ``through`` are shipped."""
    return {"type": "available", "through": through}


class RayLearnerLink(LearnerLink):
    """A :class:`LearnerLink` whose learner is a Ray actor (the arguments are the link's).

    Args:
        placement: The resources the learner actor holds (where it lands).

    Raises:
        ConfigError: Ray is not installed, or no node has the resources.
    """

    def __init__(
        self, *args: Any, placement: LearnerPlacement | None = None, **kwargs: Any
    ) -> None:
        self._ray = import_ray("--ray")
        self._placement = placement or LearnerPlacement()
        self._placement.check(self._ray)
        self._actor: Any = None
        self._outgoing: list[dict[str, Any]] = []
        self._announced = 0
        self._shipped_through: int | None = None
        """The position through which the learner has the records (None: not known yet)."""
        self._node: str | None = None
        super().__init__(*args, **kwargs)
        self._shipper = LogShipper(self.log.directory)
        self._points = HeldCheckpoints(self._policy_ids, self.log.directory.parent / RECOVERY_FILE)

    def _supervisor_of_learner(self) -> LearnerActorSlot:
        return LearnerActorSlot(self._ray, self._placement)

    def _setup_now(self) -> dict[str, Any]:
        return {**super()._setup_now(), "recovery": self._points.load()}

    async def _hold_checkpoint(self, message: dict[str, Any]) -> dict[str, Any]:
        """Hold a newer recovery point made of a ``checkpointed`` message's files.

        Returns:
            The message to pass on: it lets the log be cleaned only through what the held
            point's checkpoints have trained.
        """
        files = message.get("files")
        message = {k: v for k, v in message.items() if k != "files"}
        point = None
        if files is not None:
            point = self._points.checkpointed(
                str(message["policy_id"]), files, int(message.get("version", 0))
            )
        if point is not None:
            loop = asyncio.get_running_loop()
            try:
                await loop.run_in_executor(None, self._points.hold, point)
                self._stats.storage_ok("learner recovery point")
            except OSError as exc:
                self._stats.storage_failed("learner recovery point", exc)
        needed = min(int(message["log_needed_after"]), self._points.log_needed_after)
        return {**message, "log_needed_after": needed}

    @property
    def pid(self) -> int | None:
        """The learner actor's process id (on its node; None until it is ready)."""
        return self._children.pid

    @property
    def node(self) -> str | None:
        """The address of the learner actor's node (None until it is ready)."""
        return self._node

    def _connected(self) -> bool:
        return self._actor is not None

    def _close_channel(self) -> None:
        """Nothing: the exchange loop ends when the learner does, and the actor is killed."""

    def _send(self, message: dict[str, Any]) -> None:
        if self._actor is None:
            return
        if message["type"] == "available":
            # Announced by the exchange that ships the records (never ahead of them). Before its
            # ``ready`` (where it reads from) the learner is sent nothing; the answer announces.
            if self._shipped_through is not None:
                self._announced = max(self._announced, int(message["through"]))
            return
        self._outgoing.append(message)

    async def _dispatch(self, message: dict[str, Any]) -> None:
        if message["type"] == "checkpointed":
            message = await self._hold_checkpoint(message)
        elif message["type"] == "ready":
            self._shipped_through = int(message.get("position", 0))
            self._announced = self._shipped_through
            self._children.pid = message.get("pid")
            logger.info(
                "rlserve: the learner actor is ready on %s (device %s, reads from seq %d)",
                self._children.node or "its node",
                message.get("device"),
                self._shipped_through,
            )
        await super()._dispatch(message)

    def _take_records(self) -> list[Shipped]:
        """The logged records the learner was told of and does not have yet (some of them)."""
        if self._shipped_through is None:
            return []
        shipped, self._shipped_through = self._shipper.take(self._shipped_through, self._announced)
        return shipped

    async def _run_learner(self) -> None:
        actor = self._actor = self._children.start(self._setup_now())
        self._shipped_through, self._announced, self._outgoing = None, 0, []
        watch = asyncio.create_task(self._warn_while_unplaced())
        try:
            while True:
                before = self._shipped_through
                records = self._take_records()
                through = self._shipped_through
                announce: list[dict[str, Any]] = (
                    [_available(through)] if through not in (None, before) else []
                )
                exchange = {"messages": [*announce, *self._outgoing], "records": records}
                self._outgoing = []
                answer = await asyncio.wrap_future(actor.handle.remote(exchange).future())
                for message in answer["messages"]:
                    await self._dispatch(message)
                if self._node is None:
                    self._node = self._children.node
                if not answer["running"]:
                    break
        except Exception as exc:  # Ray's error for a lost actor or node
            self.failure = f"the learner actor died: {actor_failure(exc)}"
        finally:
            watch.cancel()
            self._actor = None
            self._shipped_through = None
            self._outgoing = []
            self._waiting_budget = 0  # nothing more is handed to a learner that is gone
            if self._pace is not None:
                self._pace.update(connected=False)
            self.checkpoints.final_in.set()  # nobody may wait for a checkpoint that cannot come

    async def _warn_while_unplaced(self) -> None:
        """Log, every so often, why a learner actor that has not said ``ready`` waits.

        Ray queues an actor whose resources are all held (by another job, or by an actor of
        a lost driver not yet released) without a word; the serving process says so. An actor
        that has greeted is placed: it is loading (checkpoints, the log), which a loaded
        machine slows, and the warning says that instead.
        """
        waited = 0.0
        while self._shipped_through is None:
            await asyncio.sleep(PLACEMENT_WARN_S)
            waited += PLACEMENT_WARN_S
            if self._shipped_through is not None:
                return
            node, need, free = self._children.node, self._placement.need(), ""
            if node is None:
                try:
                    free = await asyncio.to_thread(free_resources_note, self._ray, need)
                except Exception as exc:  # the cluster's state is only for the message
                    free = f"the cluster's free resources are unknown: {exc}"
            note = unready_actor_note("the learner actor", waited, node, need, free)
            logger.warning("rlserve: %s. Serving goes on meanwhile", note)

    async def stop(self, timeout: float = 6.0) -> dict[str, str]:
        """As the process link's; the log reader is closed too."""
        try:
            return await super().stop(timeout)
        finally:
            self._shipper.close()


class LearnerActorSlot:
    """Starts, kills and restarts the one learner actor (the process supervisor's calls)."""

    def __init__(self, ray: Any, placement: LearnerPlacement) -> None:
        self._ray = ray
        self._placement = placement
        self._actor: Any = None
        self.pid: int | None = None
        self.node: str | None = None
        self.policy = RestartPolicy(None)  # serving goes on without a learner: never given up

    def start(self, setup: dict[str, Any]) -> Any:
        """Create the learner actor where its resources are; its handle."""
        self._actor = self._create(setup)
        self.pid, self.node = None, None
        self._actor.greet.remote().future().add_done_callback(self._greeted)
        return self._actor

    def _create(self, setup: dict[str, Any]) -> Any:
        """A new learner actor with ``setup``."""
        options = self._placement.options()
        return actor_class(self._ray).options(**options).remote(LearnerActorWorker, (setup,))

    def _greeted(self, future: Any) -> None:
        with contextlib.suppress(Exception):
            self.node = str(future.result()["node"])

    def reap(self, slot: int, grace_s: float) -> str:
        """Kill the actor (Ray ends it at once); why it ended."""
        self._kill()
        return "the learner actor ended"

    def succeeded(self, slot: int) -> None:
        """It ran long enough: its failures in a row start again."""
        self.policy.succeeded(slot)

    def fail(
        self, slot: int, failure: Failure, during: str, note: Callable[[], str] | None = None
    ) -> None:
        """Count a failure, kill the actor, log it."""
        self.policy.failed(slot)
        self._kill()
        logger.error(
            "rlserve: the learner actor failed during %s: %s; restarting %s",
            during,
            failure.reason,
            "it" if note is None else note(),
        )

    def restart_delay(self, slot: int) -> float:
        """Seconds before the next start, backing off by failures in a row."""
        in_a_row = self.policy.in_a_row(slot)
        return RESTART_DELAYS[min(in_a_row, len(RESTART_DELAYS)) - 1] if in_a_row else 0.0

    def _kill(self) -> None:
        if self._actor is not None:
            with contextlib.suppress(Exception):
                self._ray.kill(self._actor, no_restart=True)
        self._actor = None
