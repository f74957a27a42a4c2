"""The workers that hold the copies of one remote env, for both remote sources.

:class:`CopyWorkers` splits ``num_envs`` copies into workers of ``envs_per_process`` copies,
starts each worker (a sub-process, or what ``supervise`` makes: Ray actors), and reads their
greetings: whether the env is single-agent or multi-agent, and its spaces. The single-agent
:class:`~rlserve.env.ProcessVectorSource` and the multi-agent
:class:`~rlserve.env.subprocess_multi.ProcessMultiAgentSource` both drive their copies through
it, so both get the same parallel steps, timeouts, restarts and backends.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext
from typing import Any

from rlserve.env.copies import EnvCopies
from rlserve.env.make import EnvContext, EnvSpec, env_creator, env_label
from rlserve.errors import ConfigError
from rlserve.processes.child import enter_child
from rlserve.processes.restarts import Failure
from rlserve.processes.supervisor import ProcessSupervisor, SupervisedGroup
from rlserve.processes.wire import PICKLE

__all__ = ["CopyWorkers", "Supervise", "run_copies", "workers_of"]

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


def judge(slot: int, message: Any) -> Any:
    """A worker's answer: its result, or a failure.

    Raises:
        ConfigError: The worker cannot make its copies, or the env declares no space for an
            agent it shows.
    """
    if message["type"] == "ok":
        return message["result"]
    if message["type"] == "config_error":
        raise ConfigError(f"in its sub-process: {message['reason']}")
    return Failure(f"env raised {message['reason']}", message["traceback"])


@dataclass
class _Worker:
    """One worker's share: the copies it holds and how to make them."""

    copies: range
    creators: list[Callable[[], Any]]


class CopyWorkers:
    """``num_envs`` copies of one env in workers of ``envs_per_process`` copies each, started.

    Args:
        env: What names the env (see :func:`rlserve.env.make_env`); not an instance.
        env_config: The settings handed to each copy's creator, as an :class:`EnvContext`
            with ``worker_index`` the worker's number plus 1 and ``vector_index`` the copy's
            place in that worker (RLlib's numbering).
        num_envs: How many copies.
        envs_per_process: How many copies each worker holds (stepped one after the other).
        render_mode: The Gymnasium render mode to ask each copy for.
        reset_timeout: Seconds a worker may take to start (make its copies).
        max_restarts: Restarts in a row of one worker, without a successful step, after which
            it is given up.
        mp_context: The ``multiprocessing`` start method or context (default ``fork``).
        supervise: Run the workers elsewhere than in sub-processes (:data:`Supervise`).

    Attributes:
        env_name: The env's name, for messages.
        multi_agent: Whether the copies are multi-agent envs (PettingZoo ones wrapped).
        greetings: Each worker's first result (see :class:`~rlserve.env.copies.EnvCopies`).
        supervisor: Starts, watches, kills and restarts the workers.

    Raises:
        ConfigError: A bad argument, or the copies are not envs; workers disagree on the kind.
        RuntimeError: A worker could not make its copies.
    """

    def __init__(
        self,
        env: EnvSpec,
        env_config: Mapping[str, Any] | None = None,
        *,
        num_envs: int = 1,
        envs_per_process: int = 1,
        render_mode: str | None = None,
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
        self.env_name = env_label(env)
        self.num_envs = num_envs
        context = EnvContext(env_config)
        self._workers: list[_Worker] = []
        for w, start in enumerate(range(0, num_envs, envs_per_process)):
            copies = range(start, min(start + envs_per_process, num_envs))
            ctxs = [
                context.copy_with(worker_index=w + 1, vector_index=j) for j in range(len(copies))
            ]
            creators = [env_creator(env, c, render_mode=render_mode, any_kind=True) for c in ctxs]
            self._workers.append(_Worker(copies, creators))
        labels = [f"env {self.env_name} ({_copies_text(w.copies)})" for w in self._workers]
        self.supervisor: SupervisedGroup
        if supervise is not None:
            self.supervisor = supervise(labels, max_restarts)
        else:
            self.supervisor = ProcessSupervisor(
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
        self.reset_timeout = reset_timeout
        try:
            for w in range(len(self._workers)):
                self.start(w)
            answers = self.supervisor.gather(range(len(self._workers)), reset_timeout, judge)
            self.greetings: list[dict[str, Any]] = []
            for w in range(len(self._workers)):
                answer = answers[w]
                if isinstance(answer, Failure):
                    raise RuntimeError(
                        f"env {self.env_name} could not be made in its sub-process: "
                        f"{answer.reason}\n{answer.details}"
                    )
                self.greetings.append(answer)
            kinds = {bool(g["multi_agent"]) for g in self.greetings}
            if len(kinds) > 1:
                raise ConfigError(
                    f"copies of env {self.env_name} are of different kinds (some multi-agent, "
                    "some not): every copy must be made the same way"
                )
        except BaseException:
            self.close()
            raise
        self.multi_agent = kinds.pop()

    def __len__(self) -> int:
        return len(self._workers)

    def copies(self, w: int) -> range:
        """The copies worker ``w`` holds."""
        return self._workers[w].copies

    def worker_of(self, copy: int) -> int:
        """The worker that holds ``copy``."""
        for w, worker in enumerate(self._workers):
            if copy in worker.copies:
                return w
        raise IndexError(f"copy {copy} is not one of the {self.num_envs} copies")

    def start(self, w: int) -> None:
        """Start worker ``w`` (not running): it makes its copies and greets."""
        self.supervisor.start(w, self._workers[w].creators)

    def send_each(
        self, message: Callable[[int], dict[str, Any] | None], timeout: float
    ) -> dict[int, Any]:
        """Send ``message(w)`` to every worker ``w`` (none when it is None), then await them.

        Returns:
            Each asked worker's answer or :class:`Failure`.
        """
        failures = {}
        sent = []
        for w in range(len(self._workers)):
            body = message(w)
            if body is None:
                continue
            failure = self.supervisor.send(w, body)
            if failure is None:
                sent.append(w)
            else:
                failures[w] = failure
        return {**self.supervisor.gather(sent, timeout, judge), **failures}

    def restart(self, w: int, reset: Callable[[], dict[str, Any]]) -> Any:
        """Restart worker ``w`` until its copies are made and answer ``reset()``; that answer.

        Raises:
            RuntimeError: The worker is given up (the supervisor's restart policy).
        """

        def bring_up() -> Any:
            message = reset()  # before the start: a seed counts this restart
            self.start(w)
            answer = self.supervisor.gather([w], self.reset_timeout, judge)[w]
            if isinstance(answer, Failure):
                return answer
            failure = self.supervisor.send(w, message)
            return failure or self.supervisor.gather([w], self.reset_timeout, judge)[w]

        return self.supervisor.restart(w, bring_up)

    def close(self) -> None:
        """Ask every worker to exit, kill those that do not, and reap them all."""
        self.supervisor.stop()


def workers_of(
    env: EnvSpec | CopyWorkers,
    env_config: Mapping[str, Any] | None,
    *,
    num_envs: int,
    envs_per_process: int,
    render_mode: str | None,
    step_timeout: float,
    reset_timeout: float,
    max_restarts: int,
    mp_context: str | BaseContext | None,
    supervise: Supervise | None,
) -> CopyWorkers:
    """``env`` when it is workers already, else new workers making its copies.

    The arguments are the remote sources' (:class:`~rlserve.env.subprocess.ProcessVectorSource`
    and :class:`~rlserve.env.subprocess_multi.ProcessMultiAgentSource`).

    Raises:
        ConfigError: A timeout that is not positive, or a bad argument of the workers.
    """
    if step_timeout <= 0 or reset_timeout <= 0:
        raise ConfigError("step_timeout and reset_timeout must be positive seconds")
    if isinstance(env, CopyWorkers):
        return env
    return CopyWorkers(
        env,
        env_config,
        num_envs=num_envs,
        envs_per_process=envs_per_process,
        render_mode=render_mode,
        reset_timeout=reset_timeout,
        max_restarts=max_restarts,
        mp_context=mp_context,
        supervise=supervise,
    )


def _copies_text(copies: Sequence[int]) -> str:
    first, last = copies[0], copies[-1]
    return f"copy {first}" if first == last else f"copies {first}..{last}"
