"""The source that hosts an external env: ``run()`` in a thread, its calls handed over per poll.

:class:`ExternalEnvSource` turns an :class:`~rlserve.env.external.ExternalEnv` or
:class:`~rlserve.env.external.ExternalMultiAgentEnv` into an :class:`~rlserve.env.EnvSource`
(the rules of each poll are in :mod:`rlserve.env.external`): it takes at most one queued call
of each episode per poll, and wakes the threads waiting in ``get_action`` with the actions sent.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

from rlserve.env.base import SINGLE_AGENT, EnvId, EnvSource, Poll
from rlserve.env.external_episodes import ExternalBase, ExternalEpisode
from rlserve.env.multi_agent import agent_space
from rlserve.errors import ConfigError, EnvError

POLL_TIMEOUT = 0.05
"""Seconds ``poll`` waits for the simulator when nothing is ready (so the driver does not spin)."""


@dataclass(slots=True)
class ExternalPoll(Poll):
    """A :class:`~rlserve.env.Poll` that also names the episodes not to train on.

    Attributes:
        training_disabled: The env ids (episode ids) of this poll whose episode was started
            with ``training_enabled=False``.
    """

    training_disabled: set[EnvId] = field(default_factory=set)


class ExternalEnvSource(EnvSource):
    """Hosts an :class:`~rlserve.env.external.ExternalEnv` or its multi-agent form.

    What each poll holds is described in :mod:`rlserve.env.external`.

    Args:
        env: The external env; its ``run()`` starts on the first :meth:`poll`.
        poll_timeout: Seconds a poll waits for the simulator when nothing is ready.
    """

    def __init__(self, env: ExternalBase, poll_timeout: float = POLL_TIMEOUT):
        if not isinstance(env, ExternalBase):
            raise ConfigError(
                f"ExternalEnvSource hosts an ExternalEnv or ExternalMultiAgentEnv, got "
                f"{type(env).__name__}"
            )
        self.env = env
        self.env_name = type(env).__name__
        self.poll_timeout = poll_timeout
        self.observation_spaces = {}
        self.action_spaces = {}
        if not env.multi_agent:
            self.observation_spaces[SINGLE_AGENT] = env.observation_space
            self.action_spaces[SINGLE_AGENT] = env.action_space
        elif isinstance(env.observation_space, gym.spaces.Dict):
            for agent_id in env.observation_space.spaces:
                self._learn(agent_id)
        self._thread: threading.Thread | None = None
        self._waiting: dict[EnvId, set[Any]] = {}  # episode id -> agents asked to act

    @property
    def multi_agent(self) -> bool:
        """Whether the hosted env is an :class:`~rlserve.env.external.ExternalMultiAgentEnv`."""
        return self.env.multi_agent

    @property
    def running(self) -> bool:
        """Whether ``run()`` has started and not returned yet."""
        return self._thread is not None and self._thread.is_alive()

    def _learn(self, agent_id: Any) -> None:
        self.observation_spaces[agent_id] = agent_space(self.env, agent_id, "observation")
        self.action_spaces[agent_id] = agent_space(self.env, agent_id, "action")

    def _run(self) -> None:
        env = self.env
        try:
            env.run()
        except BaseException as exc:  # handed to the driver's next poll
            with env._cond:
                if not env._closed:
                    env._error = exc
                env._cond.notify_all()

    def poll(self) -> ExternalPoll:
        """Take at most one call of every episode that made one (waits briefly for one).

        Raises:
            EnvError: ``run()`` raised (the original exception is the cause).
        """
        env = self.env
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name=f"rlserve-external-{type(env).__name__}", daemon=True
            )
            self._thread.start()
        with env._cond:
            env._cond.wait_for(lambda: env._error is not None or self._ready(), self.poll_timeout)
            if env._error is not None:
                error = env._error
                raise EnvError(
                    f"{type(env).__name__}.run() raised {type(error).__name__}: {error}"
                ) from error
            return self._take()

    def _ready(self) -> bool:
        env = self.env
        return bool(env._ended_queue) or any(
            e.calls and eid not in self._waiting for eid, e in env._episodes.items()
        )

    def _take(self) -> ExternalPoll:
        """Move the first queued call of each episode into a poll (lock held)."""
        env = self.env
        poll = ExternalPoll()
        sources: list[tuple[str, ExternalEpisode]] = [*env._episodes.items(), *env._ended_queue]
        for episode_id, episode in sources:
            if not episode.calls or episode_id in self._waiting:
                continue
            call = episode.calls.popleft()
            poll.obs[episode_id] = call.obs
            if call.rewards:
                poll.rewards[episode_id] = call.rewards
            if call.infos:
                poll.infos[episode_id] = call.infos
            if call.off_policy is not None:
                poll.off_policy_actions[episode_id] = call.off_policy
            if call.terminated is not None and call.truncated is not None:
                poll.terminated[episode_id] = call.terminated
                poll.truncated[episode_id] = call.truncated
            if call.wants_action:
                self._waiting[episode_id] = set(call.obs)
            if not episode.training_enabled:
                poll.training_disabled.add(episode_id)
            if self.multi_agent:
                for agent_id in call.obs:
                    if agent_id not in self.observation_spaces:
                        self._learn(agent_id)
        if env._ended_queue:
            env._ended_queue = deque(item for item in env._ended_queue if item[1].calls)
        return poll

    def send_actions(self, actions: dict[EnvId, dict[str, Any]]) -> None:
        """Answer the ``get_action`` calls of the last poll (wakes their threads).

        Raises:
            EnvError: An action for an episode or agent that did not ask, or one missing.
        """
        env = self.env
        for episode_id, agent_actions in actions.items():
            wanted = self._waiting.get(episode_id)
            if wanted is None:
                raise EnvError(
                    f"send_actions: episode {episode_id!r} did not ask for an action in the last "
                    "poll (log_action and end_episode calls need none)"
                )
            if set(agent_actions) != wanted:
                raise EnvError(
                    f"send_actions for episode {episode_id!r}: actions for "
                    f"{sorted(map(str, agent_actions))}, but the agents that asked are "
                    f"{sorted(map(str, wanted))}"
                )
        missing = [eid for eid in self._waiting if eid not in actions]
        if missing:
            raise EnvError(
                f"send_actions: no action for episode {missing[0]!r}, which asked in the last "
                "poll; answer every get_action of a poll"
            )
        with env._cond:
            for episode_id, agent_actions in actions.items():
                episode = env._episodes.get(str(episode_id))
                if episode is not None:
                    episode.answer = dict(agent_actions)
            self._waiting.clear()
            env._cond.notify_all()

    def close(self) -> None:
        """Stop serving: threads blocked in ``get_action`` get an :class:`EnvError`."""
        env = self.env
        with env._cond:
            env._closed = True
            env._cond.notify_all()
