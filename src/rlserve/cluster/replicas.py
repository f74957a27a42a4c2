"""The driver's other front-ends: a launcher actor on each of their nodes, and endpoints.json.

See :mod:`rlserve.cluster.front_ends`; :class:`Replicas` is what ``rlserve serve --replicas N``
holds besides its own server.

The launchers outlive the driver (detached, named after the learner): when the driver's process
dies, the learner dies with it (Ray's ownership) but the other front-ends keep serving, and a
driver resumed on the same run folder (``--resume``) takes the learner's name again
(:data:`STATE_FILE`), finds each live launcher by its name and keeps it, and starts a launcher
only where none runs. The front-ends, which look for the learner by that name, find the new one.
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

from rlserve.cluster.front_end_link import NAMESPACE
from rlserve.cluster.front_ends import FrontEndLauncher, on_node, publish_front_ends, without_flags

__all__ = ["STATE_FILE", "Replicas", "launcher_name", "live_launchers", "saved_learner_name"]

STATE_FILE = "ray_front_ends.json"
"""The driver's run folder's file that keeps the learner's name for a resumed driver."""

FIND_TIMEOUT_S = 10.0
"""Seconds a launcher found by name gets to answer before it counts as gone."""

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


def saved_learner_name(run: Path) -> str | None:
    """The learner's name a driver of the run in ``run`` used (None: none kept)."""
    try:
        return str(json.loads((run / STATE_FILE).read_text())["learner_name"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def launcher_name(learner_name: str, ip: str) -> str:
    """The name of the launcher actor on node ``ip`` of the learner ``learner_name``."""
    return f"{learner_name}-front-end-{ip}"


def _find_launcher(ray: Any, learner_name: str, ip: str) -> Any:
    """The live launcher of ``learner_name`` on ``ip`` (None: there is none)."""
    try:
        launcher = ray.get_actor(launcher_name(learner_name, ip), namespace=NAMESPACE)
        ray.get(launcher.endpoint.remote(0.0), timeout=FIND_TIMEOUT_S)
    except Exception:  # no such actor, or it is dead or dying
        return None
    return launcher


def live_launchers(ray: Any, learner_name: str, nodes: Sequence[str]) -> list[str]:
    """The nodes of ``nodes`` where a launcher of ``learner_name`` still runs (its port is ours)."""
    return [ip for ip in nodes if _find_launcher(ray, learner_name, ip) is not None]


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
        # The driver took its configuration (a mapping function too) on its operator's word;
        # the front-ends read that configuration back from folders this run wrote itself.
        own.append("--trust-code")
        base = [sys.executable, "-m", "rlserve.cli"]
        again = [*base, *without_flags(self._argv, (*_DROPPED, *_KEPT_BY_RUN)), *own]
        first = [*base, *without_flags(self._argv, _DROPPED), *own]
        if "--resume" in (arg.split("=", 1)[0] for arg in self._argv):
            # A resumed driver's flags name no configuration: the run folder has it.
            first = [*again, "--config-from-run", str(run)]
        first += ["--run-dir", str(run / "front_ends"), "--name", ip]
        return first, again

    def start(self, run: Path) -> None:
        """Start every other front-end; keep ``run``'s ``endpoints.json`` listing them all.

        A front-end whose launcher still runs (the driver before this one died) is kept.
        """
        from rlserve.run.durable import atomic_write_bytes

        state = {"learner_name": self._name}
        atomic_write_bytes(run / STATE_FILE, (json.dumps(state, indent=2) + "\n").encode())
        launcher = self._ray.remote(num_cpus=0, max_restarts=0, max_concurrency=4)(FrontEndLauncher)
        for ip in self.nodes:
            found = _find_launcher(self._ray, self._name, ip)
            if found is not None:
                self._launchers.append(found)
                continue
            first, again = self._commands(ip, run)
            log = str(run / "front_ends" / f"{ip}.log")
            folder = str(run / "front_ends" / ip)
            # Detached: it and its front-end keep serving when this driver's process dies.
            options = {
                **on_node(self._ray, ip),
                "name": launcher_name(self._name, ip),
                "namespace": NAMESPACE,
                "lifetime": "detached",
            }
            self._launchers.append(
                launcher.options(**options).remote(first, again, folder, log, self._env)
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
