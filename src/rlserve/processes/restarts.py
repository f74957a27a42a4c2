"""The restart policy every child supervisor shares, and why a child died.

A supervised child that fails (raises, exits, is killed, hangs) is restarted; one that fails
``max_restarts + 1`` times in a row without a success is given up. :class:`RestartPolicy`
keeps that count per child and the lifetime counters; what a failure and a success are, and
what giving up does, is the supervisor's business (:mod:`~rlserve.processes.supervisor` raises
``RuntimeError``; the learner link never gives up and backs off by the count instead).
"""

from __future__ import annotations

import logging
import signal
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Failure", "RestartPolicy", "Restarting", "death_reason", "exit_reason"]


@dataclass
class Failure:
    """Why a child gave no usable answer.

    Attributes:
        reason: One line, for logs and errors.
        details: More lines (a traceback), or empty.
    """

    reason: str
    details: str = ""

    @property
    def details_suffix(self) -> str:
        """The details on a line of their own, or nothing when there are none."""
        return f"\n{self.details}" if self.details else ""


class RestartPolicy:
    """Failures in a row per child, and when to give a child up.

    Args:
        max_restarts: Restarts in a row of one child, without a success, after which it is
            given up; None: never given up.

    Attributes:
        restarts: Children restarted, lifetime (counted by :meth:`restarting`).
        failures: Failures, lifetime (counted by :meth:`failed`).
    """

    def __init__(self, max_restarts: int | None = 3) -> None:
        self.max_restarts = max_restarts
        self.restarts = 0
        self.failures = 0
        self._in_a_row: dict[int, int] = {}

    def in_a_row(self, slot: int = 0) -> int:
        """Failures of child ``slot`` since its last success."""
        return self._in_a_row.get(slot, 0)

    def failed(self, slot: int = 0) -> bool:
        """Count a failure of child ``slot``; whether it is now to be given up."""
        self.failures += 1
        self._in_a_row[slot] = self.in_a_row(slot) + 1
        return self.max_restarts is not None and self._in_a_row[slot] > self.max_restarts

    def succeeded(self, slot: int = 0) -> None:
        """Child ``slot`` did its work: its failures in a row start again from 0."""
        self._in_a_row.pop(slot, None)

    def restarting(self) -> None:
        """Count a restart (a failed restart counts too)."""
        self.restarts += 1


class Restarting(ABC):
    """What every supervisor of a group does with failures: count, log, restart or give up.

    A subclass (:class:`~rlserve.processes.supervisor.ProcessSupervisor`, the Ray actors'
    :class:`~rlserve.cluster.supervisor.RaySupervisor`) says how a member is named and killed.

    Args:
        logger: Where failures are logged (one line each).
        restart_note: What the log line says is restarted ("its sub-process").
        success: What a member does that resets its failures in a row ("step").
        max_restarts: Restarts in a row of one member, without a success, before giving up
            (None: never given up).
        log_level: The level failures are logged at.
    """

    def __init__(
        self,
        logger: logging.Logger,
        restart_note: str,
        success: str,
        max_restarts: int | None,
        log_level: int = logging.WARNING,
    ) -> None:
        self._logger = logger
        self._restart_note = restart_note
        self._success = success
        self._log_level = log_level
        self.policy = RestartPolicy(max_restarts)
        """The restart policy: failures in a row per member, lifetime counters."""

    @abstractmethod
    def _label(self, slot: int) -> str:
        """How errors and logs name member ``slot``."""

    @abstractmethod
    def _kill(self, slot: int) -> None:
        """Make sure member ``slot`` is not running."""

    @property
    def restarts(self) -> int:
        """Members restarted, lifetime (a failed restart counts too)."""
        return self.policy.restarts

    @property
    def failures(self) -> int:
        """Member failures, lifetime."""
        return self.policy.failures

    def succeeded(self, slot: int) -> None:
        """Member ``slot`` did its work: its failures in a row start again."""
        self.policy.succeeded(slot)

    def fail(
        self,
        slot: int,
        failure: Failure,
        during: str,
        note: Callable[[], str] | None = None,
    ) -> None:
        """Count a failure, kill the member, log it.

        ``note`` says what the log line says is restarted, asked after the failure is counted
        (so it may name a restart delay); None: ``restart_note``.

        Raises:
            RuntimeError: The member failed ``max_restarts + 1`` times in a row: given up.
        """
        given_up = self.policy.failed(slot)
        self._kill(slot)
        label = self._label(slot)
        if given_up:
            raise RuntimeError(
                f"{label} failed {self.policy.in_a_row(slot)} times in a row without a "
                f"successful {self._success}; last error during {during}: {failure.reason}"
                + failure.details_suffix
            )
        self._logger.log(
            self._log_level,
            "%s failed during %s: %s; restarting %s%s",
            label,
            during,
            failure.reason,
            self._restart_note if note is None else note(),
            failure.details_suffix,
        )

    def restart(self, slot: int, bring_up: Callable[[], Any]) -> Any:
        """Call ``bring_up`` until it returns no failure, failing the member after each that does.

        Args:
            slot: The member, killed.
            bring_up: Starts the member and awaits it (its first answer): that, or a failure.

        Returns:
            What ``bring_up`` returned.

        Raises:
            RuntimeError: The member is given up (see :meth:`fail`).
        """
        while True:
            self.policy.restarting()
            answer = bring_up()
            if not isinstance(answer, Failure):
                return answer
            self.fail(slot, answer, "restart")


def exit_reason(code: int | None, what: str) -> str:
    """Why a child named ``what`` ended, from its exit code (None: it has not ended)."""
    if code is not None and code < 0:
        try:
            return f"{what} was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"{what} was killed by signal {-code}"
    if code is not None:
        return f"{what} exited with code {code}"
    return f"{what} closed its pipe"


def death_reason(process: Any, what: str) -> str:
    """Why a child ``process`` (a ``multiprocessing`` process, named ``what``) stopped answering.

    Waits up to a second for it to end: killed by a signal, exited with a code, or (still
    running, or never started) it closed its pipe.
    """
    if process is None:
        return exit_reason(None, what)
    process.join(timeout=1.0)
    return exit_reason(process.exitcode, what)
