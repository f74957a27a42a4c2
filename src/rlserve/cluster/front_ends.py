"""Serving front-ends on the cluster's nodes (``rlserve serve --ray ADDRESS --replicas N``).

The ``rlserve serve`` driver is the first front-end, on its own node. Each other front-end is
an ``rlserve serve`` process on another node, run by a :class:`FrontEndLauncher` actor placed
there (one per node, spread): it listens on its node's address with the same port, keeps its
own run folder and experience log, and is started again (``--resume``) when it dies. The driver
writes every front-end into ``endpoints.json`` (``front_ends``). See ``docs/scaling.md``.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlserve.errors import ConfigError

__all__ = [
    "LISTENING",
    "FrontEndLauncher",
    "check_ports",
    "die_with_launcher",
    "front_end_nodes",
    "given",
    "on_node",
    "port_taken",
    "publish_front_ends",
    "without_flags",
]

LISTENING = re.compile(
    r"rlserve listening on (?:tls://)?(?P<host>.+?):(?P<port>\d+) \(binary\)"
    r"(?: and https?://(?P<http_host>.+?):(?P<http_port>\d+) \(HTTP\))?"
    r"; run folder (?P<run>.+)$"
)
"""The line a server prints once it listens."""

RESTART_DELAY_S = 0.5
"""Seconds before a front-end that died is started again."""

STOP_GRACE_S = 15.0
"""Seconds a front-end gets to stop on SIGTERM before it is killed."""


def port_taken(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be listened on (None: it can), probed as the server binds."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            return exc.strerror or str(exc)
    return None


def given(setting: str, value: object) -> str:
    """A setting as given: ``--flag VALUE``, or ``name=VALUE`` for a name ending in ``=``."""
    return f"{setting}{value}" if setting.endswith("=") else f"{setting} {value}"


def front_end_nodes(
    ray: Any,
    replicas: int,
    own_ip: str,
    setting: str = "--replicas",
    prefer: Sequence[str] = (),
) -> list[str]:
    """The node addresses of ``replicas`` front-ends: this one's first, then the others.

    ``setting`` names the replicas setting in the message (``--replicas``, ``replicas=``);
    the live nodes of ``prefer`` (where front-ends still run) come before the others.

    Raises:
        ConfigError: Fewer live nodes than replicas.
    """
    alive = sorted({str(n["NodeManagerAddress"]) for n in ray.nodes() if n.get("Alive")})
    if replicas > len(alive):
        raise ConfigError(
            f"{given(setting, replicas)}: the Ray cluster has {len(alive)} live node(s), and each "
            "front-end needs a node of its own (the same port on each): add nodes (ray start "
            f"--address=HEAD) or ask for {given(setting, len(alive))}"
        )
    others = [ip for ip in alive if ip != own_ip]
    others.sort(key=lambda ip: ip not in prefer)
    return [own_ip, *others[: replicas - 1]]


def on_node(ray: Any, ip: str) -> dict[str, Any]:
    """Ray options that place a task or actor on the node at ``ip`` (and nowhere else)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    node_id = next(
        n["NodeID"] for n in ray.nodes() if n.get("Alive") and n["NodeManagerAddress"] == ip
    )
    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=False)}


def check_ports(ray: Any, nodes: Sequence[str], port: int, timeout_s: float = 30.0) -> None:
    """Refuse a port already taken on any of ``nodes``, each probed on its own node.

    Raises:
        ConfigError: It is taken on a node (the message names the node and the fix).
    """
    probe = ray.remote(num_cpus=0)(port_taken)
    calls = {ip: probe.options(**on_node(ray, ip)).remote(ip, port) for ip in nodes}
    for ip, call in calls.items():
        taken = ray.get(call, timeout=timeout_s)
        if taken is not None:
            raise ConfigError(
                f"port {port} on node {ip} is taken ({taken}): every front-end listens on the "
                "same --port, so pass --port with a port free on every node (or stop what "
                f"listens there)"
            )


def without_flags(argv: Sequence[str], flags: Sequence[str]) -> list[str]:
    """``argv`` without each of ``flags`` and its one value (``--flag V`` or ``--flag=V``)."""
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in flags:
            skip = "=" not in arg
            continue
        kept.append(arg)
    return kept


def die_with_launcher() -> None:
    """In a front-end started by a launcher: SIGTERM when the launcher's process dies.

    Linux's ``PR_SET_PDEATHSIG``, set by the front-end itself (a ``preexec_fn`` in a Ray
    worker, a process of many threads, could deadlock); elsewhere nothing.
    """
    if sys.platform != "linux":
        return
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)
    if os.getppid() == 1:  # the launcher was gone before that
        os.kill(os.getpid(), signal.SIGTERM)


class FrontEndLauncher:
    """On its node, keeps one front-end (an ``rlserve serve`` process) running.

    Args:
        first: The command of its first start (a new run folder, ``folder``).
        again: The command of a restart, to which ``--resume RUN_FOLDER`` is added.
        folder: Its run folder (resumed at once when it exists).
        log_path: Where the front-end's stderr goes (appended).
        env: Environment variables the front-end gets besides this worker's (e.g. the token).
    """

    def __init__(
        self,
        first: list[str],
        again: list[str],
        folder: str,
        log_path: str,
        env: dict[str, str] | None = None,
    ) -> None:
        self._first, self._again = first, again
        self._env = dict(env or {})
        self._log_path = Path(log_path)
        self._log_path.parent.mkdir(parents=True, exist_ok=True)
        self._process: subprocess.Popen[str] | None = None
        self._listening: dict[str, Any] | None = None
        # A driver resumed (--resume) finds each front-end's folder on its node: resume it too.
        self._run_folder: str | None = folder if Path(folder).is_dir() else None
        self._closing = threading.Event()
        self._changed = threading.Condition()
        self.restarts = 0
        self.last_exit: int | None = None
        threading.Thread(target=self._keep_running, name="rlserve-front-end", daemon=True).start()

    def _keep_running(self) -> None:
        while not self._closing.is_set():
            command = self._first
            if self._run_folder is not None:
                command = [*self._again, "--resume", self._run_folder]
            env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
            env.update(PYTHONUNBUFFERED="1", RAY_USAGE_STATS_ENABLED="0", **self._env)
            with self._log_path.open("a") as log:
                process = subprocess.Popen(
                    command,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    stdin=subprocess.DEVNULL,
                    text=True,
                    env=env,
                )
            with self._changed:
                self._process = process
            assert process.stdout is not None
            for line in process.stdout:
                match = LISTENING.search(line.strip())
                if match:
                    with self._changed:
                        self._run_folder = match["run"]
                        self._listening = {
                            "host": match["host"],
                            "port": int(match["port"]),
                            "http_port": int(match["http_port"]) if match["http_port"] else None,
                            "run_folder": match["run"],
                            "pid": process.pid,
                        }
                        self._changed.notify_all()
            self.last_exit = process.wait()
            with self._changed:
                self._listening = None
                self._changed.notify_all()
            if self._closing.is_set():
                return
            self.restarts += 1
            time.sleep(RESTART_DELAY_S)

    def endpoint(self, timeout_s: float) -> dict[str, Any] | None:
        """Where the front-end listens now, with its ``pid`` and ``restarts`` (None: not yet)."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while self._listening is None and time.monotonic() < deadline:
                self._changed.wait(max(0.0, deadline - time.monotonic()))
            if self._listening is None:
                return None
            return {**self._listening, "restarts": self.restarts}

    def close(self) -> int | None:
        """Stop the front-end (SIGTERM, then SIGKILL after a grace); its exit code."""
        self._closing.set()
        with self._changed:
            process = self._process
        if process is None:
            return None
        process.terminate()
        try:
            return process.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            process.kill()
            return process.wait()


def publish_front_ends(endpoints_file: Path, front_ends: list[dict[str, Any]]) -> None:
    """Add ``front_ends`` (every front-end, this one first) to the driver's ``endpoints.json``."""
    from rlserve.run.durable import atomic_write_bytes

    content = json.loads(endpoints_file.read_text())
    content["front_ends"] = front_ends
    atomic_write_bytes(endpoints_file, (json.dumps(content, indent=2) + "\n").encode())
