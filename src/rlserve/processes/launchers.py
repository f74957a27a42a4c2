"""How the supervisor starts a child: forked with a pipe, or a fresh interpreter on a socket.

:class:`~rlserve.processes.supervisor.ProcessSupervisor` starts every child through a
:class:`Launcher`, which returns the child's process handle and the parent's end of the channel
to it. Env sub-processes and env-runner processes are forked (:class:`ForkLauncher`: the target
is inherited, never pickled); the learner process of ``rlserve serve`` is a fresh interpreter
(:class:`InterpreterLauncher`), talked to over a socket with asyncio. A Ray actor backend would
be a third launcher whose handle kills and waits on the actor.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext
from typing import Any, Protocol

__all__ = ["ChildProcess", "ForkLauncher", "InterpreterLauncher", "InterpreterProcess", "Launcher"]


class ChildProcess(Protocol):
    """What the supervisor needs of a running child (``multiprocessing.Process``'s names)."""

    @property
    def pid(self) -> int | None:
        """The process id."""
        ...

    @property
    def exitcode(self) -> int | None:
        """The exit code (negative: killed by that signal), None while it runs."""
        ...

    def is_alive(self) -> bool:
        """Whether it still runs."""
        ...

    def kill(self) -> None:
        """Kill it (SIGKILL)."""
        ...

    def join(self, timeout: float | None = None) -> None:
        """Wait up to ``timeout`` seconds for it to end (it may still run after)."""
        ...


class Launcher(Protocol):
    """Starts one child and hands back its handle and the parent's end of its channel."""

    def launch(
        self, name: str, args: Sequence[Any], inherited: Sequence[Connection]
    ) -> tuple[ChildProcess, Any]:
        """Start child ``name`` with ``args``; ``inherited``: the parent's other pipe ends."""
        ...


class ForkLauncher:
    """A ``multiprocessing`` child (``fork`` by default) on a duplex pipe.

    The child runs ``target(conn, *args, inherited)``, ``inherited`` being the parent's pipe
    ends it holds through ``fork`` (see :func:`~rlserve.processes.child.enter_child`).

    Args:
        target: The child's body.
        context: The start method or context (default ``fork`` where there is one).
        daemon: Start children as daemons (a daemon cannot start processes of its own).
    """

    def __init__(
        self,
        target: Callable[..., None],
        context: str | BaseContext | None = None,
        daemon: bool = True,
    ) -> None:
        if isinstance(context, BaseContext):
            self._ctx: BaseContext = context
        else:
            import multiprocessing as mp

            default = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
            self._ctx = mp.get_context(context or default)
        self._target = target
        self._daemon = daemon

    def launch(
        self, name: str, args: Sequence[Any], inherited: Sequence[Connection]
    ) -> tuple[ChildProcess, Connection]:
        """Fork ``target`` on a new pipe; the parent keeps one end."""
        parent_conn, child_conn = self._ctx.Pipe(duplex=True)
        held = [parent_conn, *inherited] if self._ctx.get_start_method() == "fork" else []
        process = self._ctx.Process(  # type: ignore[attr-defined]
            target=self._target,
            args=(child_conn, *args, held),
            name=name,
            daemon=self._daemon,
        )
        process.start()
        child_conn.close()
        return process, parent_conn


class InterpreterProcess:
    """A ``subprocess.Popen`` child with the :class:`ChildProcess` names."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self.popen = popen

    @property
    def pid(self) -> int | None:
        """The process id."""
        return self.popen.pid

    @property
    def exitcode(self) -> int | None:
        """The exit code (negative: killed by that signal), None while it runs."""
        return self.popen.poll()

    def is_alive(self) -> bool:
        """Whether it still runs."""
        return self.popen.poll() is None

    def kill(self) -> None:
        """Kill it (SIGKILL)."""
        with contextlib.suppress(ProcessLookupError):
            self.popen.kill()

    def join(self, timeout: float | None = None) -> None:
        """Wait up to ``timeout`` seconds for it to end."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout)


class InterpreterLauncher:
    """``python -m <module> <fd>``: a fresh interpreter on its end of a socket pair.

    Not ``multiprocessing``: its spawn re-imports the user's main script in the child (a script
    without ``if __name__ == "__main__":`` would start a second server), and it pickles the
    arguments. The child gets this process's import path, so it imports the same rlserve; its
    setup comes as the first message on the socket (the launch ``args`` are not used).

    Args:
        module: The module the child runs (it reads its socket's file descriptor from argv).
    """

    def __init__(self, module: str) -> None:
        self.module = module

    def launch(
        self, name: str, args: Sequence[Any], inherited: Sequence[Connection]
    ) -> tuple[ChildProcess, socket.socket]:
        """Start the interpreter; the parent keeps one end of the socket pair."""
        parent, child = socket.socketpair()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        try:
            popen = subprocess.Popen(
                [sys.executable, "-m", self.module, str(child.fileno())],
                pass_fds=(child.fileno(),),
                env=env,
            )
        except BaseException:
            parent.close()
            raise
        finally:
            child.close()
        return InterpreterProcess(popen), parent
