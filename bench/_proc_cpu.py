"""CPU, memory and load readings from ``/proc`` for the benchmarks (Linux only).

:class:`CpuMeter` averages the cores used by named groups of processes, by the kernel (interrupts,
softirqs and kernel threads: mostly the loopback network stack working for us) and by every other
process on the machine; :func:`wait_for_quiet` waits until those others leave the cores alone.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def rss_kib(pid: int) -> int:
    """VmRSS of ``pid`` in KiB (0 when it is gone)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    match = re.search(r"^VmRSS:\s+(\d+) kB", text, re.MULTILINE)
    return int(match.group(1)) if match else 0


def children(pid: int) -> list[tuple[int, str]]:
    """(pid, command line) of every live child of ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: the ppid follows the last ')'.
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append((int(entry.name), cmdline))
    return found


def load_average() -> tuple[float, float, float]:
    """The machine's 1, 5 and 15 minute load averages."""
    return os.getloadavg()


def _machine_cpu_s() -> tuple[float, float]:
    """(busy, interrupt) CPU seconds of the whole machine since boot, every core."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / CLOCK_TICKS, (fields[5] + fields[6]) / CLOCK_TICKS


def _process_cpu_s(pids: list[int]) -> float:
    """CPU seconds (user + system) used so far by the live processes in ``pids``."""
    total = 0
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / CLOCK_TICKS


def _kernel_threads() -> list[int]:
    """Pids of kernel threads (kthreadd and its children): kernel work, much of it ours."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            if entry.name == "2" or ppid == 2:
                found.append(int(entry.name))
    return found


class CpuMeter:
    """Average cores used by groups of our processes, by the kernel, and by everything else.

    ``kernel`` is interrupt and softirq time plus kernel threads (much of it is the loopback
    network stack working for us); ``other`` is every remaining process on the machine.
    """

    def __init__(self, groups: dict[str, list[int]]):
        self.groups = groups
        self._kthreads = _kernel_threads()
        self._mark = self._read()

    def _read(self) -> dict[str, float]:
        busy, interrupts = _machine_cpu_s()
        sample = {name: _process_cpu_s(pids) for name, pids in self.groups.items()}
        sample.update(
            time=time.monotonic(),
            busy=busy,
            kernel=interrupts + _process_cpu_s(self._kthreads),
        )
        return sample

    def lap(self) -> dict[str, float]:
        """Cores per group, ``kernel`` and ``other``, averaged since the previous lap."""
        now, then = self._read(), self._mark
        self._mark = now
        elapsed = max(now["time"] - then["time"], 1e-9)
        cores = {k: (now[k] - then[k]) / elapsed for k in now if k not in ("time", "busy")}
        busy = (now["busy"] - then["busy"]) / elapsed
        cores["other"] = max(busy - sum(cores.values()), 0.0)
        return cores


def wait_for_quiet(max_load: float, timeout: float) -> float:
    """Wait until other processes use under ``max_load`` cores for 2 s; return the last load."""
    deadline = time.monotonic() + timeout
    meter = CpuMeter({"bench": [os.getpid()]})
    while True:
        time.sleep(2.0)
        other = meter.lap()["other"]
        if other < max_load or time.monotonic() > deadline:
            return other
