"""Env-runner processes (``num_env_runners=N``): sampling in parallel, restarted when they fail.

Each of the N runners is a forked process (:mod:`rlserve.algorithm.runner_process`) with its own
environments, numpy policy copies and :class:`~rlserve.env.runner.EnvRunner`, seeded apart from
the others. :meth:`RunnerGroup.sample` is one synchronous round: every runner gets the weights
whose version changed since it last acted, samples its share of the steps, cuts its episodes and
sends back its fragments and episode summaries; the round returns them merged in runner order,
so a round depends only on the seeds and the weights, not on timing.

A runner that raises, exits, is killed, or does not step within its hang timeout
(``step_timeout_s``) is killed if need be and started again with a new seed; its round's
experience is lost, its episodes in flight count in :attr:`RunnerGroup.episodes_failed`, and the
others' experience is used as usual (RLlib's ``restart_failed_env_runners``). When one runner
fails ``max_restarts + 1`` times in a row without a successful round, :meth:`sample` raises
``RuntimeError`` naming the environment.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from multiprocessing.util import Finalize
from typing import Any

import numpy as np

from rlserve.algorithm.config import AlgorithmConfig
from rlserve.algorithm.runner_process import RunnerSetup, receive, run_runner, send
from rlserve.algorithm.sources import make_source
from rlserve.env.base import EnvSource
from rlserve.env.subprocess import death_reason
from rlserve.errors import ConfigError, DecodeError
from rlserve.experience.agent_values import PolicyTable
from rlserve.experience.episode_records import summary_from_wire
from rlserve.policy.weights import WeightsPackage
from rlserve.protocol.codec import encode
from rlserve.protocol.fragment import Fragment
from rlserve.training.sampler import SampleRound

__all__ = ["RunnerGroup", "local_source"]

logger = logging.getLogger("rlserve.algorithm")

START_TIMEOUT_S = 60.0
"""Seconds a runner may take to make its environments."""

REMOTE_RESTART_ALLOWANCE_S = 60.0
"""Extra hang allowance with ``remote_worker_envs``: a hung sub-process copy is first restarted
inside its runner (a step timeout, then up to this long to start again)."""

_CLOSE_WAIT_S = 5.0
"""How long :meth:`RunnerGroup.stop` waits for runners to exit by themselves."""

_CHECK_S = 0.2
"""How often a waiting parent looks at the runners' step clocks."""


def local_source(config: AlgorithmConfig, seed: int) -> EnvSource:
    """The one in-process copy the Algorithm keeps (for its spaces) when runners sample.

    Raises:
        ConfigError: ``config.env`` is an ``EnvSource`` instance, which cannot be copied into
            runner processes, or a multi-agent env with ``remote_worker_envs``.
    """
    if isinstance(config.env, EnvSource):
        raise ConfigError(
            f"num_env_runners={config.num_env_runners} cannot copy an EnvSource instance "
            f"({type(config.env).__name__}) into runner processes: pass its class or a "
            "function that makes it, or sample in this process with num_env_runners=0"
        )
    source = make_source(config, seed=seed, evaluation=True)
    if source.multi_agent and config.remote_worker_envs:
        source.close()
        raise ConfigError(
            "multi-agent envs cannot step in sub-processes yet: drop remote_worker_envs=True "
            f"(the {config.num_env_runners} env-runner processes already sample in parallel)"
        )
    return source


@dataclass
class _Runner:
    """One runner process and what the parent knows of it."""

    index: int
    stamp: Any
    process: BaseProcess | None = None
    conn: Connection | None = None
    versions: dict[str, int] = field(default_factory=dict)
    """The weights version of each policy it acts with."""
    failures: int = 0
    """Failures since its last successful round."""
    starts: int = 0
    reported_failed: int = 0
    """``episodes_failed`` its current process reported last."""
    in_flight: int = 0
    """Episodes open in it at its last answer (lost if it fails)."""


class _Failure:
    """Why a runner gave no usable answer."""

    def __init__(self, reason: str, details: str = "") -> None:
        self.reason = reason
        self.details = details


class _Processes:
    """The runners' processes, closable from a finaliser that holds no group reference."""

    def __init__(self) -> None:
        self.runners: list[_Runner] = []

    def close(self) -> None:
        for runner in self.runners:
            if runner.conn is not None:
                with contextlib.suppress(OSError, ValueError):
                    send(runner.conn, {"type": "close"})
        deadline = time.monotonic() + _CLOSE_WAIT_S
        for runner in self.runners:
            if runner.process is not None:
                runner.process.join(timeout=max(0.0, deadline - time.monotonic()))
            kill(runner)


def kill(runner: _Runner) -> None:
    """Kill a runner's process if it is alive, reap it and close its pipe."""
    if runner.process is not None:
        if runner.process.is_alive():
            runner.process.kill()
        runner.process.join(timeout=_CLOSE_WAIT_S)
    if runner.conn is not None:
        runner.conn.close()
    runner.process, runner.conn = None, None


class RunnerGroup:
    """``config.num_env_runners`` env-runner processes sampling in parallel.

    Args:
        config: The Algorithm's settings (``num_env_runners`` >= 1).
        table: The policies and the agent -> policy mapping.
        packages: Each policy's current weights.
        seed: The base seed; runner ``k``'s ``n``-th start is seeded from ``(seed, k, n)``.
        episodes_failed: Failed episodes counted before (a restored checkpoint's).
        max_restarts: Restarts in a row of one runner, without a successful round, after which
            :meth:`sample` gives up.

    Attributes:
        episodes_failed: Episodes lost, lifetime: in the runners' failed sub-environments and
            in flight in failed runners.
        restarts: Runner processes restarted after a failure.

    Raises:
        ConfigError: The environment cannot be made in a runner.
        RuntimeError: A runner could not be started.
    """

    def __init__(
        self,
        config: AlgorithmConfig,
        table: PolicyTable,
        packages: dict[str, WeightsPackage],
        seed: int,
        episodes_failed: int = 0,
        max_restarts: int = 3,
    ) -> None:
        if config.num_env_runners < 1:
            raise ConfigError(
                f"a RunnerGroup needs num_env_runners >= 1, not {config.num_env_runners}"
            )
        self._ctx = mp.get_context("fork")
        self._config = config
        self._table = table
        self._packages = dict(packages)
        self._seed = seed
        self.max_restarts = max_restarts
        self.episodes_failed = episodes_failed
        self.restarts = 0
        self._round = 0
        self.hang_timeout_s = config.step_timeout_s
        if config.remote_worker_envs:
            self.hang_timeout_s = 2 * config.step_timeout_s + REMOTE_RESTART_ALLOWANCE_S
        env = config.env
        self._env_name = env if isinstance(env, str) else getattr(env, "__qualname__", repr(env))
        self._procs = _Processes()
        self._finalizer = Finalize(self, self._procs.close, exitpriority=10)
        for index in range(1, config.num_env_runners + 1):
            self._procs.runners.append(_Runner(index, self._ctx.RawValue("d", 0.0)))
        try:
            for runner in self._runners:
                self._spawn(runner)
            for runner in self._runners:
                answer = self._gather([runner], "ready", START_TIMEOUT_S)[runner.index]
                if isinstance(answer, _Failure):
                    raise RuntimeError(
                        f"env {self._env_name} could not be made in env runner {runner.index}: "
                        f"{answer.reason}\n{answer.details}"
                    )
                runner.in_flight = int(answer["in_flight"])
        except BaseException:
            self.stop()
            raise

    @property
    def _runners(self) -> list[_Runner]:
        return self._procs.runners

    @property
    def pids(self) -> list[int | None]:
        """The runners' process ids, in runner order (None: not running)."""
        return [None if r.process is None else r.process.pid for r in self._runners]

    @property
    def num_healthy(self) -> int:
        """Runner processes alive now."""
        return sum(1 for r in self._runners if r.process is not None and r.process.is_alive())

    # -- a round -----------------------------------------------------------------------------

    def sample(self, steps: int, packages: Mapping[str, WeightsPackage]) -> SampleRound:
        """One round: every runner samples ``ceil(steps / N)`` steps with ``packages``.

        Returns:
            The healthy runners' fragments, summaries and step count, in runner order.

        Raises:
            RuntimeError: A runner keeps failing (see the module doc).
            ConfigError: The environment cannot be made in a restarted runner.
        """
        self._packages = dict(packages)
        self._round += 1
        share = -(-steps // len(self._runners))
        encoded: dict[tuple[str, ...], bytes] = {}
        failures: dict[int, _Failure] = {}
        sent: list[_Runner] = []
        for runner in self._runners:
            changed = tuple(
                pid for pid, p in packages.items() if runner.versions.get(pid) != p.version
            )
            if changed not in encoded:
                weights = {pid: packages[pid].to_wire() for pid in changed}
                encoded[changed] = encode(
                    {"type": "sample", "round": self._round, "steps": share, "weights": weights}
                )
            runner.stamp.value = time.monotonic()
            failure = self._send(runner, encoded[changed])
            if failure is None:
                runner.versions.update({pid: packages[pid].version for pid in changed})
                sent.append(runner)
            else:
                failures[runner.index] = failure
        answers = self._gather(sent, "sampled", None)
        taken = SampleRound()
        for runner in self._runners:
            answer = failures.get(runner.index) or answers[runner.index]
            if isinstance(answer, _Failure):
                self._fail(runner, answer, "sample")
                self._restart(runner)
                continue
            try:
                fragments = [Fragment.from_wire(raw) for raw in answer["fragments"]]
                summaries = [summary_from_wire(raw) for raw in answer["summaries"]]
            except DecodeError as exc:
                self._fail(runner, _Failure(f"sent a malformed answer: {exc}"), "sample")
                self._restart(runner)
                continue
            runner.failures = 0
            taken.fragments += fragments
            taken.summaries += summaries
            taken.env_steps += int(answer["env_steps"])
            reported = int(answer["episodes_failed"])
            self.episodes_failed += reported - runner.reported_failed
            runner.reported_failed = reported
            runner.in_flight = int(answer["in_flight"])
        return taken

    # -- processes ---------------------------------------------------------------------------

    def _spawn(self, runner: _Runner) -> None:
        parent_conn, child_conn = self._ctx.Pipe(duplex=True)
        inherited = [parent_conn] + [
            r.conn for r in self._runners if r.conn is not None and r is not runner
        ]
        seed = int(
            np.random.SeedSequence([self._seed, runner.index, runner.starts]).generate_state(1)[0]
        )
        runner.starts += 1
        setup = RunnerSetup(
            self._config, self._table, self._packages, runner.index, seed, runner.stamp
        )
        # Not a daemon: a runner with remote_worker_envs starts processes of its own, which a
        # daemon may not. The finaliser (and each runner's parent watch) reaps them instead.
        process = self._ctx.Process(
            target=run_runner,
            args=(child_conn, setup, inherited),
            name=f"rlserve-env-runner-{runner.index}",
        )
        process.start()
        child_conn.close()
        runner.process, runner.conn = process, parent_conn
        runner.versions = {pid: p.version for pid, p in self._packages.items()}
        runner.reported_failed = 0

    def _send(self, runner: _Runner, data: bytes) -> _Failure | None:
        if runner.conn is None:
            return _Failure("runner process is not running")
        try:
            runner.conn.send_bytes(data)
        except (OSError, ValueError):
            return _Failure(self._died(runner))
        return None

    def _gather(
        self, runners: Sequence[_Runner], kind: str, timeout: float | None
    ) -> dict[int, Any]:
        """Each runner's ``kind`` answer by index, or a :class:`_Failure`.

        With ``timeout`` None a runner fails when its step clock is older than the hang
        timeout; else when it has not answered within ``timeout`` seconds.
        """
        answers: dict[int, Any] = {}
        pending = {r.conn: r for r in runners if r.conn is not None}
        deadline = None if timeout is None else time.monotonic() + timeout
        while pending:
            for conn in wait(list(pending), timeout=_CHECK_S):
                assert isinstance(conn, Connection)
                runner = pending.pop(conn)
                try:
                    message = receive(conn)
                except (EOFError, OSError):
                    answers[runner.index] = _Failure(self._died(runner))
                    continue
                except DecodeError as exc:
                    answers[runner.index] = _Failure(f"sent a malformed message: {exc}")
                    continue
                if kind == "sampled" and message.get("round", self._round) != self._round:
                    # The answer to a round the caller abandoned (an exception, Ctrl-C).
                    pending[conn] = runner
                    continue
                answers[runner.index] = self._answer(runner, message, kind)
            now = time.monotonic()
            for conn, runner in list(pending.items()):
                if deadline is not None and now > deadline:
                    limit = f"did not answer within {timeout:g} s"
                elif deadline is None and now - runner.stamp.value > self.hang_timeout_s:
                    limit = f"did not step within {self.hang_timeout_s:g} s"
                else:
                    continue
                del pending[conn]
                answers[runner.index] = _Failure(f"runner process {limit} and was killed")
        return answers

    def _answer(self, runner: _Runner, message: dict[str, Any], kind: str) -> Any:
        if message.get("type") == kind:
            return message
        if message.get("type") == "config_error":
            raise ConfigError(f"in env runner {runner.index}: {message.get('reason')}")
        if message.get("type") == "error":
            return _Failure(f"env raised {message.get('reason')}", str(message.get("traceback")))
        return _Failure(f"runner process answered {message.get('type')!r}, not {kind!r}")

    def _died(self, runner: _Runner) -> str:
        return death_reason(runner.process, "runner process")

    def _fail(self, runner: _Runner, failure: _Failure, during: str) -> None:
        """Count a failure and its lost episodes, kill the process; raise when given up."""
        runner.failures += 1
        kill(runner)
        self.episodes_failed += runner.in_flight
        runner.in_flight = 0
        if runner.failures > self.max_restarts:
            raise RuntimeError(
                f"env {self._env_name} in env runner {runner.index} failed {runner.failures} "
                f"times in a row without a successful sample; last error during {during}: "
                f"{failure.reason}" + (f"\n{failure.details}" if failure.details else "")
            )
        logger.warning(
            "env %s in env runner %d failed during %s: %s; restarting the runner%s",
            self._env_name,
            runner.index,
            during,
            failure.reason,
            f"\n{failure.details}" if failure.details else "",
        )

    def _restart(self, runner: _Runner) -> None:
        """Start ``runner`` again until it is ready."""
        while True:
            self.restarts += 1
            self._spawn(runner)
            answer = self._gather([runner], "ready", START_TIMEOUT_S)[runner.index]
            if not isinstance(answer, _Failure):
                runner.in_flight = int(answer["in_flight"])
                return
            self._fail(runner, answer, "restart")

    def stop(self) -> None:
        """Ask every runner to exit, kill those that do not, and reap them all."""
        self._finalizer()

    def __del__(self) -> None:
        if sys.is_finalizing():
            return
        with contextlib.suppress(Exception):
            self.stop()
