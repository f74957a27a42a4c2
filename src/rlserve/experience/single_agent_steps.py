"""The bookkeeping of single-agent episodes: steps in lists, cut into fragments.

A single-agent episode keeps its unfinished fragment in an
:class:`~rlserve.experience.episode_records.AgentTrajectory`: every ``get_action`` /
``log_action`` appends an observation and then an action, the rewards logged in between belong
to the previous action, and every ``fragment_length`` actions (or at the episode's end) the steps
are handed on as one :class:`~rlserve.protocol.fragment.Fragment`. The rules are in
:mod:`rlserve.experience.episodes`; :class:`SingleAgentSteps` is the table's single-agent mode.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlserve.errors import EpisodeError
from rlserve.experience.episode_records import (
    SINGLE_AGENT,
    AgentTrajectory,
    Episode,
    EpisodeMode,
    EpisodeStatus,
    raise_reward,
)
from rlserve.protocol.fragment import Fragment
from rlserve.protocol.values import MAX_ABS_REWARD


def check_reward(episode: Episode, reward: float, call: str) -> None:
    """Refuse a reward that is not finite or would take the step's reward over the bound.

    Raises:
        SpaceError: Naming the call, the episode and the value (code ``bad_value``).
    """
    pending = episode.agent.pending_reward
    if not -MAX_ABS_REWARD <= pending + reward <= MAX_ABS_REWARD:  # True for NaN
        raise_reward(f"{call} for episode '{episode.episode_id}'", pending, reward)


class SingleAgentSteps(EpisodeMode):
    """The calls of single-agent episodes (see :class:`EpisodeMode` for the arguments)."""

    def check_observe(
        self,
        episode: Episode,
        reward: float | None,
        call: str = "get_action",
        info: dict[str, Any] | None = None,
    ) -> None:
        """Raise the error :meth:`observe` would raise, without changing anything."""
        if episode.agents is not None or episode.status is EpisodeStatus.AWAITING_ACTION:
            self._refuse(episode, "get_action/log_action")
        if (
            reward
            and not -MAX_ABS_REWARD <= episode.agent.pending_reward + reward <= MAX_ABS_REWARD
        ):
            check_reward(episode, reward, call)  # raises, naming the value
        if info:
            self._info_to_keep(episode, info, call)

    def observe(
        self,
        episode: Episode,
        obs: np.ndarray,
        reward: float | None,
        info: dict[str, Any] | None = None,
        call: str = "get_action",
    ) -> None:
        """Record the observation that an action is about to be taken in.

        ``reward`` and ``info`` belong to the previous action (see
        :mod:`rlserve.experience.episodes`).

        Raises:
            EpisodeError: The episode is waiting for the action of an earlier observation.
            SpaceError: The reward is not finite or over the bound.
            LimitExceededError: The step's infos merge to more than ``max_info_bytes``.
        """
        if episode.agents is not None or episode.status is EpisodeStatus.AWAITING_ACTION:
            self._refuse(episode, "get_action/log_action")
        agent = episode.agent
        kept = self._info_to_keep(episode, info, call) if info else None
        if reward is not None:
            self._add_reward(episode, reward, call)
        if kept is not None:
            agent.pending_info = kept
        if agent.actions:
            self._close_step(agent)
            if len(agent.actions) >= self.fragment_length:
                self._emit(episode, obs, terminated=False, truncated=False)
        agent.obs.append(obs)
        episode.status = EpisodeStatus.AWAITING_ACTION
        episode.last_seen = self._clock()

    def act(self, episode: Episode, action: Any, logp: float, chosen: bool, version: int) -> None:
        """Record the action taken for the last observed step."""
        agent = episode.agent
        agent.actions.append(action)
        agent.logp.append(logp)
        agent.chosen.append(chosen)
        agent.versions.append(version)
        episode.length += 1
        episode.status = EpisodeStatus.ACTIVE
        # Idle time counts from the answer: a client cannot act before it has its action.
        episode.last_seen = self._clock()

    def observe_act_many(
        self,
        episodes: list[Episode],
        obs: np.ndarray,
        actions: list[Any],
        logp: list[float],
        version: int,
    ) -> None:
        """:meth:`observe` (no reward, no info) then :meth:`act` (chosen) for each episode.

        The batched hot path of a vector of single-agent episodes; the caller has run
        :meth:`check_observe` on every episode first, so nothing here can raise.
        """
        fragment_length = self.fragment_length
        now = self._clock()
        active = EpisodeStatus.ACTIVE
        for episode, row, action, lp in zip(episodes, obs, actions, logp, strict=True):
            agent = episode.agent
            if agent.actions:
                agent.rewards.append(agent.pending_reward)
                agent.pending_reward = 0.0
                if agent.pending_info is not None:
                    agent.infos[len(agent.rewards) - 1] = agent.pending_info
                    agent.pending_info = None
                if len(agent.actions) >= fragment_length:
                    self._emit(episode, row, terminated=False, truncated=False)
            agent.obs.append(row)
            agent.actions.append(action)
            agent.logp.append(lp)
            agent.chosen.append(True)
            agent.versions.append(version)
            episode.length += 1
            episode.status = active
            episode.last_seen = now

    def log_returns_many(self, episodes: list[Episode], rewards: list[float]) -> None:
        """:meth:`log_returns` without info for each episode (the same checks and errors)."""
        now = self._clock()
        for episode, reward in zip(episodes, rewards, strict=True):
            agent = episode.agent
            if (
                episode.agents is not None
                or episode.status is EpisodeStatus.AWAITING_ACTION
                or not -MAX_ABS_REWARD <= agent.pending_reward + reward <= MAX_ABS_REWARD
            ):
                self.log_returns(episode, reward)  # raises, naming the problem
                continue
            episode.episode_return += reward
            if episode.length:
                agent.pending_reward += reward
            episode.last_seen = now

    def log_returns(
        self, episode: Episode, reward: float, info: dict[str, Any] | None = None
    ) -> None:
        """Add reward (and info) to the previous action; before the first action, to the return.

        Raises:
            EpisodeError: An action is being computed.
            SpaceError: The reward is not finite or over the bound.
            LimitExceededError: The step's infos merge to more than ``max_info_bytes``.
        """
        if episode.agents is not None or episode.status is EpisodeStatus.AWAITING_ACTION:
            self._refuse(episode, "log_returns")
        kept = self._info_to_keep(episode, info, "log_returns") if info else None
        self._add_reward(episode, reward, "log_returns")
        if kept is not None:
            episode.agent.pending_info = kept
        episode.last_seen = self._clock()

    def end(
        self,
        episode: Episode,
        obs: np.ndarray,
        truncated: bool,
        reward: float | None,
        info: dict[str, Any] | None,
    ) -> None:
        """Record the final observation and hand on the last fragment (the table closes it).

        Raises:
            EpisodeError / SpaceError: As :meth:`log_returns`; nothing is changed.
        """
        if episode.agents is not None or episode.status is EpisodeStatus.AWAITING_ACTION:
            self._refuse(episode, "end_episode")
        kept = self._info_to_keep(episode, info, "end_episode") if info else None
        if reward is not None:
            self._add_reward(episode, reward, "end_episode")
        agent = episode.agent
        if kept is not None:
            agent.pending_info = kept
        if agent.actions:
            self._close_step(agent)
            self._emit(episode, obs, terminated=not truncated, truncated=truncated)

    def cut(self, episode: Episode, next_obs: np.ndarray) -> None:
        """Hand on the episode's steps so far as a fragment ending in ``next_obs``."""
        agent = episode.agent
        if agent.actions:
            self._close_step(agent)
            self._emit(episode, next_obs, terminated=False, truncated=False)

    def hand_on_unfinished(self, episode: Episode) -> None:
        """See :meth:`EpisodeMode.hand_on_unfinished`."""
        agent = episode.agent
        if len(agent.actions) > 1:
            last_obs = agent.obs.pop()
            for steps in (agent.actions, agent.logp, agent.chosen, agent.versions):
                steps.pop()
            agent.infos.pop(len(agent.actions), None)
            del agent.rewards[len(agent.actions) :]
            self._emit(episode, last_obs, False, False)
        else:
            agent.obs, agent.actions, agent.rewards = [], [], []
            agent.logp, agent.chosen, agent.versions = [], [], []
            agent.infos = {}
            agent.state_in = None

    def policy_returns(self, episode: Episode) -> None:
        """None: a single-agent episode's one policy's return is its ``episode_return``."""
        return None

    @staticmethod
    def _refuse(episode: Episode, call: str) -> None:
        """Raise the error for a call of a multi-agent episode or one awaiting its action.

        The calls test both conditions inline (on every step) and call this only to raise.
        """
        if episode.agents is not None:
            raise EpisodeError(
                f"{call} for episode '{episode.episode_id}' names no agent, but the episode is "
                "multi-agent (its calls name agents): pass a dict keyed by agent id "
                "(agent_ids on the wire)"
            )
        if episode.status is EpisodeStatus.AWAITING_ACTION:
            raise EpisodeError(
                f"{call} for episode '{episode.episode_id}' while its previous get_action is "
                "still being answered; wait for the action before the next call"
            )

    @staticmethod
    def _add_reward(episode: Episode, reward: float, call: str) -> None:
        # The common case inline (every step): check_reward only to raise its error.
        if not -MAX_ABS_REWARD <= episode.agent.pending_reward + reward <= MAX_ABS_REWARD:
            check_reward(episode, reward, call)
        episode.episode_return += reward
        if episode.length:
            episode.agent.pending_reward += reward
        # Before the first action there is no step to credit: the reward is in the return only.

    def _info_to_keep(
        self, episode: Episode, info: dict[str, Any], call: str
    ) -> dict[str, Any] | None:
        """The step's info with ``info`` merged in, checked; None before the first action."""
        if not episode.length:
            return None  # no step to keep it with (see rlserve.experience.episodes)
        where = f"{call} for episode '{episode.episode_id}'"
        return self.merged_info(episode.agent.pending_info, info, where)

    @staticmethod
    def _close_step(agent: AgentTrajectory) -> None:
        """The previous action's reward and info are complete: record them with its step."""
        agent.rewards.append(agent.pending_reward)
        agent.pending_reward = 0.0
        if agent.pending_info is not None:
            agent.infos[len(agent.rewards) - 1] = agent.pending_info
            agent.pending_info = None

    def _emit(
        self, episode: Episode, next_obs: np.ndarray, terminated: bool, truncated: bool
    ) -> None:
        """Hand on the episode's steps as a fragment ending in ``next_obs``."""
        agent = episode.agent
        if episode.training_enabled and agent.actions:
            agent.obs.append(next_obs)
            fragment = Fragment(
                episode_id=episode.episode_id,
                agent_id=SINGLE_AGENT,
                policy_id=episode.policy_id,
                obs=np.stack(agent.obs).astype(np.float32, copy=False),
                actions=np.asarray(agent.actions),
                rewards=np.asarray(agent.rewards, dtype=np.float32),
                behaviour_logp=np.asarray(agent.logp, dtype=np.float32),
                policy_chosen=np.asarray(agent.chosen, dtype=bool),
                weights_version=np.asarray(agent.versions, dtype=np.int64),
                terminated=terminated,
                truncated=truncated,
                infos=[agent.infos.get(i) for i in range(len(agent.actions))]
                if agent.infos
                else None,
                state_in=agent.state_in,
            )
            self._on_fragment(fragment)
        agent.obs, agent.actions, agent.rewards = [], [], []
        agent.logp, agent.chosen, agent.versions = [], [], []
        agent.infos = {}
        agent.state_in = None
