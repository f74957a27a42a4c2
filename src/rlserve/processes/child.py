"""What a supervised child process does first: detach from its parent's signals and pipes.

A child ignores SIGINT (the parent handles Ctrl-C), closes the parent's ends of the pipes it
inherited through ``fork`` (so every child sees EOF when the parent dies) and exits soon after
its parent goes away, even while it hangs in a step. So no child outlives the trainer.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection

__all__ = ["enter_child", "watch_parent"]

_PARENT_CHECK_S = 0.5
"""How often a child checks that its parent process is still there."""


def watch_parent() -> None:
    """Exit this (child) process soon after its parent process goes away.

    EOF on a command pipe only shows while the child waits for a command; this daemon thread
    also catches a parent that died while the child hangs in a step.
    """
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(_PARENT_CHECK_S)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, name="rlserve-parent-watch", daemon=True).start()


def enter_child(inherited: Sequence[Connection]) -> None:
    """Begin a supervised child: ignore SIGINT, close the ``inherited`` pipes, watch the parent.

    Args:
        inherited: The parent's ends of this child's and the other children's pipes, which a
            forked child holds copies of (empty with ``spawn``).
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for other in inherited:
        other.close()
    watch_parent()
