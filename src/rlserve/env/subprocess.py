"""Copies of a single-agent env in sub-processes, stepped in parallel, restarted when they fail.

Written by hand because Gymnasium's ``AsyncVectorEnv`` cannot restart one worker: a crashed or
hung sub-process breaks the whole vector env. Here a sub-process that raises, exits, is killed
or does not answer in time is killed if need be and started again; its copies' episodes are
reported in :attr:`StepBatch.failed` and the other copies go on untouched.

Each sub-process holds ``envs_per_process`` copies and serves one duplex
``multiprocessing`` pipe: the parent sends ``(command, data)`` and the child answers
``("ok", result)`` or ``("error", reason, traceback)``. Messages are plain values and numpy
arrays pickled by ``Connection.send``; both ends are our own processes on this machine, nothing
comes from the network. The env creator is handed over when the process starts: with the
default ``fork`` context nothing is pickled, so env classes defined in a ``__main__`` script
without an ``if __name__ == "__main__"`` guard work (with ``spawn`` they must be importable).

A child ignores SIGINT (the parent handles Ctrl-C) and exits when its pipe reaches EOF or its
parent process goes away, so no sub-process outlives the trainer.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from typing import Any

import numpy as np

from rlserve.env.base import StepBatch, VectorEnvSource
from rlserve.env.make import EnvContext, EnvSpec, env_creator
from rlserve.env.stacking import ObsStacker
from rlserve.env.vector import step_copies
from rlserve.errors import ConfigError

__all__ = ["ProcessVectorSource", "watch_parent"]

logger = logging.getLogger("rlserve.env")

_PARENT_CHECK_S = 0.5
"""How often a child checks that its parent process is still there."""

_CLOSE_WAIT_S = 2.0
"""How long ``close`` waits for a child to exit by itself before killing it."""


def watch_parent() -> None:
    """Exit this (child) process soon after its parent process goes away.

    EOF on a command pipe only shows while the child waits for a command; this daemon thread
    also catches a parent that died while the env hangs in a step.
    """
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(_PARENT_CHECK_S)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, name="rlserve-parent-watch", daemon=True).start()


def _worker(
    conn: Connection,
    creators: Sequence[Callable[[], Any]],
    inherited: Sequence[Connection],
) -> None:
    """The loop of one sub-process: make its copies, then answer ``reset``/``step`` commands."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # A forked child holds copies of the parent's ends of the other workers' pipes; closing
    # them lets those workers see EOF when the parent dies.
    for other in inherited:
        other.close()
    watch_parent()
    envs: list[Any] = []
    try:
        try:
            envs = [create() for create in creators]
        except ConfigError as e:  # not a gymnasium.Env, bad env_config: no point restarting
            conn.send(("config_error", str(e)))
            return
        conn.send(("ok", (envs[0].observation_space, envs[0].action_space)))
        stacker = ObsStacker(envs[0].observation_space)
        while True:
            try:
                command, data = conn.recv()
            except (EOFError, OSError):
                return
            if command == "step":
                conn.send(("ok", step_copies(envs, data, stacker)))
            elif command == "reset":
                conn.send(
                    ("ok", [env.reset(seed=seed) for env, seed in zip(envs, data, strict=True)])
                )
            else:
                return
    except Exception as e:
        with contextlib.suppress(OSError, ValueError):
            conn.send(("error", f"{type(e).__name__}: {e}", traceback.format_exc()))
    finally:
        for env in envs:
            with contextlib.suppress(Exception):
                env.close()


@dataclass
class _Worker:
    """One sub-process and the copies it holds."""

    index: int
    copies: range
    creators: list[Callable[[], Any]]
    process: BaseProcess | None = None
    conn: Connection | None = None
    failures: int = 0
    """Failures since its last successful step (restarts in a row)."""


class _Failure:
    """Why a worker gave no usable answer."""

    def __init__(self, reason: str, details: str = "") -> None:
        self.reason = reason
        self.details = details


class ProcessVectorSource(VectorEnvSource):
    """``num_envs`` copies of one single-agent env in sub-processes, stepped in parallel.

    Copies behave as in :class:`~rlserve.env.InProcessVectorSource` (same-step reset, dtype
    cast, terminated wins over truncated, copy ``i`` seeded with ``seed + i``), so the same
    seed and actions give the same trajectories. In addition, a sub-process that raises,
    exits, is killed, or does not answer a step within ``step_timeout`` seconds (a reset within
    ``reset_timeout``) is killed and started again; each of its copies gets
    ``StepBatch.failed[i]`` with the reason, and its ``obs`` row starts a fresh episode. A
    warning goes to the ``rlserve.env`` logger. When the same sub-process fails
    ``max_restarts + 1`` times in a row without one successful step (an env that raises in
    ``reset``, say), :meth:`step_all` raises ``RuntimeError`` instead of looping forever.

    Args:
        env: What names the env (see :func:`rlserve.env.make_env`); not an instance.
        env_config: The settings handed to each copy's creator, as an :class:`EnvContext`
            with ``worker_index`` the sub-process number plus 1 and ``vector_index`` the
            copy's place in that process (RLlib's numbering).
        num_envs: How many copies.
        envs_per_process: How many copies each sub-process holds (stepped one after the other).
        seed: The seed of the first :meth:`reset_all` when it is given none. A restarted copy
            is then seeded too (``seed + i + num_envs * restarts``), so runs repeat.
        render_mode: The Gymnasium render mode to ask each copy for.
        step_timeout: Seconds a sub-process may take to answer a step.
        reset_timeout: Seconds a sub-process may take to start (make its copies) or to reset.
        max_restarts: Restarts in a row of one sub-process, without a successful step, after
            which it is given up.
        mp_context: The ``multiprocessing`` start method (``"fork"``, ``"spawn"``,
            ``"forkserver"``) or context; default ``fork`` where it exists. With ``spawn``
            the env and its config must be picklable.

    Attributes:
        restarts: How many times a sub-process was restarted.
        episodes_failed: How many episodes were abandoned because their sub-process failed.

    Raises:
        ConfigError: A bad argument, or what the creator makes is not a ``gymnasium.Env``.
        RuntimeError: A sub-process could not make its copies.
    """

    def __init__(
        self,
        env: EnvSpec,
        env_config: Mapping[str, Any] | None = None,
        *,
        num_envs: int = 1,
        envs_per_process: int = 1,
        seed: int | None = None,
        render_mode: str | None = None,
        step_timeout: float = 60.0,
        reset_timeout: float = 60.0,
        max_restarts: int = 3,
        mp_context: str | BaseContext | None = None,
    ) -> None:
        if num_envs < 1 or envs_per_process < 1:
            raise ConfigError(
                f"num_envs and envs_per_process must be at least 1, got {num_envs} and "
                f"{envs_per_process}"
            )
        if step_timeout <= 0 or reset_timeout <= 0:
            raise ConfigError("step_timeout and reset_timeout must be positive seconds")
        if isinstance(mp_context, BaseContext):
            self._ctx: BaseContext = mp_context
        else:
            default = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
            self._ctx = mp.get_context(mp_context or default)
        self._env_name = env if isinstance(env, str) else getattr(env, "__qualname__", repr(env))
        self.num_envs = num_envs
        self.step_timeout = step_timeout
        self.reset_timeout = reset_timeout
        self.max_restarts = max_restarts
        self.restarts = 0
        self.episodes_failed = 0
        self._seed = seed
        self._base_seed: int | None = None
        self._started = False
        context = EnvContext(env_config)
        self._workers: list[_Worker] = []
        for w, start in enumerate(range(0, num_envs, envs_per_process)):
            copies = range(start, min(start + envs_per_process, num_envs))
            ctxs = [
                context.copy_with(worker_index=w + 1, vector_index=j) for j in range(len(copies))
            ]
            creators = [env_creator(env, c, render_mode=render_mode) for c in ctxs]
            self._workers.append(_Worker(w, copies, creators))
        try:
            for worker in self._workers:
                self._spawn(worker)
            answers = self._gather(self._workers, reset_timeout)
            spaces = []
            for worker in self._workers:
                answer = answers[worker.index]
                if isinstance(answer, _Failure):
                    raise RuntimeError(
                        f"env {self._env_name} could not be made in its sub-process: "
                        f"{answer.reason}\n{answer.details}"
                    )
                spaces.append(answer)
        except BaseException:
            self.close()
            raise
        self.observation_space, self.action_space = spaces[0]
        for obs_space, act_space in spaces[1:]:
            if obs_space != self.observation_space or act_space != self.action_space:
                self.close()
                raise ConfigError(
                    f"copies of env {self._env_name} have different spaces ({obs_space} / "
                    f"{act_space} vs {self.observation_space} / {self.action_space}): every "
                    "copy must have the same spaces"
                )
        self._stacker = ObsStacker(self.observation_space)
        super().__init__()

    # -- sub-process handling -------------------------------------------------------------

    def _spawn(self, worker: _Worker) -> None:
        parent_conn, child_conn = self._ctx.Pipe(duplex=True)
        inherited: list[Connection] = []
        if self._ctx.get_start_method() == "fork":
            inherited = [parent_conn] + [
                w.conn for w in self._workers if w.conn is not None and w is not worker
            ]
        process = self._ctx.Process(  # type: ignore[attr-defined]
            target=_worker,
            args=(child_conn, worker.creators, inherited),
            name=f"rlserve-env-{worker.index}",
            daemon=True,
        )
        process.start()
        child_conn.close()
        worker.process, worker.conn = process, parent_conn

    def _kill(self, worker: _Worker) -> None:
        if worker.process is not None:
            if worker.process.is_alive():
                worker.process.kill()
            worker.process.join(timeout=_CLOSE_WAIT_S)
        if worker.conn is not None:
            worker.conn.close()
        worker.process, worker.conn = None, None

    def _died(self, worker: _Worker) -> str:
        return death_reason(worker.process, "sub-process")

    def _gather(self, workers: Sequence[_Worker], timeout: float) -> dict[int, Any]:
        """Each worker's answer by index: its result, or a :class:`_Failure`."""
        answers: dict[int, Any] = {}
        pending = {w.conn: w for w in workers if w.conn is not None}
        deadline = time.monotonic() + timeout
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            for conn in wait(list(pending), timeout=remaining):
                assert isinstance(conn, Connection)
                worker = pending.pop(conn)
                try:
                    message = conn.recv()
                except (EOFError, OSError):
                    answers[worker.index] = _Failure(self._died(worker))
                    continue
                if message[0] == "ok":
                    answers[worker.index] = message[1]
                elif message[0] == "config_error":
                    # Multi-agent envs in sub-processes (not wired yet) end here too.
                    raise ConfigError(f"in its sub-process: {message[1]}")
                else:
                    answers[worker.index] = _Failure(f"env raised {message[1]}", message[2])
        for worker in pending.values():
            answers[worker.index] = _Failure(
                f"sub-process did not answer within {timeout:g} s and was killed"
            )
        return answers

    def _send(self, worker: _Worker, command: str, data: Any) -> _Failure | None:
        if worker.conn is None:  # given up on after a RuntimeError
            return _Failure("sub-process is not running")
        try:
            worker.conn.send((command, data))
        except (OSError, ValueError):
            return _Failure(self._died(worker))
        return None

    def _seeds(self, worker: _Worker, base: int | None) -> list[int | None]:
        return [None if base is None else base + i for i in worker.copies]

    def _fail(self, worker: _Worker, failure: _Failure, during: str) -> None:
        """Count a failure, log it, kill the process; raise when the worker is given up."""
        worker.failures += 1
        self._kill(worker)
        first, last = worker.copies.start, worker.copies.stop - 1
        copies = f"copy {first}" if first == last else f"copies {first}..{last}"
        if worker.failures > self.max_restarts:
            raise RuntimeError(
                f"env {self._env_name} ({copies}) failed {worker.failures} times in a row "
                f"without a successful step; last error during {during}: {failure.reason}"
                + (f"\n{failure.details}" if failure.details else "")
            )
        logger.warning(
            "env %s (%s) failed during %s: %s; restarting its sub-process%s",
            self._env_name,
            copies,
            during,
            failure.reason,
            f"\n{failure.details}" if failure.details else "",
        )

    def _restart(self, worker: _Worker) -> list[tuple[Any, dict[str, Any]]]:
        """Restart ``worker`` until its copies are made and reset; their first obs and infos."""
        while True:
            self.restarts += 1
            base = None
            if self._base_seed is not None:
                base = self._base_seed + self.num_envs * self.restarts
            self._spawn(worker)
            answer = self._gather([worker], self.reset_timeout)[worker.index]
            if not isinstance(answer, _Failure):
                failure = self._send(worker, "reset", self._seeds(worker, base))
                if failure is None:
                    answer = self._gather([worker], self.reset_timeout)[worker.index]
                else:
                    answer = failure
            if not isinstance(answer, _Failure):
                result: list[tuple[Any, dict[str, Any]]] = answer
                return result
            self._fail(worker, answer, "restart")

    # -- the VectorEnvSource interface ------------------------------------------------------

    def reset_all(self, seed: int | None = None) -> tuple[np.ndarray, list[dict[str, Any]]]:
        """Reset every copy in parallel; copy ``i`` is seeded with ``seed + i``.

        Args:
            seed: The base seed; ``None`` uses the constructor's ``seed`` the first time, and
                no seed after that.

        Returns:
            The stacked first observations and each copy's reset info.

        Raises:
            RuntimeError: A sub-process keeps failing (see the class doc).
        """
        if seed is None:
            seed, self._seed = self._seed, None
        if seed is not None:
            self._base_seed = seed
            self.action_space.seed(seed)
        results: list[Any] = [None] * self.num_envs
        sent = [w for w in self._workers if self._send(w, "reset", self._seeds(w, seed)) is None]
        answers = self._gather(sent, self.reset_timeout)
        for worker in self._workers:
            answer = answers.get(worker.index) or _Failure(self._died(worker))
            if isinstance(answer, _Failure):
                self._fail(worker, answer, "reset")
                answer = self._restart(worker)
            results[worker.copies.start : worker.copies.stop] = answer
        self._started = True
        obs = self._stacker.stack([r[0] for r in results])
        return obs, [r[1] for r in results]

    def step_all(self, actions: Any) -> StepBatch:
        """Step every copy with ``actions[i]``, all sub-processes in parallel.

        Args:
            actions: One action per copy, indexable by copy (a list or a stacked array).

        Returns:
            The stacked results; copies of a failed sub-process are in ``failed``.

        Raises:
            RuntimeError: :meth:`reset_all` was not called, or a sub-process keeps failing.
        """
        if not self._started:
            raise RuntimeError("ProcessVectorSource.step_all before reset_all: reset first")
        n = self.num_envs
        obs: list[Any] = [None] * n
        rewards = np.zeros(n, dtype=np.float64)
        terminated = np.zeros(n, dtype=np.bool_)
        truncated = np.zeros(n, dtype=np.bool_)
        batch = StepBatch(
            obs=np.empty(0), rewards=rewards, terminated=terminated, truncated=truncated
        )
        failures: dict[int, _Failure] = {}
        sent = []
        for worker in self._workers:
            chunk = actions[worker.copies.start : worker.copies.stop]
            failure = self._send(worker, "step", chunk)
            if failure is None:
                sent.append(worker)
            else:
                failures[worker.index] = failure
        answers = self._gather(sent, self.step_timeout)
        for worker in self._workers:
            answer = failures.get(worker.index) or answers[worker.index]
            start, stop = worker.copies.start, worker.copies.stop
            if isinstance(answer, _Failure):
                self.episodes_failed += len(worker.copies)
                self._fail(worker, answer, "step")
                restarted = self._restart(worker)
                for j, (first_obs, info) in enumerate(restarted):
                    obs[start + j] = first_obs
                    batch.failed[start + j] = answer.reason
                    if info:
                        batch.reset_infos[start + j] = info
                continue
            worker.failures = 0
            c_obs, c_rewards, c_term, c_trunc, c_final, c_infos, c_reset_infos = answer
            obs[start:stop] = c_obs
            rewards[start:stop] = c_rewards
            terminated[start:stop] = c_term
            truncated[start:stop] = c_trunc
            for j, value in c_final.items():
                batch.final_obs[start + j] = value
            for j, info in c_infos.items():
                batch.infos[start + j] = info
            for j, info in c_reset_infos.items():
                batch.reset_infos[start + j] = info
        batch.obs = self._stacker.stack(obs)
        return batch

    def close(self) -> None:
        """Ask every sub-process to exit, kill those that do not, and reap them all."""
        for worker in self._workers:
            if worker.conn is not None:
                with contextlib.suppress(OSError, ValueError):
                    worker.conn.send(("close", None))
        deadline = time.monotonic() + _CLOSE_WAIT_S
        for worker in self._workers:
            if worker.process is not None:
                worker.process.join(timeout=max(0.0, deadline - time.monotonic()))
            self._kill(worker)

    def __del__(self) -> None:
        # A source dropped without close() must not leave processes behind until exit.
        if sys.is_finalizing():
            return
        with contextlib.suppress(Exception):
            self.close()


def death_reason(process: Any, what: str) -> str:
    """Why a child ``process`` (a ``multiprocessing`` process, named ``what``) stopped answering.

    Waits up to a second for it to end: killed by a signal, exited with a code, or (still
    running, or never started) it closed its pipe.
    """
    if process is not None:
        process.join(timeout=1.0)
        code = process.exitcode
        if code is not None and code < 0:
            try:
                return f"{what} was killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"{what} was killed by signal {-code}"
        if code is not None:
            return f"{what} exited with code {code}"
    return f"{what} closed its pipe"
