"""One process writes a run folder at a time: an exclusive OS lock on ``<run>/run.lock``.

Two servers on one folder would both write ``ckpt_0000000.pt``, and the one that stops first
marks ``endpoints.json`` stopped while the other still serves. So the process that serves or
trains a run holds :data:`LOCK_FILE` locked (``fcntl.flock``, exclusive, non-blocking) from the
moment it opens the folder until it stops; the operating system drops the lock when the process
dies, however it dies (``kill -9`` included), so a lock is never stale. The file holds the
holder's pid, for the message that refuses a second process. A child the holder starts (the
learner subprocess, env-runner processes) does not hold the lock: the descriptor is not
inherited by ``exec`` and is closed in a ``fork``ed child, so an orphaned child cannot keep a
run locked.

Windows has no ``flock``: ``msvcrt.locking`` locks one byte past the pid instead, with the same
meaning (untested here; rlserve's tests run on Linux and macOS).
"""

from __future__ import annotations

import contextlib
import os
import sys
import weakref
from pathlib import Path

from rlserve.errors import ConfigError

LOCK_FILE = "run.lock"
"""The lock file in a run folder (its content: the holder's pid)."""

_LOCK_OFFSET = 1 << 20
"""Windows: the byte locked (past the pid, which must stay readable)."""

_held: weakref.WeakSet[RunLock] = weakref.WeakSet()


class RunLock:
    """The exclusive lock of one run folder, held by this process until :meth:`release`.

    Use :meth:`acquire` to take it.
    """

    def __init__(self, path: Path, fd: int):
        self.path = path
        """The lock file."""
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, folder: Path, fix: str) -> RunLock:
        """Lock ``folder`` for this process, or refuse at once if another process holds it.

        Args:
            folder: The run folder (it must exist).
            fix: What the user should do when it is in use (the end of the error message).

        Raises:
            ConfigError: Another process (or another open of it in this one) holds the folder:
                ``"<folder> is in use by pid N; <fix>"``.
        """
        path = folder / LOCK_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        if not _try_lock(fd):
            os.close(fd)
            holder = holder_pid(folder)
            by = f"pid {holder}" if holder is not None else "another process"
            raise ConfigError(f"{folder} is in use by {by}; {fix}")
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, f"{os.getpid()}\n".encode())
        lock = cls(path, fd)
        _held.add(lock)
        return lock

    @property
    def held(self) -> bool:
        """Whether this process still holds the lock."""
        return self._fd is not None

    def release(self) -> None:
        """Let another process open the run folder; a second call does nothing."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        _held.discard(self)
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        _unlock(fd)
        os.close(fd)

    def _forget_in_child(self) -> None:
        """In a ``fork``ed child: drop the inherited descriptor without unlocking the parent's."""
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


def holder_pid(folder: Path) -> int | None:
    """The pid written by the process that holds (or last held) ``folder``'s lock, if any."""
    try:
        return int((folder / LOCK_FILE).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _after_fork_in_child() -> None:
    for lock in list(_held):
        lock._forget_in_child()
    _held.clear()


if sys.platform == "win32":  # pragma: no cover - exercised on Windows only
    import msvcrt

    def _try_lock(fd: int) -> bool:
        os.lseek(fd, _LOCK_OFFSET, os.SEEK_SET)
        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError:
            return False
        return True

    def _unlock(fd: int) -> None:
        os.lseek(fd, _LOCK_OFFSET, os.SEEK_SET)
        with contextlib.suppress(OSError):
            msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)

else:
    import fcntl

    def _try_lock(fd: int) -> bool:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def _unlock(fd: int) -> None:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)

    os.register_at_fork(after_in_child=_after_fork_in_child)
