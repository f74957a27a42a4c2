"""The restart policy every child supervisor shares, and why a child died.

A supervised child that fails (raises, exits, is killed, hangs) is restarted; one that fails
``max_restarts + 1`` times in a row without a success is given up. :class:`RestartPolicy`
keeps that count per child and the lifetime counters; what a failure and a success are, and
what giving up does, is the supervisor's business (:mod:`~rlserve.processes.supervisor` raises
``RuntimeError``; the learner link never gives up and backs off by the count instead).
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Any

__all__ = ["Failure", "RestartPolicy", "death_reason", "exit_reason"]


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
