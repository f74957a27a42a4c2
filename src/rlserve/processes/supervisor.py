"""The process supervisor: a group of child processes, started, messaged, watched and restarted.

:class:`ProcessSupervisor` owns what every group of child processes needs: starting a child
through a :class:`~rlserve.processes.launchers.Launcher` (forked on a duplex pipe by default,
the target inherited, never pickled; or a fresh interpreter on a socket), sending it a message
over a :class:`~rlserve.processes.wire.Wire` (encoded once for several children), gathering the
answers of several children with a deadline or a stall check (hang detection), telling why a
child died, killing and reaping it, and the restart policy
(:class:`~rlserve.processes.restarts.RestartPolicy`): a failed child is killed and restarted,
and one that fails ``max_restarts + 1`` times in a row without a success is given up with a
``RuntimeError`` naming it (or never, backing off between restarts). Its users keep only what is
theirs: what a child does, its messages (a ``judge`` turns each message into an answer or a
failure), and what a failure costs them (episodes lost). They are
:class:`~rlserve.env.subprocess.ProcessVectorSource` (env sub-processes),
:class:`~rlserve.algorithm.runner_group.RunnerGroup` (env-runner processes), and
:class:`~rlserve.server.learner_link.LearnerLink` (the learner process of ``rlserve serve``: a
fresh interpreter whose socket the link reads with asyncio instead of
:meth:`~ProcessSupervisor.gather`; the blocking :meth:`~ProcessSupervisor.reap` runs in an
executor there).

:class:`SupervisedGroup` is the interface such a user programs against, so another backend is
one new implementation of it. A Ray actor backend, say: :meth:`~SupervisedGroup.start` creates
actor ``slot`` from the arguments, :meth:`~SupervisedGroup.send` calls its method (keeping the
object ref), :meth:`~SupervisedGroup.gather` is ``ray.wait`` on the refs up to the deadline (an
``RayActorError`` is the death reason), :meth:`~SupervisedGroup.fail` is ``ray.kill`` plus the
same :class:`~rlserve.processes.restarts.RestartPolicy`, and :meth:`~SupervisedGroup.stop` kills
every actor (a Ray launcher would start the actor and hand back its handle).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.context import BaseContext
from typing import Any, Final, Protocol, runtime_checkable

from rlserve.errors import DecodeError
from rlserve.processes.launchers import ChildProcess, ForkLauncher, Launcher
from rlserve.processes.restarts import Failure, Restarting, death_reason, exit_reason
from rlserve.processes.wire import Wire

__all__ = ["KEEP_WAITING", "Judge", "ProcessSupervisor", "Stalled", "SupervisedGroup"]

KEEP_WAITING: Final = object()
"""What a :data:`Judge` returns for a message that is no answer (one to an abandoned call)."""

Judge = Callable[[int, Any], Any]
"""``judge(slot, message)``: the answer in a child's message, a ``Failure``, or
:data:`KEEP_WAITING`; it may raise (a ``ConfigError`` no restart mends)."""

Stalled = Callable[[int, float], "str | None"]
"""``stalled(slot, now)``: why a child that has not answered yet counts as hung ("did not step
within 5 s"), or None while it makes progress."""


@runtime_checkable
class SupervisedGroup(Protocol):
    """A group of supervised workers, addressed by slot ``0..size-1``.

    A worker answers each message it is sent with one message; a worker that fails (raises,
    dies, hangs, sends garbage) shows as a :class:`~rlserve.processes.restarts.Failure` in
    place of its answer, and its user hands it to :meth:`fail` then :meth:`restart`.
    """

    @property
    def size(self) -> int:
        """How many workers."""
        ...

    @property
    def restarts(self) -> int:
        """Workers restarted, lifetime (a failed restart counts too)."""
        ...

    @property
    def failures(self) -> int:
        """Worker failures, lifetime."""
        ...

    @property
    def num_alive(self) -> int:
        """Workers running now."""
        ...

    def start(self, slot: int, *args: Any) -> None:
        """Start worker ``slot`` (not running) with ``args`` for its target."""
        ...

    def send(self, slot: int, message: Any) -> Failure | None:
        """Send ``message`` to worker ``slot``; the failure when it cannot take it."""
        ...

    def send_all(self, message: Any, slots: Iterable[int]) -> dict[int, Failure]:
        """Send one ``message`` to every worker in ``slots``; the failures by slot."""
        ...

    def gather(
        self,
        slots: Iterable[int],
        timeout: float | None,
        judge: Judge,
        stalled: Stalled | None = None,
    ) -> dict[int, Any]:
        """Each worker's answer by slot, judged, or a failure (a worker past its deadline)."""
        ...

    def succeeded(self, slot: int) -> None:
        """Worker ``slot`` did its work: its failures in a row start again."""
        ...

    def fail(
        self,
        slot: int,
        failure: Failure,
        during: str,
        note: Callable[[], str] | None = None,
    ) -> None:
        """Count a failure and kill the worker; raise ``RuntimeError`` when it is given up."""
        ...

    def reap(self, slot: int, grace_s: float) -> str:
        """Wait up to ``grace_s`` for worker ``slot`` to end, kill it if not; why it ended."""
        ...

    def restart_delay(self, slot: int) -> float:
        """Seconds to wait before restarting worker ``slot`` (a back-off by failures in a row)."""
        ...

    def restart(self, slot: int, bring_up: Callable[[], Any]) -> Any:
        """Call ``bring_up`` (start the worker, await it) until it succeeds; its result."""
        ...

    def stop(self) -> None:
        """Ask every worker to exit, kill those that do not, and reap them all."""
        ...


@dataclass
class _Child:
    name: str
    label: str
    process: ChildProcess | None = None
    conn: Any = None  # the parent's end: a Connection (forked) or a socket (an interpreter)


class ProcessSupervisor(Restarting):
    """A :class:`SupervisedGroup` of child processes, each serving one channel.

    A forked child runs ``target(conn, *args, inherited)``: ``args`` are :meth:`start`'s,
    ``inherited`` the parent's pipe ends it holds through ``fork`` (see
    :func:`~rlserve.processes.child.enter_child`). It holds no reference to its user, so a
    user may close it from a finaliser.

    Args:
        names: One process name per child.
        labels: How errors and logs name each child ("env CartPole-v1 in env runner 1").
        target: The child's body (forked), or the launcher that starts each child.
        what: What a child is called in failure reasons ("runner process").
        wire: How messages cross the pipes (None: the user talks to its children itself).
        close_message: What asks a child to exit (sent by :meth:`stop` when there is a wire).
        logger: Where restarts are logged (one line each).
        restart_note: What the log line says is restarted ("its sub-process").
        success: What a child does that resets its failures in a row ("step").
        max_restarts: Restarts in a row of one child, without a success, before giving up
            (None: never given up).
        close_wait_s: How long :meth:`stop` waits for children to exit, and a kill to reap.
        context: The ``multiprocessing`` start method or context (default ``fork``).
        daemon: Start children as daemons (a daemon cannot start processes of its own).
        check_s: How often :meth:`gather` asks ``stalled`` while it waits.
        back_off: Seconds to wait before restarting a child, by its failures in a row
            (:meth:`restart_delay`; empty: at once).
        log_level: The level restarts are logged at.
    """

    def __init__(
        self,
        names: Sequence[str],
        labels: Sequence[str],
        target: Callable[..., None] | Launcher,
        *,
        what: str,
        wire: Wire | None,
        close_message: Any,
        logger: logging.Logger,
        restart_note: str,
        success: str,
        max_restarts: int | None = 3,
        close_wait_s: float = 2.0,
        context: str | BaseContext | None = None,
        daemon: bool = True,
        check_s: float = 0.2,
        back_off: Sequence[float] = (),
        log_level: int = logging.WARNING,
    ) -> None:
        self._children = [_Child(n, label) for n, label in zip(names, labels, strict=True)]
        self._launcher: Launcher = (
            ForkLauncher(target, context, daemon) if callable(target) else target
        )
        self._what = what
        self._wire = wire
        self._close_message = close_message
        self._close_wait_s = close_wait_s
        self._check_s = check_s
        self._back_off = tuple(back_off)
        super().__init__(logger, restart_note, success, max_restarts, log_level)

    @property
    def size(self) -> int:
        """How many children."""
        return len(self._children)

    @property
    def num_alive(self) -> int:
        """Children alive now."""
        return sum(1 for c in self._children if c.process is not None and c.process.is_alive())

    @property
    def pids(self) -> list[int | None]:
        """The children's process ids, by slot (None: not running)."""
        return [None if c.process is None else c.process.pid for c in self._children]

    def start(self, slot: int, *args: Any) -> None:
        """Start child ``slot`` (not running) on a new channel with ``args`` for its target."""
        child = self._children[slot]
        others = [
            c.conn for c in self._children if isinstance(c.conn, Connection) and c is not child
        ]
        child.process, child.conn = self._launcher.launch(child.name, args, others)

    def channel(self, slot: int) -> Any:
        """The parent's end of child ``slot``'s channel (None: not running)."""
        return self._children[slot].conn

    def send(self, slot: int, message: Any) -> Failure | None:
        """Send ``message`` to child ``slot``; the failure when it cannot take it."""
        return self._transmit(slot, self._messages().encode(message))

    def send_all(self, message: Any, slots: Iterable[int]) -> dict[int, Failure]:
        """Send one ``message`` (encoded once) to every child in ``slots``; the failures."""
        payload = self._messages().encode(message)
        failures = {}
        for slot in slots:
            failure = self._transmit(slot, payload)
            if failure is not None:
                failures[slot] = failure
        return failures

    def _transmit(self, slot: int, payload: Any) -> Failure | None:
        conn = self._children[slot].conn
        if conn is None:  # given up on after a RuntimeError
            return Failure(f"{self._what} is not running")
        try:
            self._messages().transmit(conn, payload)
        except (OSError, ValueError):
            return Failure(self._died(slot))
        return None

    def gather(
        self,
        slots: Iterable[int],
        timeout: float | None,
        judge: Judge,
        stalled: Stalled | None = None,
    ) -> dict[int, Any]:
        """Each running child's answer by slot: what ``judge`` makes of its message, or a failure.

        A child fails when its pipe closes, its message does not decode, it has not answered
        within ``timeout`` seconds (None: no deadline), or ``stalled`` says it hangs.
        """
        answers: dict[int, Any] = {}
        wire = self._messages()
        pending = {c.conn: s for s in slots if (c := self._children[s]).conn is not None}
        deadline = None if timeout is None else time.monotonic() + timeout
        while pending:
            wait_s = None if stalled is None else self._check_s
            if deadline is not None:
                remaining = max(0.0, deadline - time.monotonic())
                wait_s = remaining if wait_s is None else min(wait_s, remaining)
            for conn in wait(list(pending), timeout=wait_s):
                assert isinstance(conn, Connection)
                slot = pending.pop(conn)
                try:
                    message = wire.receive(conn)
                except (EOFError, OSError):
                    answers[slot] = Failure(self._died(slot))
                    continue
                except DecodeError as exc:
                    answers[slot] = Failure(f"sent a malformed message: {exc}")
                    continue
                answer = judge(slot, message)
                if answer is KEEP_WAITING:
                    pending[conn] = slot
                else:
                    answers[slot] = answer
            now = time.monotonic()
            for conn, slot in list(pending.items()):
                if deadline is not None and now >= deadline:
                    limit: str | None = f"did not answer within {timeout:g} s"
                else:
                    limit = None if stalled is None else stalled(slot, now)
                if limit is not None:
                    del pending[conn]
                    answers[slot] = Failure(f"{self._what} {limit} and was killed")
        return answers

    def _messages(self) -> Wire:
        if self._wire is None:
            raise RuntimeError(f"a {self._what}'s user talks to it itself: it has no wire")
        return self._wire

    def restart_delay(self, slot: int) -> float:
        """Seconds to wait before restarting child ``slot``, by its failures in a row."""
        if not self._back_off or not self.policy.in_a_row(slot):
            return 0.0
        return self._back_off[min(self.policy.in_a_row(slot), len(self._back_off)) - 1]

    def reap(self, slot: int, grace_s: float) -> str:
        """Wait up to ``grace_s`` seconds for child ``slot`` to end, kill it if it does not.

        Returns:
            Why it ended (its exit code or signal; "closed its pipe" when it had to be killed).
        """
        process = self._children[slot].process
        if process is not None:
            process.join(grace_s)
        reason = exit_reason(None if process is None else process.exitcode, self._what)
        self._kill(slot)
        return reason

    def _died(self, slot: int) -> str:
        return death_reason(self._children[slot].process, self._what)

    def _label(self, slot: int) -> str:
        return self._children[slot].label

    def _kill(self, slot: int) -> None:
        child = self._children[slot]
        if child.process is not None:
            if child.process.is_alive():
                child.process.kill()
            child.process.join(timeout=self._close_wait_s)
        if child.conn is not None:
            child.conn.close()
        child.process, child.conn = None, None

    def stop(self) -> None:
        """Ask every child to exit, kill those that do not, and reap them all."""
        if self._wire is not None:
            payload = self._wire.encode(self._close_message)
            for child in self._children:
                if child.conn is not None:
                    with contextlib.suppress(OSError, ValueError):
                        self._wire.transmit(child.conn, payload)
        deadline = time.monotonic() + self._close_wait_s
        for slot, child in enumerate(self._children):
            if child.process is not None:
                child.process.join(timeout=max(0.0, deadline - time.monotonic()))
            self._kill(slot)
