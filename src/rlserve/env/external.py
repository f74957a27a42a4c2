"""External environments: simulators that run their own loop and ask for actions, in process.

An :class:`ExternalEnv` turns RLlib's "the simulator drives, the trainer answers" setup into an
:class:`~rlserve.env.EnvSource`. The user subclasses it and implements :meth:`ExternalEnv.run`,
which calls the same methods as the network client :class:`rlserve.PolicyClient`, with the same
rules and errors: ``start_episode``, ``get_action`` (blocks until the trainer answers),
``log_action``, ``log_returns`` and ``end_episode``. :class:`ExternalMultiAgentEnv` is the same
with dicts keyed by agent id.

:class:`ExternalEnvSource` hosts one: its first ``poll`` starts ``run()`` in a daemon thread;
``run()`` may start more threads, and every method may be called from any of them. Each poll
hands over what the threads produced since the previous one:

* the env id is the episode id (a ``str``); a single-agent episode's agent is ``"agent0"``;
* a ``get_action`` is an observation that wants an action (answered by ``send_actions``);
* a ``log_action`` is an observation with its action in ``off_policy_actions``;
* ``rewards`` hold what ``log_returns`` added since the agent's previous action (delivered with
  the episode's next call; a multi-agent ``log_returns`` that marks agents done is delivered at
  once, with their flags);
* ``end_episode`` is a final observation with ``"__all__"`` terminated (or truncated);
* a poll holds at most one call per episode: calls an episode made faster than the trainer
  polls wait their turn, in order, so no step is merged with another.

Episodes started with ``training_enabled=False`` are named in the poll's
:attr:`ExternalPoll.training_disabled` on every poll that mentions them: act for them, but keep
their steps out of training. An exception raised by ``run()`` is raised by the next ``poll`` (as
:class:`~rlserve.errors.EnvError`, with the original as its cause).

This module holds the two env classes and the checks of their arguments; the episode bookkeeping
they share is :mod:`rlserve.env.external_episodes`, the source
:mod:`rlserve.env.external_source` (its names are importable from here too).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from rlserve.env.base import SINGLE_AGENT
from rlserve.env.external_episodes import ExternalBase
from rlserve.env.external_source import ExternalEnvSource, ExternalPoll
from rlserve.env.multi_agent import agent_space
from rlserve.errors import ConfigError, SpaceError
from rlserve.protocol.spaces import check_value
from rlserve.protocol.values import MAX_ABS_REWARD

__all__ = ["ExternalEnv", "ExternalEnvSource", "ExternalMultiAgentEnv", "ExternalPoll"]


class ExternalEnv(ExternalBase):
    """A single-agent simulator that runs its own loop; subclass it and implement :meth:`run`.

    Inside ``run()`` call :meth:`start_episode`, :meth:`get_action`, :meth:`log_action`,
    :meth:`log_returns` and :meth:`end_episode`, exactly as with :class:`rlserve.PolicyClient`.
    Host it with :class:`ExternalEnvSource`.

    Args:
        action_space: The actions the simulator takes.
        observation_space: What it observes; every observation is checked against it.
        max_concurrent: Most episodes open at once.
    """

    def get_action(self, episode_id: str, observation: Any) -> Any:
        """Record an observation and return the trainer's action (blocks until it comes).

        Raises:
            EpisodeError: Unknown or ended episode, or its previous get_action still waits.
            SpaceError: The observation does not fit ``observation_space``.
        """
        obs = check_value(self.observation_space, observation, "observation")
        return self._act(episode_id, {SINGLE_AGENT: obs}, "get_action")[SINGLE_AGENT]

    def log_action(self, episode_id: str, observation: Any, action: Any) -> None:
        """Record an observation and the action someone else took (trained on as taken).

        Raises:
            EpisodeError: Unknown or ended episode.
            SpaceError: The observation or action does not fit its space.
        """
        obs = check_value(self.observation_space, observation, "observation")
        value = check_value(self.action_space, action, "action")
        self._log_action(episode_id, {SINGLE_AGENT: obs}, {SINGLE_AGENT: value}, "log_action")

    def log_returns(
        self, episode_id: str, reward: float, info: dict[str, Any] | None = None
    ) -> None:
        """Add reward to the episode's previous action (rewards add up until the next action).

        Args:
            episode_id: The episode.
            reward: A finite number.
            info: The environment's info map for this step; several merge.

        Raises:
            EpisodeError: Unknown or ended episode.
            SpaceError: The reward is not a finite number in range.
        """
        value = _check_reward(reward, episode_id)
        extra = _check_info(info, episode_id)
        self._add_returns(
            episode_id, {SINGLE_AGENT: value}, {SINGLE_AGENT: extra} if extra else {}, {}, {}
        )

    def end_episode(self, episode_id: str, observation: Any, truncated: bool = False) -> None:
        """Finish an episode with its final observation.

        Args:
            episode_id: The episode.
            observation: The final observation.
            truncated: True when a time limit cut the episode short (the trainer bootstraps
                from ``observation``); False for a terminal state.

        Raises:
            EpisodeError: Unknown or already ended episode.
            SpaceError: The observation does not fit ``observation_space``.
        """
        obs = check_value(self.observation_space, observation, "observation")
        self._end(episode_id, {SINGLE_AGENT: obs}, truncated)


class ExternalMultiAgentEnv(ExternalBase):
    """:class:`ExternalEnv` with several agents: values are dicts keyed by agent id.

    Args:
        action_space: A :class:`gymnasium.spaces.Dict` keyed by agent id, or one space every
            agent shares.
        observation_space: The same for observations.
        max_concurrent: Most episodes open at once.
    """

    multi_agent = True

    def _checked(self, values: Any, kind: str, call: str, episode_id: str) -> dict[Any, Any]:
        if not isinstance(values, Mapping):
            raise SpaceError(
                f"{call} for episode '{episode_id}': a multi-agent episode takes a dict of "
                f"{kind}s keyed by agent id, got {type(values).__name__}"
            )
        out = {}
        for agent_id, value in values.items():
            try:
                space = agent_space(self, agent_id, kind)
            except ConfigError as exc:
                raise SpaceError(f"{call} for episode '{episode_id}': {exc}") from None
            out[agent_id] = check_value(space, value, f"{kind}[{agent_id!r}]")
        return out

    def get_action(self, episode_id: str, observation: Any) -> Any:
        """Record each agent's observation and return their actions (blocks until they come).

        Args:
            episode_id: The episode.
            observation: Observations keyed by agent id, for exactly the agents that act now.

        Returns:
            Actions keyed by agent id, for exactly the agents observed.
        """
        obs = self._checked(observation, "observation", "get_action", episode_id)
        if not obs:
            raise SpaceError(
                f"get_action for episode '{episode_id}': the observation dict names no agent"
            )
        answer = self._act(episode_id, obs, "get_action")
        return {a: answer[a] for a in obs}

    def log_action(self, episode_id: str, observation: Any, action: Any) -> None:
        """Record observations and the actions someone else took, both keyed by agent id."""
        obs = self._checked(observation, "observation", "log_action", episode_id)
        actions = self._checked(action, "action", "log_action", episode_id)
        if set(obs) != set(actions):
            raise SpaceError(
                f"log_action for episode '{episode_id}': the observation and action dicts name "
                f"different agents ({sorted(map(str, obs))} vs {sorted(map(str, actions))})"
            )
        self._log_action(episode_id, obs, actions, "log_action")

    def log_returns(
        self,
        episode_id: str,
        reward: Any,
        info: Any = None,
        multiagent_done_dict: Mapping[Any, bool] | None = None,
        multiagent_truncated_dict: Mapping[Any, bool] | None = None,
    ) -> None:
        """Add each agent's reward to its previous action; mark agents (or everything) done.

        Args:
            episode_id: The episode.
            reward: Rewards keyed by agent id.
            info: Info maps keyed by agent id.
            multiagent_done_dict: Agent id -> terminated; ``"__all__": True`` ends the episode
                (a later ``end_episode`` of it is then a no-op).
            multiagent_truncated_dict: Agent id -> cut short; ``"__all__"`` ends it truncated.

        Raises:
            EpisodeError: Unknown or ended episode, or a done agent rewarded or marked again.
            SpaceError: A reward is not a finite number in range.
        """
        if not isinstance(reward, Mapping):
            raise SpaceError(
                f"log_returns for episode '{episode_id}': a multi-agent episode takes a dict of "
                f"rewards keyed by agent id, got {type(reward).__name__}"
            )
        rewards = {a: _check_reward(r, episode_id, a) for a, r in reward.items()}
        infos = {}
        if info:
            if not isinstance(info, Mapping):
                raise SpaceError(
                    f"log_returns for episode '{episode_id}': info must be a dict of info maps "
                    "keyed by agent id"
                )
            infos = {a: _check_info(i, episode_id) for a, i in info.items()}
        self._add_returns(
            episode_id,
            rewards,
            infos,
            dict(multiagent_done_dict or {}),
            dict(multiagent_truncated_dict or {}),
        )

    def end_episode(self, episode_id: str, observation: Any, truncated: bool = False) -> None:
        """End the episode with final observations of any of its agents (a dict, may be empty).

        Every agent that is not done yet ends with the episode.
        """
        obs = self._checked(
            {} if observation is None else observation, "observation", "end_episode", episode_id
        )
        self._end(episode_id, obs, truncated)


def _check_reward(reward: Any, episode_id: str, agent: Any | None = None) -> float:
    who = "" if agent is None else f" of agent '{agent}'"
    where = f"log_returns for episode '{episode_id}'"
    if not isinstance(reward, int | float | np.number) or isinstance(reward, bool):
        raise SpaceError(f"{where}: reward{who} must be a number, got {type(reward).__name__}")
    value = float(reward)
    if not math.isfinite(value) or not -MAX_ABS_REWARD <= value <= MAX_ABS_REWARD:
        raise SpaceError(
            f"{where}: reward{who} {value!r} is out of range; a reward must be a finite number "
            f"within -{MAX_ABS_REWARD:g}..{MAX_ABS_REWARD:g}"
        )
    return value


def _check_info(info: Any, episode_id: str) -> dict[str, Any]:
    if info is None:
        return {}
    if not isinstance(info, Mapping):
        raise SpaceError(
            f"log_returns for episode '{episode_id}': info must be a dict, got "
            f"{type(info).__name__}"
        )
    return dict(info)
