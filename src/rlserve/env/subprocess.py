"""Copies of a single-agent env in sub-processes, stepped in parallel, restarted when they fail.

Written by hand because Gymnasium's ``AsyncVectorEnv`` cannot restart one worker: a crashed or
hung sub-process breaks the whole vector env. Here a sub-process that raises, exits, is killed
or does not answer in time is killed if need be and started again; its copies' episodes are
reported in :attr:`StepBatch.failed` and the other copies go on untouched. Starting, watching,
killing and restarting the sub-processes is the
:class:`~rlserve.processes.supervisor.ProcessSupervisor`'s; this module owns what a sub-process
does, its messages, and how its failures become failed episodes.

Each sub-process holds ``envs_per_process`` copies and serves one duplex
``multiprocessing`` pipe. Messages are maps keyed by ``"type"``, as on the env-runner and
learner pipes: the parent sends ``{"type": "reset", "seeds": [...]}``, ``{"type": "step",
"actions": ...}`` or ``{"type": "close"}``; the child answers ``{"type": "ok", "result": ...}``,
``{"type": "error", "reason": ..., "traceback": ...}`` or, when its env cannot be made at all,
``{"type": "config_error", "reason": ...}``. Messages are plain values and numpy
arrays pickled by ``Connection.send`` (:data:`~rlserve.processes.wire.PICKLE`). The env creator
is handed over when the process starts: with the default ``fork`` context nothing is pickled, so
env classes defined in a ``__main__`` script without an ``if __name__ == "__main__"`` guard work
(with ``spawn`` they must be importable).
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext
from typing import Any

import numpy as np

from rlserve.env.base import StepBatch, VectorEnvSource
from rlserve.env.copies import EnvCopies
from rlserve.env.make import EnvContext, EnvSpec, env_creator
from rlserve.env.stacking import ObsStacker
from rlserve.errors import ConfigError
from rlserve.processes.child import enter_child
from rlserve.processes.restarts import Failure
from rlserve.processes.supervisor import ProcessSupervisor, SupervisedGroup
from rlserve.processes.wire import PICKLE

__all__ = ["ProcessVectorSource", "Supervise", "run_copies"]

Supervise = Callable[[list[str], int], SupervisedGroup]
"""``supervise(labels, max_restarts)``: the group that runs the workers of copies instead of
sub-processes (Ray actors: :func:`rlserve.cluster.envs.ray_env_group`). Its ``start(w,
creators)`` must make an :class:`~rlserve.env.copies.EnvCopies` from ``creators`` and answer
each message with its ``handle``; its first answer is the ``greeting``."""

logger = logging.getLogger("rlserve.env")

_CLOSE_WAIT_S = 2.0
"""How long ``close`` waits for a child to exit by itself before killing it."""


def run_copies(
    conn: Connection,
    creators: Sequence[Callable[[], Any]],
    inherited: Sequence[Connection],
) -> None:
    """The loop of one sub-process: make its copies, then answer ``reset``/``step`` commands."""
    enter_child(inherited)
    copies = EnvCopies(creators)
    try:
        with contextlib.suppress(OSError, ValueError):
            conn.send(copies.greeting)
        while not copies.done:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                return
            answer = copies.handle(message)
            if answer["type"] == "closed":
                return
            with contextlib.suppress(OSError, ValueError):
                conn.send(answer)
    finally:
        copies.close()


def _judge(slot: int, message: Any) -> Any:
    """A sub-process's answer: its result, or a failure."""
    if message["type"] == "ok":
        return message["result"]
    if message["type"] == "config_error":
        # Multi-agent envs in sub-processes (not wired yet) end here too.
        raise ConfigError(f"in its sub-process: {message['reason']}")
    return Failure(f"env raised {message['reason']}", message["traceback"])


@dataclass
class _Worker:
    """One sub-process's share: the copies it holds and how to make them."""

    copies: range
    creators: list[Callable[[], Any]]


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
        supervise: Run the workers elsewhere than in sub-processes (:data:`Supervise`): Ray
            actors, with the same parallel steps, timeouts, restarts and failed episodes.

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
        supervise: Supervise | None = None,
    ) -> None:
        if num_envs < 1 or envs_per_process < 1:
            raise ConfigError(
                f"num_envs and envs_per_process must be at least 1, got {num_envs} and "
                f"{envs_per_process}"
            )
        if step_timeout <= 0 or reset_timeout <= 0:
            raise ConfigError("step_timeout and reset_timeout must be positive seconds")
        self._env_name = env if isinstance(env, str) else getattr(env, "__qualname__", repr(env))
        self.num_envs = num_envs
        self.step_timeout = step_timeout
        self.reset_timeout = reset_timeout
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
            self._workers.append(_Worker(copies, creators))
        labels = [f"env {self._env_name} ({_copies_text(w.copies)})" for w in self._workers]
        self._supervisor: SupervisedGroup
        if supervise is not None:
            self._supervisor = supervise(labels, max_restarts)
        else:
            self._supervisor = ProcessSupervisor(
                [f"rlserve-env-{w}" for w in range(len(self._workers))],
                labels,
                run_copies,
                what="sub-process",
                wire=PICKLE,
                close_message={"type": "close"},
                logger=logger,
                restart_note="its sub-process",
                success="step",
                max_restarts=max_restarts,
                close_wait_s=_CLOSE_WAIT_S,
                context=mp_context,
            )
        try:
            for w, worker in enumerate(self._workers):
                self._supervisor.start(w, worker.creators)
            answers = self._supervisor.gather(range(len(self._workers)), reset_timeout, _judge)
            spaces = []
            for w in range(len(self._workers)):
                answer = answers[w]
                if isinstance(answer, Failure):
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

    @property
    def restarts(self) -> int:
        """How many times a sub-process was restarted."""
        return self._supervisor.restarts

    # -- sub-process handling -------------------------------------------------------------

    def _seeds(self, w: int, base: int | None) -> list[int | None]:
        return [None if base is None else base + i for i in self._workers[w].copies]

    def _send_each(
        self, message: Callable[[int], dict[str, Any]], timeout: float
    ) -> dict[int, Any]:
        """Send ``message(w)`` to every sub-process ``w``; each one's answer or failure."""
        failures = {}
        for w in range(len(self._workers)):
            failure = self._supervisor.send(w, message(w))
            if failure is not None:
                failures[w] = failure
        sent = [w for w in range(len(self._workers)) if w not in failures]
        return {**self._supervisor.gather(sent, timeout, _judge), **failures}

    def _restart(self, w: int) -> list[tuple[Any, dict[str, Any]]]:
        """Restart sub-process ``w`` until its copies are made and reset; first obs and infos."""

        def bring_up() -> Any:
            base = None
            if self._base_seed is not None:
                base = self._base_seed + self.num_envs * self._supervisor.restarts
            self._supervisor.start(w, self._workers[w].creators)
            answer = self._supervisor.gather([w], self.reset_timeout, _judge)[w]
            if isinstance(answer, Failure):
                return answer
            failure = self._supervisor.send(w, {"type": "reset", "seeds": self._seeds(w, base)})
            return failure or self._supervisor.gather([w], self.reset_timeout, _judge)[w]

        result: list[tuple[Any, dict[str, Any]]] = self._supervisor.restart(w, bring_up)
        return result

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
        answers = self._send_each(
            lambda w: {"type": "reset", "seeds": self._seeds(w, seed)}, self.reset_timeout
        )
        for w, worker in enumerate(self._workers):
            answer = answers[w]
            if isinstance(answer, Failure):
                self._supervisor.fail(w, answer, "reset")
                answer = self._restart(w)
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
        copies = [w.copies for w in self._workers]
        answers = self._send_each(
            lambda w: {"type": "step", "actions": actions[copies[w].start : copies[w].stop]},
            self.step_timeout,
        )
        for w, worker in enumerate(self._workers):
            answer = answers[w]
            start, stop = worker.copies.start, worker.copies.stop
            if isinstance(answer, Failure):
                self.episodes_failed += len(worker.copies)
                self._supervisor.fail(w, answer, "step")
                restarted = self._restart(w)
                for j, (first_obs, info) in enumerate(restarted):
                    obs[start + j] = first_obs
                    batch.failed[start + j] = answer.reason
                    if info:
                        batch.reset_infos[start + j] = info
                continue
            self._supervisor.succeeded(w)
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
        self._supervisor.stop()

    def __del__(self) -> None:
        # A source dropped without close() must not leave processes behind until exit.
        if sys.is_finalizing():
            return
        with contextlib.suppress(Exception):
            self.close()


def _copies_text(copies: range) -> str:
    first, last = copies.start, copies.stop - 1
    return f"copy {first}" if first == last else f"copies {first}..{last}"
