"""Crash-safe file writes: a file is either its old whole content or its new whole content.

A reader after a crash (kill -9, power loss) never sees a half-written checkpoint, weights file or
state file: the new content goes to a temporary file in the same folder, is flushed to the disk
(``fsync``), and is renamed over the old name, which POSIX makes atomic; the folder is then
flushed too, so the rename itself survives a power loss.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def fsync_dir(folder: Path) -> None:
    """Flush a folder's entries (renames, new files) to the disk; a no-op where unsupported."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically and durably.

    Raises:
        OSError: The write failed (disk full, read-only folder...); ``path`` is unchanged and the
            temporary file is removed.
    """
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    fsync_dir(path.parent)
