"""Supervised workers as Ray actors: the Ray twin of the process supervisor.

:class:`RaySupervisor` has the :class:`~rlserve.processes.supervisor.ProcessSupervisor`'s
interface and restart policy, so a group written against one runs on the other (the env runners
of :class:`~rlserve.algorithm.runner_group.RunnerGroup` do). Worker ``slot`` is an actor that
makes ``factory(*args)`` where Ray places it (by the resources asked for) and answers each
message with ``worker.handle(message)``; its first answer is ``worker.greeting``.

* A message for several actors is ``ray.put`` once and its reference handed to each, so it
  crosses the network once per node, not once per actor (the weights of a new version).
* An actor whose node is lost, or that is killed, shows as a
  :class:`~rlserve.processes.restarts.Failure` in place of its answer (Ray's
  ``RayActorError``); a failed actor is killed (``ray.kill``) and started again anywhere the
  resources allow.
* Hang detection: a worker stamps ``worker.stamp.value`` (``time.monotonic``) as it makes
  progress. The actor runs two threads, so the supervisor can ask for the stamp's age while a
  call is in progress; it moves the parent's :class:`Stamp` of the slot forward by it (ages,
  not clock readings, since clocks of different nodes do not agree) and the ``stalled`` check
  of :meth:`RaySupervisor.gather` reads the parent's stamps as it does for processes.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlserve.cluster.actor import Worker, actor_class
from rlserve.cluster.failures import actor_failure
from rlserve.cluster.ray_import import import_ray
from rlserve.cluster.resources import check_resources
from rlserve.processes.restarts import Failure, Restarting
from rlserve.processes.supervisor import KEEP_WAITING, Judge, Stalled

__all__ = ["RaySupervisor", "Stamp"]

_CHECK_S = 0.2
"""How often :meth:`RaySupervisor.gather` looks for finished calls and stalls."""

_AGE_EVERY_S = 1.0
"""How often it asks a busy actor for the age of its stamp."""


@dataclass
class Stamp:
    """:func:`time.monotonic` of a worker's last progress, as the parent knows it."""

    value: float = 0.0


@dataclass
class _Slot:
    label: str
    actor: Any = None
    pending: Any = None
    """The reference of the call whose answer is awaited."""
    greeting: bool = False
    """Whether :attr:`pending` is the greeting (the answer to ``greet``)."""
    age: Any = None
    asked: float = 0.0
    pid: int | None = None
    node: str | None = None


class RaySupervisor(Restarting):
    """Workers as Ray actors, each with the resources given, restarted when they fail.

    Args:
        labels: What each worker is, for errors ("env CartPole-v1 in env runner 2").
        factory: Makes a :class:`~rlserve.cluster.actor.Worker` in its actor from
            :meth:`start`'s arguments (importable by name on every node).
        what: What a worker is ("runner actor"), for failures.
        logger: Where restarts are logged.
        restart_note: What a restart log line says is restarted.
        success: The successful call that resets a worker's failures in a row ("sample").
        stamps: The parent's stamp of each worker (read by ``stalled``).
        num_cpus: CPUs each actor holds.
        resources: Custom resources each actor holds.
        max_restarts: Restarts in a row of one worker, without a success, before giving up.
        close_wait_s: How long :meth:`stop` waits for the actors to close their workers.
        placed: What the resources are asked for by ("env runner": the settings
            ``num_cpus_per_env_runner``...), for the error naming a resource no node has.

    Raises:
        ConfigError: Ray is not installed, or no node has the resources asked for.
    """

    def __init__(
        self,
        labels: Sequence[str],
        factory: Callable[..., Worker],
        *,
        what: str,
        logger: logging.Logger,
        restart_note: str,
        success: str,
        stamps: Sequence[Stamp],
        num_cpus: float = 1.0,
        resources: Mapping[str, float] | None = None,
        max_restarts: int | None = 3,
        close_wait_s: float = 2.0,
        placed: str = "env runner",
    ) -> None:
        self._ray = import_ray()
        self._resources = dict(resources or {})
        check_resources(self._ray, {"CPU": num_cpus, **self._resources}, placed)
        self._num_cpus = num_cpus
        self._slots = [_Slot(label) for label in labels]
        self._factory = factory
        self._what = what
        self._stamps = list(stamps)
        self._close_wait_s = close_wait_s
        super().__init__(logger, restart_note, success, max_restarts)

    @property
    def size(self) -> int:
        """How many workers."""
        return len(self._slots)

    @property
    def num_alive(self) -> int:
        """Workers whose actor is running (not killed)."""
        return sum(1 for s in self._slots if s.actor is not None)

    @property
    def pids(self) -> list[int | None]:
        """Each actor's process id on its node, by slot (None: not running or not greeted)."""
        return [s.pid if s.actor is not None else None for s in self._slots]

    @property
    def nodes(self) -> list[str | None]:
        """The address of each actor's node, by slot (None: not running or not greeted)."""
        return [s.node if s.actor is not None else None for s in self._slots]

    @property
    def actors(self) -> list[Any]:
        """Each worker's actor handle, by slot (None: not running)."""
        return [s.actor for s in self._slots]

    def start(self, slot: int, *args: Any) -> None:
        """Create worker ``slot``'s actor (anywhere its resources are free) with ``args``."""
        s = self._slots[slot]
        options: dict[str, Any] = {"num_cpus": self._num_cpus}
        if self._resources:
            options["resources"] = self._resources
        s.actor = actor_class(self._ray).options(**options).remote(self._factory, args)
        s.pending, s.greeting, s.age, s.pid, s.node = s.actor.greet.remote(), True, None, None, None

    def send(self, slot: int, message: Any) -> Failure | None:
        """Call worker ``slot`` with ``message``; a failure when it is not running."""
        return self.send_all(message, [slot]).get(slot)

    def send_all(self, message: Any, slots: Iterable[int]) -> dict[int, Failure]:
        """Call every worker in ``slots`` with one ``message``, put in the object store once."""
        ref = self._ray.put(message)
        failures = {}
        for slot in slots:
            s = self._slots[slot]
            if s.actor is None:
                failures[slot] = Failure(f"{self._what} is not running")
                continue
            s.pending, s.greeting = s.actor.handle.remote(ref), False
        return failures

    def gather(
        self,
        slots: Iterable[int],
        timeout: float | None,
        judge: Judge,
        stalled: Stalled | None = None,
    ) -> dict[int, Any]:
        """Each running worker's answer by slot: what ``judge`` makes of it, or a failure.

        A worker fails when its actor dies (its node lost, killed), it has not answered within
        ``timeout`` seconds (None: no deadline), or ``stalled`` says it hangs.
        """
        ray = self._ray
        answers: dict[int, Any] = {}
        pending = {
            s.pending: slot for slot in slots if (s := self._slots[slot]).pending is not None
        }
        deadline = None if timeout is None else time.monotonic() + timeout
        while pending:
            wait_s = _CHECK_S
            if deadline is not None:
                wait_s = min(wait_s, max(0.0, deadline - time.monotonic()))
            done, _ = ray.wait(list(pending), num_returns=len(pending), timeout=wait_s)
            for ref in done:
                slot = pending.pop(ref)
                answers[slot] = self._answer(slot, ref, judge)
            now = time.monotonic()
            for ref, slot in list(pending.items()):
                if deadline is not None and now >= deadline:
                    limit: str | None = f"did not answer within {timeout:g} s"
                else:
                    self._refresh_stamp(slot, now)
                    limit = None if stalled is None else stalled(slot, now)
                if limit is not None:
                    del pending[ref]
                    self._slots[slot].pending = None
                    answers[slot] = Failure(f"{self._what} {limit} and was killed")
        return answers

    def _answer(self, slot: int, ref: Any, judge: Judge) -> Any:
        s = self._slots[slot]
        s.pending = None
        try:
            value = self._ray.get(ref)
        except Exception as exc:
            return Failure(f"{self._what} died: {actor_failure(exc)}")
        if s.greeting:
            s.pid, s.node, value = value["pid"], value["node"], value["greeting"]
        answer = judge(slot, value)
        if answer is KEEP_WAITING:  # each call has its own reference: never an old answer
            return Failure(f"{self._what} answered a call no longer awaited")
        return answer

    def _refresh_stamp(self, slot: int, now: float) -> None:
        """Move the parent's stamp of a busy worker forward by the age its actor reports."""
        s = self._slots[slot]
        if s.actor is None or slot >= len(self._stamps):
            return
        if s.age is not None:
            ready, _ = self._ray.wait([s.age], timeout=0)
            if ready:
                with contextlib.suppress(Exception):
                    age = float(self._ray.get(s.age))
                    self._stamps[slot].value = max(self._stamps[slot].value, s.asked - age)
                s.age = None
        if s.age is None and now - s.asked >= _AGE_EVERY_S:
            s.age, s.asked = s.actor.age.remote(), now

    def reap(self, slot: int, grace_s: float) -> str:
        """Kill worker ``slot``'s actor (Ray ends it at once); why it ended."""
        self._kill(slot)
        return f"{self._what} was killed"

    def restart_delay(self, slot: int) -> float:
        """No back-off: a restarted actor may land on another node."""
        return 0.0

    def _label(self, slot: int) -> str:
        return self._slots[slot].label

    def _kill(self, slot: int) -> None:
        s = self._slots[slot]
        if s.actor is not None:
            with contextlib.suppress(Exception):
                self._ray.kill(s.actor, no_restart=True)
        s.actor, s.pending, s.age = None, None, None

    def stop(self) -> None:
        """Let every actor close its worker, then kill them all (idempotent).

        An actor that does not close within ``close_wait_s`` (a hung step) is killed anyway.
        """
        closing = []
        for s in self._slots:
            if s.actor is not None:
                with contextlib.suppress(Exception):
                    closing.append(s.actor.close.remote())
        if closing:
            with contextlib.suppress(Exception):
                self._ray.wait(closing, num_returns=len(closing), timeout=self._close_wait_s)
        for slot in range(len(self._slots)):
            self._kill(slot)
