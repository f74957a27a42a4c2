"""Shipping at interpreter exit: local-inference clients that were never closed.

A script that logs its episodes and simply ends (no ``close()``, no ``with``) would otherwise
lose what its shipper thread still holds: the last second of steps, often dozens of episodes.
Every :class:`~rlserve.client.local.LocalInference` is tracked here through a weak reference
(tracking never keeps a client alive) until it is closed; one :mod:`atexit` handler closes the
ones left open, within :data:`EXIT_FLUSH_TIMEOUT` seconds for all of them together, and each
logs a warning naming what it could not deliver and why.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import weakref
from typing import Protocol

logger = logging.getLogger("rlserve.client")

EXIT_FLUSH_TIMEOUT = 10.0
"""Seconds the interpreter's exit waits, for all unclosed local-inference clients together, for
the server to take what they hold; what is left then is named in a warning and lost."""


class ClosesAtExit(Protocol):
    """A client engine that can ship what it holds and stop, within a time limit."""

    def close_at_exit(self, timeout: float) -> None:
        """Ship what is held for up to ``timeout`` seconds, then stop; warn about the rest."""
        ...


_open: weakref.WeakSet[ClosesAtExit] = weakref.WeakSet()
_lock = threading.Lock()
_registered = False


def _forget_all_in_child() -> None:
    # A forked child holds copies of its parent's clients, whose threads and sockets are the
    # parent's: flushing them at the child's exit would wait for threads that do not exist
    # there and shut down the parent's connections. The child's own clients are tracked anew.
    global _lock
    _lock = threading.Lock()  # it may have been held by another thread at the fork
    _open.clear()


os.register_at_fork(after_in_child=_forget_all_in_child)


def track_unclosed(engine: ClosesAtExit) -> None:
    """Close ``engine`` at interpreter exit unless :func:`forget_closed` is called first."""
    global _registered
    with _lock:
        if not _registered:
            atexit.register(_close_open)
            _registered = True
        _open.add(engine)


def forget_closed(engine: ClosesAtExit) -> None:
    """Stop tracking ``engine`` (it was closed)."""
    with _lock:
        _open.discard(engine)


def _close_open() -> None:
    deadline = time.monotonic() + EXIT_FLUSH_TIMEOUT
    with _lock:
        engines = list(_open)
    for engine in engines:
        try:
            engine.close_at_exit(max(0.0, deadline - time.monotonic()))
        except Exception:  # one client's failure must not keep the others from shipping
            logger.exception("rlserve: closing a client at exit failed")
