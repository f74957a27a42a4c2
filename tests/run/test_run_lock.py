"""One process writes a run folder at a time: a second is refused with the holder's pid and the
fix, the lock goes with release() or the holder's death (kill -9 included), and a forked child
neither keeps nor drops its parent's lock."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rlserve.errors import ConfigError
from rlserve.run.run_folder import IN_USE_NEW, IN_USE_RESUME, RunFolder
from rlserve.run.run_lock import LOCK_FILE, holder_pid

pytestmark = pytest.mark.timeout(60)

HOLDER = """
import sys, time
from pathlib import Path
from rlserve.run.run_folder import RunFolder
RunFolder(Path(sys.argv[1])).hold("stop it")
print("held", flush=True)
time.sleep(120)
"""


def _holder(folder: Path) -> subprocess.Popen[str]:
    """Another process that holds ``folder`` until killed."""
    process = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(folder)], stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "held"
    return process


def test_a_second_holder_in_this_process_is_refused_until_release(tmp_path: Path) -> None:
    first = RunFolder.create(str(tmp_path), "x").hold(IN_USE_NEW)
    with pytest.raises(ConfigError) as refused:
        RunFolder(first.path).hold(IN_USE_RESUME)
    assert str(refused.value) == (
        f"{first.path} is in use by pid {os.getpid()}; stop that process first (one process "
        "writes a run at a time)"
    )
    assert first.hold(IN_USE_NEW) is first  # holding again is a no-op
    first.release()
    first.release()
    second = RunFolder(first.path).hold(IN_USE_RESUME)
    assert holder_pid(second.path) == os.getpid()
    second.release()
    assert holder_pid(second.path) is None


def test_replacing_the_same_folder_keeps_its_lock(tmp_path: Path) -> None:
    held = RunFolder.create(str(tmp_path), "x").hold(IN_USE_NEW)
    assert RunFolder(held.path).hold(IN_USE_RESUME, replacing=held) is held
    other = RunFolder.create(str(tmp_path), "y").hold(IN_USE_NEW, replacing=held)
    assert held.lock is not None and not held.lock.held
    RunFolder(held.path).hold(IN_USE_RESUME).release()  # free again
    other.release()


def test_another_process_is_refused_and_kill_9_leaves_no_stale_lock(tmp_path: Path) -> None:
    folder = RunFolder.create(str(tmp_path), "x").path
    holder = _holder(folder)
    try:
        with pytest.raises(ConfigError, match=f"in use by pid {holder.pid}; stop it or choose"):
            RunFolder(folder).hold(IN_USE_NEW)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
    assert (folder / LOCK_FILE).exists()  # the file stays; the lock died with the process
    RunFolder(folder).hold(IN_USE_RESUME).release()


FORKING_HOLDER = """
import multiprocessing, signal, sys, time
from pathlib import Path
from rlserve.run.run_folder import RunFolder
run = RunFolder(Path(sys.argv[1])).hold("stop it")
def child():
    run.release()  # a child that closes what it inherited must not unlock its parent's folder
    signal.pause()
process = multiprocessing.get_context("fork").Process(target=child)
process.start()
time.sleep(0.5)
print(process.pid, flush=True)
time.sleep(120)
"""


def test_a_forked_child_neither_drops_nor_keeps_its_parents_lock(tmp_path: Path) -> None:
    """Env-runner processes are forked from the process that holds the run."""
    folder = RunFolder.create(str(tmp_path), "x").path
    holder = subprocess.Popen(
        [sys.executable, "-c", FORKING_HOLDER, str(folder)], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None
    child_pid = int(holder.stdout.readline())
    try:
        with pytest.raises(ConfigError, match=f"in use by pid {holder.pid};"):
            RunFolder(folder).hold(IN_USE_NEW)
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
        # The orphaned child is still alive, and holds nothing.
        os.kill(child_pid, 0)
        RunFolder(folder).hold(IN_USE_RESUME).release()
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(10)
        with contextlib.suppress(ProcessLookupError):
            os.kill(child_pid, signal.SIGKILL)
