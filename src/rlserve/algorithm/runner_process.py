"""One env-runner process: its own environments, collector and EnvRunner, driven over a pipe.

:class:`~rlserve.algorithm.runner_group.RunnerGroup` forks one per ``num_env_runners``. The
process makes its source (``num_envs_per_env_runner`` copies, in sub-processes of its own with
``remote_worker_envs``) with ``worker_index`` its number, acts with numpy policy copies (no torch)
and answers the parent's commands. Messages are maps in rlserve's msgpack codec (typed arrays, no
pickle), one per :meth:`Connection.send_bytes <multiprocessing.connection.Connection.send_bytes>`:

* parent -> runner: ``{"type": "sample", "round": r, "steps": n, "weights": {policy id:
  package}}`` (only the policies whose version changed) and ``{"type": "close"}``.
* runner -> parent: ``ready`` once the environments are made; ``sampled`` (echoing ``round``, so
  the answer to a round the parent abandoned is told apart) with the fragments and
  episode summaries of the round (every open episode cut at its end) and the counters
  ``env_steps``, ``episodes_failed`` (its lifetime sub-environment failures) and ``in_flight``
  (episodes open now); ``config_error`` (the environment cannot be made: not worth a restart);
  ``error`` (anything raised, with its traceback).

The environment creator and config are inherited through ``fork``, never pickled, so lambdas
and classes of a ``__main__`` script work. During a round the runner stamps a shared clock after
every step (:attr:`RunnerSetup.stamp`) so the parent can tell a hung runner from a slow round.
Like the env sub-processes it ignores SIGINT and exits when its pipe reaches EOF or its parent
goes away.
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from rlserve.algorithm.config import AlgorithmConfig
from rlserve.algorithm.sources import make_source
from rlserve.env.base import EnvSource, VectorEnvSource
from rlserve.env.runner import EnvRunner
from rlserve.errors import ConfigError
from rlserve.experience.agent_values import PolicyTable
from rlserve.experience.collector import Collector
from rlserve.experience.episode_records import EpisodeSummary, summary_to_wire
from rlserve.policy import NumpyPolicy
from rlserve.policy.weights import WeightsPackage
from rlserve.processes.child import enter_child
from rlserve.processes.wire import receive, send
from rlserve.protocol.fragment import Fragment

__all__ = ["RunnerSetup", "RunnerWorker", "run_runner"]


@dataclass
class RunnerSetup:
    """What a runner starts from (inherited through ``fork``; pickled for a Ray actor).

    Attributes:
        config: The Algorithm's settings (environment, copies, fragment length).
        table: The policies and the agent -> policy mapping.
        packages: The weights to act with until the first ``sample`` brings others.
        index: The runner's number, 1..N (its environments' ``worker_index``).
        seed: Seed of its environments' first reset and of its policies' sampling.
        stamp: :func:`time.monotonic` of the runner's last step, in ``value``: a shared
            ``double`` for a process, the actor's own for a Ray actor (whose age the parent
            asks for).
    """

    config: AlgorithmConfig
    table: PolicyTable
    packages: dict[str, WeightsPackage]
    index: int
    seed: int
    stamp: Any


def close_inherited_sockets(keep: set[int]) -> None:
    """Close every socket this forked child inherited, except the ``keep`` descriptors.

    A runner restarted while the trainer serves (an attached server) is forked with the server's
    listening socket and its clients' connections; held here, a connection the server closes
    would stay open until the runner exits. The runner makes its environments after this, so
    nothing of its own is closed.
    """
    for folder in ("/proc/self/fd", "/dev/fd"):
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            fd = int(name)
            if fd in keep:
                continue
            try:
                if stat.S_ISSOCK(os.fstat(fd).st_mode):
                    os.close(fd)
            except OSError:
                pass  # the listing's own descriptor, closed meanwhile
        return


def run_runner(conn: Connection, setup: RunnerSetup, inherited: Sequence[Connection]) -> None:
    """The body of a runner process: make the environments, then answer commands until told."""
    enter_child(inherited)
    close_inherited_sockets(keep={0, 1, 2, conn.fileno()})
    worker = RunnerWorker(setup)
    try:
        with contextlib.suppress(OSError, ValueError):
            send(conn, worker.greeting)
        if worker.greeting["type"] != "ready":
            return
        while True:
            try:
                message = receive(conn)
            except (EOFError, OSError):
                return
            if message.get("type") != "sample":
                return
            reply = worker.handle(message)
            with contextlib.suppress(OSError, ValueError):
                send(conn, reply)
            if reply["type"] != "sampled":
                return
    finally:
        worker.close()


class RunnerWorker:
    """A runner's environments, collector and EnvRunner, answering one message at a time.

    The body every runner backend shares: a runner process drives it over its pipe
    (:func:`run_runner`), a Ray actor through method calls (:mod:`rlserve.cluster`). It never
    raises: whatever goes wrong is its answer (``config_error`` or ``error``).

    Attributes:
        greeting: The first answer: ``ready`` (with ``in_flight``), ``config_error`` (the
            environment cannot be made) or ``error``.
    """

    def __init__(self, setup: RunnerSetup) -> None:
        self._setup = setup
        self._source: EnvSource | None = None
        try:
            try:
                self._source = make_source(setup.config, seed=setup.seed, worker_index=setup.index)
            except ConfigError as exc:
                self.greeting: dict[str, Any] = {"type": "config_error", "reason": str(exc)}
                return
            self._open(self._source)
        except Exception as exc:
            self.greeting = _error(exc)

    def _open(self, source: EnvSource) -> None:
        setup = self._setup
        seeds = np.random.SeedSequence([setup.seed, setup.index])

        def policy(package: WeightsPackage) -> NumpyPolicy:
            seed = int(seeds.spawn(1)[0].generate_state(1, np.uint64)[0])
            return NumpyPolicy(package.spec, package.arrays, package.version, seed=seed)

        self._policy = policy
        self._fragments: list[Fragment] = []
        self._summaries: list[EpisodeSummary] = []
        num_envs = int(getattr(source, "num_envs", 1))
        self._collector = Collector(
            setup.table,
            {pid: policy(package) for pid, package in setup.packages.items()},
            setup.config.rollout_fragment_length,
            max(1024, 4 * num_envs),
            self._fragments.append,
            self._summaries.append,
        )
        self._runner = EnvRunner(source, self._collector, seed=setup.seed)
        # A single-agent vector source's episodes live in the runner's VectorRollout, not in the
        # collector's table: one open per copy.
        self._vector_copies = (
            num_envs if isinstance(source, VectorEnvSource) and not source.multi_agent else 0
        )
        # Before its first reset a source has no episode open, but a failure then still loses
        # one per copy: count those.
        self.greeting = {"type": "ready", "in_flight": num_envs}

    @property
    def stamp(self) -> Any:
        """The clock it stamps after every step (:attr:`RunnerSetup.stamp`)."""
        return self._setup.stamp

    def handle(self, message: dict[str, Any]) -> dict[str, Any]:
        """The answer to a ``sample`` message: ``sampled``, or ``error`` (the runner is done)."""
        try:
            return self._sample(message)
        except Exception as exc:
            return _error(exc)

    def _sample(self, message: dict[str, Any]) -> dict[str, Any]:
        stamp = self._setup.stamp
        stamp.value = time.monotonic()
        for pid, raw in message["weights"].items():
            self._collector.set_policy(str(pid), self._policy(WeightsPackage.from_wire(raw)))
        wanted = int(message["steps"])
        steps = 0
        while steps < wanted:
            # One round at a time, so the parent sees progress after every step.
            steps += self._runner.sample(1)
            stamp.value = time.monotonic()
        self._runner.cut()
        reply = {
            "type": "sampled",
            "round": message.get("round"),
            "env_steps": steps,
            "episodes_failed": self._runner.episodes_failed,
            "in_flight": len(self._collector.table) + self._vector_copies,
            "fragments": [f.to_wire() for f in self._fragments],
            "summaries": [summary_to_wire(s, with_policy=True) for s in self._summaries],
        }
        self._fragments.clear()
        self._summaries.clear()
        return reply

    def close(self) -> None:
        """Close the environments (idempotent)."""
        source, self._source = self._source, None
        if source is not None:
            with contextlib.suppress(Exception):
                source.close()


def _error(exc: Exception) -> dict[str, Any]:
    return {
        "type": "error",
        "reason": f"{type(exc).__name__}: {exc}",
        "traceback": traceback.format_exc(),
    }
