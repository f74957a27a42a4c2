"""The Ray actor around one supervised worker: its calls, and the age of its progress stamp."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["Worker", "WorkerActor", "actor_class"]


class Worker(Protocol):
    """What runs inside a supervised actor: made from the arguments of ``start``, then called.

    :class:`~rlserve.algorithm.runner_process.RunnerWorker` (an env runner) is one; an env
    copy, a learner or a serving front-end as an actor would be others.
    """

    greeting: Any
    """The first answer, once made (e.g. ``{"type": "ready"}``); judged like any answer."""

    @property
    def stamp(self) -> Any:
        """An object whose ``value`` is :func:`time.monotonic` of the worker's last progress."""
        ...

    def handle(self, message: Any) -> Any:
        """The answer to one message; never raises (a failure is an answer)."""
        ...

    def close(self) -> None:
        """Release what it holds."""
        ...


class WorkerActor:
    """The actor around one worker (made a Ray actor class by :func:`actor_class`)."""

    def __init__(self, factory: Callable[..., Worker], args: tuple[Any, ...]) -> None:
        self._worker = factory(*args)
        # Calls to the worker one at a time even if a caller abandoned one (Ctrl-C) and sent
        # the next: the second thread is for age() only.
        self._lock = threading.Lock()

    def greet(self) -> dict[str, Any]:
        """The worker's first answer, with where it runs."""
        import ray

        return {
            "greeting": self._worker.greeting,
            "pid": os.getpid(),
            "node": ray.util.get_node_ip_address(),
        }

    def handle(self, message: Any) -> Any:
        """The worker's answer to ``message``."""
        with self._lock:
            return self._worker.handle(message)

    def age(self) -> float:
        """Seconds since the worker's last progress."""
        return time.monotonic() - float(self._worker.stamp.value)

    def close(self) -> None:
        """Let the worker release what it holds (after the call in progress, if any)."""
        with self._lock:
            self._worker.close()


_ACTOR_CLASS: Any = None


def actor_class(ray: Any) -> Any:
    """:class:`WorkerActor` as a Ray actor class, made once.

    It runs two threads (a call and :meth:`~WorkerActor.age`) and Ray never restarts it: the
    supervisor does, counting what was lost.
    """
    global _ACTOR_CLASS
    if _ACTOR_CLASS is None:
        _ACTOR_CLASS = ray.remote(max_restarts=0, max_concurrency=2)(WorkerActor)
    return _ACTOR_CLASS
