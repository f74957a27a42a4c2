"""The learner process of ``rlserve serve``: started as a fresh interpreter, waited for.

:class:`~rlserve.server.learner_link.LearnerLink` supervises it (restarts, back-off, the
socket's messages); this module only starts and joins the process.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys


def start_learner_process(sock: socket.socket) -> subprocess.Popen[bytes]:
    """Start ``python -m rlserve.training.learner_worker`` on its end of the socket pair.

    A fresh interpreter, not ``multiprocessing``: its spawn re-imports the user's main script in
    the child (a script without ``if __name__ == "__main__":`` would start a second server), and
    it pickles the arguments. The child gets this process's import path, so it imports the same
    rlserve; its setup comes as the first message on the socket.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return subprocess.Popen(
        [sys.executable, "-m", "rlserve.training.learner_worker", str(sock.fileno())],
        pass_fds=(sock.fileno(),),
        env=env,
    )


def wait_for_exit(process: subprocess.Popen[bytes], timeout: float) -> None:
    """Wait up to ``timeout`` seconds for ``process`` to exit (it may still run after)."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout)
