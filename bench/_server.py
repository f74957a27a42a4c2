"""Start a real ``rlserve serve`` subprocess for a benchmark and read what it listens on.

A small copy of the test suite's launcher (``tests/conftest.py``): benchmarks do not import from
``tests``. ``start_server(flags, folder)`` runs the server with ``--port 0 --http-port 0``, waits
for its ``rlserve listening on ...`` line and returns a :class:`BenchServer`.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LISTENING = re.compile(
    r"rlserve listening on (?P<host>.+?):(?P<port>\d+) \(binary\)"
    r"(?: and http://(?P<http_host>.+?):(?P<http_port>\d+) \(HTTP\))?"
    r"; run folder (?P<run>.+)$"
)


def rlserve_command() -> list[str]:
    """The ``rlserve`` console script of this interpreter's environment."""
    script = Path(sys.executable).parent / "rlserve"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "rlserve.cli"]


def rss_bytes(pid: int) -> int | None:
    """Resident memory of a process from ``/proc`` (None when it is gone or not Linux)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def child_pids(pid: int) -> list[int]:
    """Direct children of a process, from ``/proc`` (empty when unknown)."""
    children: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            text = (task / "children").read_text().split()
            children.extend(int(c) for c in text)
    return children


@dataclass
class BenchServer:
    """A running ``rlserve serve`` process."""

    process: subprocess.Popen[str]
    port: int
    http_port: int
    run_folder: Path
    log_path: Path

    @property
    def address(self) -> str:
        """``127.0.0.1:port`` of the binary carrier."""
        return f"127.0.0.1:{self.port}"

    @property
    def http_url(self) -> str:
        """Base URL of the HTTP carrier."""
        return f"http://127.0.0.1:{self.http_port}"

    def alive(self) -> bool:
        """Whether the server process is still running."""
        return self.process.poll() is None

    def log(self) -> str:
        """What the server wrote to stderr so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def rss(self) -> dict[str, int | None]:
        """Resident memory of the serving process and of its largest child (the learner)."""
        children = [rss_bytes(child) for child in child_pids(self.process.pid)]
        sizes = [size for size in children if size is not None]
        return {"server": rss_bytes(self.process.pid), "learner": max(sizes, default=None)}

    def get_json(self, path: str, token: str | None = None, timeout: float = 10.0) -> Any:
        """``GET`` a JSON route of the HTTP carrier."""
        request = urllib.request.Request(self.http_url + path)
        if token is not None:
            request.add_header("Authorization", f"Bearer {token}")
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            return json.loads(reply.read())

    def wait_for_weights(self, timeout: float = 120.0) -> int:
        """Wait until the learner published its first weights; return their version."""
        deadline = time.monotonic() + timeout
        while True:
            if not self.alive():
                raise RuntimeError(f"server exited while starting:\n{self.log()}")
            with contextlib.suppress(OSError, ValueError):
                version = self.get_json("/v1/health").get("weights_version")
                if version is not None and int(version) >= 0:
                    return int(version)
            if time.monotonic() > deadline:
                raise RuntimeError(f"no weights after {timeout} s:\n{self.log()}")
            time.sleep(0.1)

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM, then SIGKILL after ``timeout``; return the exit code."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        return int(self.process.returncode)


def start_server(
    flags: list[str],
    folder: Path,
    startup_timeout: float = 60.0,
    profile: Path | None = None,
) -> BenchServer:
    """Start ``rlserve serve`` with ``flags`` (spaces, token...) and wait for its listening line.

    Args:
        flags: Extra command-line flags, e.g. ``["--spaces-from", "CartPole-v1"]``.
        folder: Where the run folder and the server's stderr log go.
        startup_timeout: Seconds to wait for the listening line.
        profile: Run the serving process under cProfile and write its statistics to this file
            when it exits (after :meth:`BenchServer.stop`).
    """
    folder.mkdir(parents=True, exist_ok=True)
    log_path = folder / "server.log"
    launcher = rlserve_command()
    if profile is not None:
        launcher = [
            sys.executable,
            "-m",
            "cProfile",
            "-o",
            str(profile),
            "-m",
            "rlserve.cli",
        ]
    command = [*launcher, "serve", "--run-dir", str(folder / "runs"), "--name", "bench"]
    command += ["--port", "0", "--http-port", "0", "--no-progress", *flags]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.setdefault("OMP_NUM_THREADS", "1")
    with log_path.open("w") as log:
        process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=log,
            stdin=subprocess.DEVNULL,
            text=True,
            env=env,
            start_new_session=True,
        )
    found: queue.Queue[re.Match[str] | None] = queue.Queue()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            match = LISTENING.search(line.strip())
            if match:
                found.put(match)
        found.put(None)

    threading.Thread(target=read, daemon=True).start()
    try:
        match = found.get(timeout=startup_timeout)
    except queue.Empty:
        match = None
    if match is None or match["http_port"] is None:
        process.kill()
        process.wait(10)
        raise RuntimeError(
            f"rlserve serve did not print its listening line (exit code {process.returncode})\n"
            f"command: {command}\nstderr:\n{log_path.read_text(errors='replace')}"
        )
    return BenchServer(
        process=process,
        port=int(match["port"]),
        http_port=int(match["http_port"]),
        run_folder=Path(match["run"]),
        log_path=log_path,
    )
