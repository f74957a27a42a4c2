"""Copies of a multi-agent env in sub-processes (or Ray actors), stepped in parallel.

:class:`ProcessMultiAgentSource` is a :class:`~rlserve.env.MultiAgentSource` whose copies live
in the workers of :class:`~rlserve.env.copy_workers.CopyWorkers`, the same workers, messages
wire and backends as the single-agent :class:`~rlserve.env.ProcessVectorSource`. The source
keeps its bookkeeping and its checks in this process (which agents wait for an action, which
are done, ``__all__``, malformed results), so a copy behaves exactly as in process; only each
copy's ``reset`` and ``step`` run in its worker, every worker's step sent before any answer is
awaited. A worker resets a copy whose episode is over in the same call, as the in-process
source does, and reports the spaces of agents it shows for the first time (agents that join).

A worker that raises, exits, is killed or does not answer within ``step_timeout`` is killed and
started again: each of its copies' episodes is reported in ``Poll.failed`` with the next
episode's first observations in ``Poll.reset_obs``, and counted in :attr:`episodes_failed`.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Mapping
from multiprocessing.context import BaseContext
from typing import Any

from rlserve.env.base import EnvId, Poll
from rlserve.env.copy_workers import CopyWorkers, Supervise, workers_of
from rlserve.env.make import EnvSpec
from rlserve.env.multi_agent import MultiAgentSource
from rlserve.errors import ConfigError, EnvError
from rlserve.processes.restarts import Failure

__all__ = ["ProcessMultiAgentSource"]


class _CopyView:
    """What this process holds of one remote copy: its agents' spaces and its latest reset.

    The in-process source reads an env's spaces and calls its ``reset``; a view answers the
    same from what the copy's worker sent (the spaces dicts are shared by every view, as an
    agent's space is learnt once).
    """

    def __init__(
        self,
        agents: list[Any],
        observation_spaces: dict[Any, Any],
        action_spaces: dict[Any, Any],
    ) -> None:
        self.possible_agents = agents
        self.observation_spaces = observation_spaces
        self.action_spaces = action_spaces
        self.pending: Any = None
        """The copy's latest reset result, not yet read."""

    def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
        """The reset the worker already did (with its seed)."""
        pending, self.pending = self.pending, None
        if pending is None:
            raise RuntimeError("a remote copy was read for a reset its worker did not do")
        return pending


class ProcessMultiAgentSource(MultiAgentSource):
    """``num_envs`` copies of a multi-agent env in sub-processes, stepped in parallel.

    Copies behave as in :class:`~rlserve.env.MultiAgentSource` (copy ``i``'s first reset
    seeded with ``seed + i``, auto-reset in the same poll, the same checks), so the same seed
    and actions give the same per-agent results.

    Args:
        env: What names the env (a MultiAgentEnv or PettingZoo env's class, registered id or
            creator); not an instance. Or its workers already started
            (:func:`~rlserve.env.to_source` starts them to learn the env's kind); the worker
            options are then theirs.
        env_config: The settings handed to each copy's creator (see
            :class:`~rlserve.env.ProcessVectorSource`).
        num_envs: How many copies.
        envs_per_process: How many copies each worker holds.
        seed: Seeds the first reset (copy ``i``: ``seed + i``); a restarted worker's copies
            are seeded ``seed + i + num_envs * restarts``. None: unseeded.
        render_mode: The render mode to ask each copy for.
        step_timeout: Seconds a worker may take to answer a step.
        reset_timeout: Seconds a worker may take to start or to reset.
        max_restarts: Restarts in a row of one worker, without a successful step, after which
            :meth:`send_actions` raises ``RuntimeError``.
        mp_context: The ``multiprocessing`` start method or context (default ``fork``).
        supervise: Run the workers elsewhere (Ray actors: :mod:`rlserve.cluster.envs`).

    Attributes:
        episodes_failed: Episodes abandoned because their worker failed.

    Raises:
        ConfigError: A bad argument, the env is not multi-agent, or its copies cannot be made.
        RuntimeError: A worker could not make its copies.
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
        if not workers.multi_agent:
            workers.close()
            raise ConfigError(
                f"env {workers.env_name} is a single-agent env: host it with "
                "rlserve.env.ProcessVectorSource (or to_source(..., remote=True))"
            )
        self.step_timeout = step_timeout
        self.reset_timeout = reset_timeout
        self.episodes_failed = 0
        first = workers.greetings[0]
        obs_spaces: dict[Any, Any] = {}
        act_spaces: dict[Any, Any] = {}
        for greeting in workers.greetings:
            self._learn_spaces(obs_spaces, act_spaces, greeting["spaces"])
        self._views = [
            _CopyView(list(first["agents"]), obs_spaces, act_spaces)
            for _ in range(workers.num_envs)
        ]
        super().__init__(self._views, seed=seed)
        self.env_name = workers.env_name
        for copy in self._copies:
            copy.name = str(first["name"])

    @property
    def restarts(self) -> int:
        """How many times a worker was restarted."""
        return self._workers.supervisor.restarts

    # -- the EnvSource interface -------------------------------------------------------------

    def poll(self) -> Poll:
        """The first poll resets every copy (in parallel); later ones the last step's results."""
        if not self._started:
            workers = self._workers
            answers = workers.send_each(
                lambda w: {"type": "reset", "seeds": self._seeds(w, self.seed)},
                self.reset_timeout,
            )
            for w in range(len(workers)):
                answer = answers[w]
                if isinstance(answer, Failure):
                    workers.supervisor.fail(w, answer, "reset")
                    answer = self._restart(w)
                self._take_resets(w, answer)
        return super().poll()

    def try_reset(self, env_id: EnvId) -> None:
        """Abandon copy ``env_id``'s episode; the next poll holds its new first observations.

        A worker that fails meanwhile is restarted, and its copies' episodes reported failed.
        """
        if not isinstance(env_id, int) or not 0 <= env_id < self.num_envs:
            raise EnvError(f"try_reset: env id {env_id!r} is not one of this source's copies")
        workers = self._workers
        w = workers.worker_of(env_id)
        j = env_id - workers.copies(w).start
        answer = workers.send_each(
            lambda k: {"type": "reset", "seeds": {j: None}} if k == w else None,
            self.reset_timeout,
        )[w]
        if isinstance(answer, Failure):
            poll = self._pending if self._pending is not None else Poll()
            self._lose(w, answer, "reset", poll)
            self._pending = poll
            return
        self._take_resets(w, answer)
        super().try_reset(env_id)

    def close(self) -> None:
        """Ask every worker to exit, kill those that do not, and reap them all."""
        self._workers.close()

    def __del__(self) -> None:
        # A source dropped without close() must not leave processes behind until exit.
        if sys.is_finalizing():
            return
        with contextlib.suppress(Exception):
            self.close()

    # -- the workers -------------------------------------------------------------------------

    def _step_copies(self, actions: dict[int, dict[Any, Any]], poll: Poll) -> dict[int, Any]:
        workers = self._workers
        own = [
            {j: actions[i] for j, i in enumerate(workers.copies(w)) if i in actions}
            for w in range(len(workers))
        ]
        answers = workers.send_each(
            lambda w: {"type": "step", "actions": own[w]} if own[w] else None, self.step_timeout
        )
        results: dict[int, Any] = {}
        for w in sorted(answers):
            answer = answers[w]
            if isinstance(answer, Failure):
                self._lose(w, answer, "step", poll)
                continue
            workers.supervisor.succeeded(w)
            start = workers.copies(w).start
            for j, (result, reset, spaces) in answer.items():
                self._learn(spaces)
                self._views[start + j].pending = reset
                results[start + j] = result
        return dict(sorted(results.items()))

    def _lose(self, w: int, failure: Failure, during: str, poll: Poll) -> None:
        """Restart failed worker ``w``; its copies' episodes go in ``poll`` as failed."""
        workers = self._workers
        self.episodes_failed += len(workers.copies(w))
        workers.supervisor.fail(w, failure, during)
        self._take_resets(w, self._restart(w))
        for i in workers.copies(w):
            obs, infos = self._reset(i, self._copies[i], None)
            for part in (poll.obs, poll.rewards, poll.terminated, poll.truncated, poll.infos):
                part.pop(i, None)
            poll.failed[i] = failure.reason
            poll.reset_obs[i] = obs
            if infos:
                poll.reset_infos[i] = infos

    def _seeds(self, w: int, base: int | None) -> dict[int, int | None]:
        copies = self._workers.copies(w)
        return {j: None if base is None else base + i for j, i in enumerate(copies)}

    def _restart(self, w: int) -> Any:
        """Restart worker ``w`` until its copies are made and reset; its reset answer."""

        def reset() -> dict[str, Any]:
            base = None
            if self.seed is not None:
                base = self.seed + self.num_envs * self._workers.supervisor.restarts
            return {"type": "reset", "seeds": self._seeds(w, base)}

        return self._workers.restart(w, reset)

    def _take_resets(self, w: int, answer: Mapping[int, Any]) -> None:
        start = self._workers.copies(w).start
        for j, (result, spaces) in answer.items():
            self._learn(spaces)
            self._views[start + j].pending = result

    def _learn(self, spaces: Mapping[Any, Any]) -> None:
        view = self._views[0]
        self._learn_spaces(view.observation_spaces, view.action_spaces, spaces)

    @staticmethod
    def _learn_spaces(obs: dict[Any, Any], act: dict[Any, Any], spaces: Mapping[Any, Any]) -> None:
        # The first copy to show an agent gives its space, as in process.
        for agent_id, (obs_space, act_space) in spaces.items():
            obs.setdefault(agent_id, obs_space)
            act.setdefault(agent_id, act_space)
