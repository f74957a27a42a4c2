"""The driver's other front-ends: a launcher actor on each of their nodes, and endpoints.json.

See :mod:`rlserve.cluster.front_ends`; :class:`Replicas` is what ``rlserve serve --replicas N``
holds besides its own server.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlserve.cluster.front_ends import FrontEndLauncher, on_node, publish_front_ends, without_flags

__all__ = ["Replicas"]

_DROPPED = (
    "--replicas",
    "--name",
    "--run-dir",
    "--host",
    "--ray",
    "--ray-node-ip",
    "--ray-learner-resources",
    "--resume",
    "--front-end-of",
)
"""The driver's flags each other front-end gets its own value of (or none)."""

_KEPT_BY_RUN = ("--config", "--spaces-from", "--spaces-file", "--config-from-run")
"""Flags a resumed front-end must not repeat (its run folder keeps them)."""

PUBLISH_EVERY_S = 1.0
"""Seconds between refreshes of ``endpoints.json`` (a restarted front-end has a new pid)."""


class Replicas:
    """Front-ends 2..N of a driver, each run by a launcher actor on its node.

    Args:
        ray: The ``ray`` module, connected.
        address: The cluster's address, for the front-ends' ``--ray``.
        nodes: The other front-ends' node addresses.
        argv: The driver's ``rlserve`` arguments (``serve ...``), the front-ends' base.
        learner_name: The learner actor's name (``--front-end-of``).
        env: Environment variables each front-end gets (the token, which no flag carries).
    """

    def __init__(
        self,
        ray: Any,
        address: str,
        nodes: Sequence[str],
        argv: Sequence[str],
        learner_name: str,
        env: dict[str, str] | None = None,
    ) -> None:
        self._env = dict(env or {})
        self._ray = ray
        self._address = address
        self.nodes = list(nodes)
        self._argv = list(argv)
        self._name = learner_name
        self._launchers: list[Any] = []
        self._closing = threading.Event()
        self._publisher: threading.Thread | None = None
        self.front_ends: list[dict[str, Any]] = []
        """Each other front-end's endpoint, as last published."""

    def _commands(self, ip: str, run: Path) -> tuple[list[str], list[str]]:
        own = ["--host", ip, "--ray", self._address, "--ray-node-ip", ip]
        own += ["--front-end-of", self._name]
        base = [sys.executable, "-m", "rlserve.cli"]
        first = [*base, *without_flags(self._argv, _DROPPED), *own]
        first += ["--run-dir", str(run / "front_ends"), "--name", ip]
        again = [*base, *without_flags(self._argv, (*_DROPPED, *_KEPT_BY_RUN)), *own]
        return first, again

    def start(self, run: Path) -> None:
        """Start every other front-end; keep ``run``'s ``endpoints.json`` listing them all."""
        launcher = self._ray.remote(num_cpus=0, max_restarts=0, max_concurrency=4)(FrontEndLauncher)
        for ip in self.nodes:
            first, again = self._commands(ip, run)
            log = str(run / "front_ends" / f"{ip}.log")
            folder = str(run / "front_ends" / ip)
            self._launchers.append(
                launcher.options(**on_node(self._ray, ip)).remote(
                    first, again, folder, log, self._env
                )
            )
        self._publisher = threading.Thread(
            target=self._publish_forever, args=(run,), name="rlserve-front-ends", daemon=True
        )
        self._publisher.start()

    def _publish_forever(self, run: Path) -> None:
        endpoints_file = run / "endpoints.json"
        while not self._closing.wait(PUBLISH_EVERY_S):
            try:
                content = json.loads(endpoints_file.read_text())
                if content.get("pid") != os.getpid():
                    continue  # the driver's own server has not published yet
                found = self._ray.get(
                    [launcher.endpoint.remote(0.0) for launcher in self._launchers], timeout=10
                )
            except Exception:  # not there yet, or the cluster is busy: try again
                continue
            http = content.get("http") or {}
            own = {
                "node": content["binary"]["host"],
                "host": content["binary"]["host"],
                "port": content["binary"]["port"],
                "http_port": http.get("port"),
                "run_folder": str(run),
                "pid": os.getpid(),
                "restarts": 0,
            }
            entries = [own]
            for ip, endpoint in zip(self.nodes, found, strict=True):
                entries.append({"node": ip, **(endpoint or {"state": "starting"})})
            if entries[1:] != self.front_ends or not self.front_ends:
                with contextlib.suppress(OSError, ValueError):
                    publish_front_ends(endpoints_file, entries)
                    self.front_ends = entries[1:]

    def close(self, timeout_s: float = 20.0) -> None:
        """Stop every other front-end (SIGTERM, then SIGKILL) and their launchers."""
        self._closing.set()
        if self._publisher is not None:
            self._publisher.join(timeout_s)
        closing = [launcher.close.remote() for launcher in self._launchers]
        with contextlib.suppress(Exception):
            self._ray.wait(closing, num_returns=len(closing), timeout=timeout_s)
        for launcher in self._launchers:
            with contextlib.suppress(Exception):
                self._ray.kill(launcher, no_restart=True)
        self._launchers = []
