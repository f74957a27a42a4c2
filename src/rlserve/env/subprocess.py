"""Copies of a single-agent env in sub-processes, stepped in parallel, restarted when they fail.

(Multi-agent copies: :mod:`rlserve.env.subprocess_multi`, on the same workers.)

Written by hand because Gymnasium's ``AsyncVectorEnv`` cannot restart one worker: a crashed or
hung sub-process breaks the whole vector env. Here a sub-process that raises, exits, is killed
or does not answer in time is killed if need be and started again; its copies' episodes are
reported in :attr:`StepBatch.failed` and the other copies go on untouched. Starting, watching,
killing and restarting the sub-processes is the
:class:`~rlserve.processes.supervisor.ProcessSupervisor`'s, making them and reading their
greetings :class:`~rlserve.env.copy_workers.CopyWorkers`'; this module owns the messages of a
single-agent worker and how its failures become failed episodes.

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
import sys
from collections.abc import Mapping
from multiprocessing.context import BaseContext
from typing import Any

import numpy as np

from rlserve.env.base import StepBatch, VectorEnvSource
from rlserve.env.copy_workers import CopyWorkers, Supervise, run_copies, workers_of
from rlserve.env.make import EnvSpec
from rlserve.env.stacking import ObsStacker
from rlserve.errors import ConfigError
from rlserve.processes.restarts import Failure

__all__ = ["ProcessVectorSource", "Supervise", "run_copies"]


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
        env: What names the env (see :func:`rlserve.env.make_env`); not an instance. Or its
            workers already started (:func:`~rlserve.env.to_source` starts them to learn the
            env's kind); the worker options are then theirs.
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
        env: EnvSpec | CopyWorkers,
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
        workers = workers_of(
            env,
            env_config,
            num_envs=num_envs,
            envs_per_process=envs_per_process,
            render_mode=render_mode,
            step_timeout=step_timeout,
            reset_timeout=reset_timeout,
            max_restarts=max_restarts,
            mp_context=mp_context,
            supervise=supervise,
        )
        self._workers = workers
        self.env_name = workers.env_name
        if workers.multi_agent:
            workers.close()
            raise ConfigError(
                f"env {workers.env_name} is a multi-agent env: host it with "
                "rlserve.env.to_source(..., remote=True) (a ProcessMultiAgentSource)"
            )
        self.num_envs = workers.num_envs
        self.step_timeout = step_timeout
        self.reset_timeout = reset_timeout
        self.episodes_failed = 0
        self._seed = seed
        self._base_seed: int | None = None
        self._started = False
        spaces = [g["spaces"] for g in workers.greetings]
        self.observation_space, self.action_space = spaces[0]
        for obs_space, act_space in spaces[1:]:
            if obs_space != self.observation_space or act_space != self.action_space:
                self.close()
                raise ConfigError(
                    f"copies of env {workers.env_name} have different spaces ({obs_space} / "
                    f"{act_space} vs {self.observation_space} / {self.action_space}): every "
                    "copy must have the same spaces"
                )
        self._stacker = ObsStacker(self.observation_space)
        super().__init__()

    @property
    def restarts(self) -> int:
        """How many times a sub-process was restarted."""
        return self._workers.supervisor.restarts

    # -- sub-process handling -------------------------------------------------------------

    def _seeds(self, w: int, base: int | None) -> list[int | None]:
        return [None if base is None else base + i for i in self._workers.copies(w)]

    def _restart(self, w: int) -> list[tuple[Any, dict[str, Any]]]:
        """Restart sub-process ``w`` until its copies are made and reset; first obs and infos."""

        def reset() -> dict[str, Any]:
            base = None
            if self._base_seed is not None:
                base = self._base_seed + self.num_envs * self._workers.supervisor.restarts
            return {"type": "reset", "seeds": self._seeds(w, base)}

        result: list[tuple[Any, dict[str, Any]]] = self._workers.restart(w, reset)
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
        workers = self._workers
        answers = workers.send_each(
            lambda w: {"type": "reset", "seeds": self._seeds(w, seed)}, self.reset_timeout
        )
        for w in range(len(workers)):
            answer = answers[w]
            if isinstance(answer, Failure):
                workers.supervisor.fail(w, answer, "reset")
                answer = self._restart(w)
            results[workers.copies(w).start : workers.copies(w).stop] = answer
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
        workers = self._workers
        copies = [workers.copies(w) for w in range(len(workers))]
        answers = workers.send_each(
            lambda w: {"type": "step", "actions": actions[copies[w].start : copies[w].stop]},
            self.step_timeout,
        )
        for w, own in enumerate(copies):
            answer = answers[w]
            start, stop = own.start, own.stop
            if isinstance(answer, Failure):
                self.episodes_failed += len(own)
                workers.supervisor.fail(w, answer, "step")
                restarted = self._restart(w)
                for j, (first_obs, info) in enumerate(restarted):
                    obs[start + j] = first_obs
                    batch.failed[start + j] = answer.reason
                    if info:
                        batch.reset_infos[start + j] = info
                continue
            workers.supervisor.succeeded(w)
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
        self._workers.close()

    def __del__(self) -> None:
        # A source dropped without close() must not leave processes behind until exit.
        if sys.is_finalizing():
            return
        with contextlib.suppress(Exception):
            self.close()
