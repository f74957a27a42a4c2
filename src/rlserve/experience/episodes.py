"""Episode bookkeeping: turns the stream of client calls into trajectory fragments.

The rules (the seed's semantics, plus truncation):

* ``start_episode`` opens an episode; an id that is active or was used before is an error.
* An episode belongs to the owner (client identity) that started it; another owner's call for it
  is an error.
* Calls may carry a per-episode sequence number ``seq`` (1, 2, 3, ...): a call with the next
  number is applied; a repeat of the last number is a retry, answered with the first answer and
  not applied again (:meth:`EpisodeTable.check_seq`); any other number is an error.
* ``get_action`` / ``log_action`` record an observation and then an action. The reward logged
  since the previous action (``log_returns`` calls plus the ``reward`` field) belongs to that
  previous action; none logged means 0.0. A reward before the episode's first action has no action
  to belong to: it counts in the episode's return and is trained on with no step.
* An ``info`` map logged with a reward belongs to the same step; several before the next action
  merge (later keys replace earlier ones). It is kept in the fragment's ``infos``. An info before
  the first action has no step and is not kept.
* A reward must be finite and, with the rewards logged since the previous action, within
  ``±MAX_ABS_REWARD``: the call that logged it is refused (nothing is changed).
* ``log_action`` records the given action as the one taken (``policy_chosen`` False).
* ``end_episode`` records the final observation; the episode terminated, or with
  ``truncated=True`` was cut short so the learner bootstraps from that observation.
* An episode with ``training_enabled=False`` is served and counted in metrics but its steps never
  reach a learner.
* Every ``fragment_length`` actions the steps so far are handed on as a :class:`Fragment` whose
  last observation is the next step's (the learner bootstraps from it), so learning never waits
  for an episode to end.
* An episode silent for longer than the idle timeout is closed and counted; its unfinished steps
  are handed on as a truncated-free fragment (bootstrapped) so nothing collected is lost.

Bookkeeping is per (episode, agent) underneath, in one of two modes: a single-agent episode
keeps its steps in lists (:mod:`rlserve.experience.single_agent_steps`), a multi-agent episode its
agents in columns, one set of arrays per policy (:mod:`rlserve.experience.multi_agent_steps`), so
that a call with hundreds of agents costs a few numpy operations per policy rather than a few
Python operations per agent. This module owns the table: the episodes' lifecycle (start,
ownership, call numbers, end, idle expiry) and each call handed to the episode's mode. The records
it keeps are in :mod:`rlserve.experience.episode_records`.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlserve.errors import CapacityError, EpisodeError
from rlserve.experience.agent_columns import AgentTick
from rlserve.experience.agent_counts import AgentCounts
from rlserve.experience.episode_records import (
    SINGLE_AGENT,
    AgentTrajectory,
    Episode,
    EpisodeMode,
    EpisodeStatus,
    EpisodeSummary,
)
from rlserve.experience.multi_agent_steps import MultiAgentSteps
from rlserve.experience.single_agent_steps import SingleAgentSteps, check_reward
from rlserve.protocol.fragment import Fragment

__all__ = [
    "SINGLE_AGENT",
    "AgentTrajectory",
    "Episode",
    "EpisodeStatus",
    "EpisodeSummary",
    "EpisodeTable",
]


@dataclass(frozen=True, slots=True)
class _Ended:
    """What is remembered of an ended episode: who owned it and the seq of its ``end_episode``."""

    owner: str
    end_seq: int


class EpisodeTable:
    """All active episodes of a server, and the ids used before.

    Args:
        fragment_length: Actions per fragment before it is cut and handed on.
        max_episodes: Most concurrent episodes on the server.
        max_per_owner: Most concurrent episodes one owner (client identity) may hold.
        on_fragment: Called with each finished fragment of a training episode.
        clock: Monotonic time source (seconds).
        holder: Who holds the episodes, as the capacity error says it (a local client's
            table: ``"this client"``).
        limit_setting: The setting that raises ``max_episodes``, named in that error.
        max_info_bytes: Largest info map of one step once merged; None: not checked.
        max_agents: Most agents of multi-agent episodes per owner and in all (checked by the
            caller with :attr:`agent_counts`); None: no limit.
    """

    def __init__(
        self,
        fragment_length: int,
        max_episodes: int,
        max_per_owner: int,
        on_fragment: Callable[[Fragment], None],
        clock: Callable[[], float] = time.monotonic,
        holder: str = "the server",
        limit_setting: str = "max_episodes_per_server",
        max_info_bytes: int | None = None,
        max_agents: tuple[int, int] | None = None,
    ):
        self.fragment_length = fragment_length
        self.max_episodes = max_episodes
        self.holder = holder
        self.limit_setting = limit_setting
        self.max_per_owner = max_per_owner
        self._clock = clock
        self._single = SingleAgentSteps(fragment_length, on_fragment, clock, max_info_bytes)
        self._multi = MultiAgentSteps(fragment_length, on_fragment, clock, max_info_bytes)
        self._active: dict[str, Episode] = {}
        # Ended ids are remembered so a reused id is refused and a retried end_episode is
        # recognised; bounded so it cannot grow forever.
        self._ended: dict[str, _Ended] = {}
        self._max_remembered = 1_000_000
        self._per_owner: dict[str, int] = {}
        self.agent_counts = AgentCounts(*(max_agents or (None, None)))
        """Agents of the open multi-agent episodes, per owner and in all."""

    def __len__(self) -> int:
        return len(self._active)

    def start(
        self, episode_id: str | None, training_enabled: bool, policy_id: str, owner: str
    ) -> str:
        """Open an episode and return its id.

        Raises:
            EpisodeError: The id is active or was used before.
            CapacityError: The server or this owner has too many episodes open.
        """
        if episode_id is None:
            episode_id = uuid.uuid4().hex
        elif episode_id in self._active:
            raise EpisodeError(
                f"episode '{episode_id}' is already active; end it first or use a new id"
            )
        elif episode_id in self._ended:
            raise EpisodeError(
                f"episode id '{episode_id}' was used before; episode ids are single-use"
            )
        if len(self._active) >= self.max_episodes:
            raise CapacityError(
                f"{self.holder} holds {len(self._active)} episodes, its limit; end episodes or "
                f"raise {self.limit_setting}"
            )
        held = self._per_owner.get(owner, 0)
        if held >= self.max_per_owner:
            raise CapacityError(
                f"this client holds {held} open episodes, its limit; end episodes or raise "
                "max_episodes_per_client"
            )
        self._per_owner[owner] = held + 1
        self._active[episode_id] = Episode(
            episode_id, policy_id, owner, training_enabled, self._clock()
        )
        return episode_id

    def started_unused(self, episode_id: str, owner: str) -> bool:
        """Whether ``owner`` started this active episode and has not used it yet.

        A repeated ``start_episode`` of such an episode (a retry after a lost reply) is answered
        as started.
        """
        episode = self._active.get(episode_id)
        return (
            episode is not None
            and episode.owner == owner
            and episode.length == 0
            and episode.status is EpisodeStatus.ACTIVE
            and not episode.agent.obs
        )

    def owned(self, episode_id: str, owner: str) -> Episode:
        """The active episode with this id, if ``owner`` started it.

        Raises:
            EpisodeError: Unknown, already ended, or started by another owner.
        """
        episode = self.get(episode_id)
        if episode.owner != owner:
            raise EpisodeError(
                f"episode '{episode_id}' belongs to another client; a client may only act in "
                "the episodes it started (to continue yours, reconnect as the same identity: "
                "the client_id of hello, or over HTTP the X-RLServe-Client header)"
            )
        return episode

    def ended(self, episode_id: str) -> bool:
        """Whether this id belonged to an episode that has ended (and is still remembered)."""
        return episode_id in self._ended

    def ended_by(self, episode_id: str, owner: str, seq: int | None) -> bool:
        """Whether ``owner`` ended this episode with ``end_episode`` number ``seq`` (a retry)."""
        ended = self._ended.get(episode_id)
        return (
            seq is not None and ended is not None and ended.owner == owner and ended.end_seq == seq
        )

    def check_seq(self, episode: Episode, seq: int | None, call: str) -> bool:
        """Check a call's sequence number; True when it repeats the last call (a retry).

        Args:
            episode: The episode.
            seq: The call's ``seq``, or None (not tracked: always applied).
            call: The call's kind (``get_action``, ``log_action``, ``log_returns``,
                ``end_episode``).

        Raises:
            EpisodeError: ``seq`` is neither the next number nor a retry of the last call.
        """
        if seq is None or seq == episode.seq + 1:
            return False
        if seq == episode.seq and call == episode.seq_call:
            return True
        if seq == episode.seq:
            raise EpisodeError(
                f"{call} seq {seq} for episode '{episode.episode_id}' repeats the number of its "
                f"{episode.seq_call}; each call of an episode takes the next number"
            )
        retry = f" (or {episode.seq} to retry the last one)" if episode.seq else ""
        raise EpisodeError(
            f"{call} seq {seq} for episode '{episode.episode_id}' is out of order: the next "
            f"call is {episode.seq + 1}{retry}; number an episode's calls 1, 2, 3, ... and "
            "re-send a call only with its own number"
        )

    @staticmethod
    def record_seq(episode: Episode, seq: int | None, call: str, answer: Any = None) -> None:
        """Remember that call number ``seq`` was applied and what it answered."""
        if seq is not None:
            episode.seq, episode.seq_call, episode.answer = seq, call, answer

    def get(self, episode_id: str) -> Episode:
        """The active episode with this id.

        Raises:
            EpisodeError: Unknown or already ended.
        """
        episode = self._active.get(episode_id)
        if episode is None:
            if episode_id in self._ended:
                raise EpisodeError(f"episode '{episode_id}' has ended; start a new episode")
            raise EpisodeError(
                f"unknown episode '{episode_id}'; call start_episode first (after a server "
                "restart, episodes that were open are gone: start new ones)"
            )
        return episode

    # -- single-agent calls (SingleAgentSteps) ---------------------------------------------------

    check_reward = staticmethod(check_reward)

    def check_observe(
        self,
        episode: Episode,
        reward: float | None,
        call: str = "get_action",
        info: dict[str, Any] | None = None,
    ) -> None:
        """Raise the error :meth:`observe` would raise, without changing anything."""
        self._single.check_observe(episode, reward, call, info)

    def observe(
        self,
        episode: Episode,
        obs: np.ndarray,
        reward: float | None,
        info: dict[str, Any] | None = None,
        call: str = "get_action",
    ) -> None:
        """Record the observation that an action is about to be taken in.

        ``reward`` and ``info`` belong to the previous action; the errors are
        :meth:`rlserve.experience.single_agent_steps.SingleAgentSteps.observe`'s.
        """
        self._single.observe(episode, obs, reward, info, call)

    def act(self, episode: Episode, action: Any, logp: float, chosen: bool, version: int) -> None:
        """Record the action taken for the last observed step."""
        self._single.act(episode, action, logp, chosen, version)

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
        self._single.observe_act_many(episodes, obs, actions, logp, version)

    def log_returns_many(self, episodes: list[Episode], rewards: list[float]) -> None:
        """:meth:`log_returns` without info for each episode (the same checks and errors)."""
        self._single.log_returns_many(episodes, rewards)

    def log_returns(
        self, episode: Episode, reward: float, info: dict[str, Any] | None = None
    ) -> None:
        """Add reward (and info) to the previous action; before the first action, to the return.

        The errors are :meth:`rlserve.experience.single_agent_steps.SingleAgentSteps.log_returns`'s.
        """
        self._single.log_returns(episode, reward, info)

    def end(
        self,
        episode: Episode,
        obs: np.ndarray,
        truncated: bool,
        reward: float | None,
        seq: int | None = None,
        info: dict[str, Any] | None = None,
    ) -> EpisodeSummary:
        """Close the episode with its final observation and hand on its last fragment.

        ``seq`` (the call's sequence number) is remembered with the ended id, so a retry of this
        ``end_episode`` is recognised (:meth:`ended_by`).
        """
        self._single.end(episode, obs, truncated, reward, info)
        return self._close(episode, "truncated" if truncated else "terminated", seq or 0)

    def cut(self, episode: Episode, next_obs: np.ndarray) -> None:
        """Hand on a single-agent episode's steps so far as a fragment ending in ``next_obs``.

        The episode goes on; ``next_obs`` is the observation its next ``observe`` will record.
        A synchronous trainer cuts every episode at the end of a sampling round, so each round's
        batch holds only steps of the weights it was sampled with.
        """
        self._single.cut(episode, next_obs)

    # -- multi-agent calls (MultiAgentSteps) -----------------------------------------------------

    def observe_agents(
        self,
        episode: Episode,
        agent_ids: list[str],
        policy_ids: list[str],
        groups: list[tuple[str, np.ndarray]],
        obs: list[np.ndarray],
        rewards: Any,
        infos: list[dict[str, Any] | None] | None,
        call: str = "get_action",
    ) -> AgentTick:
        """Check, then record, the observations the named agents are about to act in.

        See :meth:`rlserve.experience.multi_agent_steps.MultiAgentSteps.observe_agents` for the
        arguments and errors; nothing is changed when it raises.
        """
        before = 0 if episode.agents is None else len(episode.agents)
        tick = self._multi.observe_agents(
            episode, agent_ids, policy_ids, groups, obs, rewards, infos, call
        )
        assert episode.agents is not None  # observe_agents makes the episode multi-agent
        self.agent_counts.add(episode.owner, len(episode.agents) - before)
        return tick

    def act_agents(
        self,
        episode: Episode,
        tick: AgentTick,
        group: int,
        actions: Any,
        logps: Any,
        chosen: bool,
        version: int,
    ) -> None:
        """Record the actions of one group of the last :meth:`observe_agents`.

        ``actions`` are the group's actions as the learner trains on them (``[k]`` choice
        indices, or ``[k, A]`` floats), ``logps`` their behaviour log-probabilities. One group
        at a time; :meth:`finish_tick` once every group has its actions.
        """
        self._multi.act_agents(tick, group, actions, logps, chosen, version)

    def finish_tick(self, episode: Episode) -> None:
        """Every agent of the last :meth:`observe_agents` has its action: one more step."""
        self._multi.finish_tick(episode)

    def log_returns_agents(
        self,
        episode: Episode,
        agent_ids: list[str],
        rewards: Any,
        infos: list[dict[str, Any] | None] | None,
        done: dict[str, bool],
    ) -> None:
        """Add each agent's reward (and info) to its previous action; finish the done agents.

        See :meth:`rlserve.experience.multi_agent_steps.MultiAgentSteps.log_returns_agents` for
        what a done agent's steps become and the errors; nothing is changed when it raises.
        """
        self._multi.log_returns_agents(episode, agent_ids, rewards, infos, done)

    def end_agents(
        self,
        episode: Episode,
        agent_ids: list[str],
        obs: Any,
        rewards: Any,
        infos: list[dict[str, Any] | None] | None,
        truncated: bool,
        seq: int | None = None,
    ) -> EpisodeSummary:
        """End a multi-agent episode: every agent not yet done finishes.

        ``obs[i]`` is agent ``agent_ids[i]``'s final observation; ``seq`` as in :meth:`end`.

        Raises:
            EpisodeError / SpaceError: As :meth:`log_returns_agents`; nothing is changed.
        """
        self._multi.end(episode, agent_ids, obs, rewards, infos, truncated)
        return self._close(episode, "truncated" if truncated else "terminated", seq or 0)

    # -- episodes that stop without a final observation -----------------------------------------

    def expire_idle(self, idle_timeout: float) -> list[EpisodeSummary]:
        """Close episodes silent for longer than ``idle_timeout`` seconds.

        Their collected steps are handed on as an unfinished fragment (the learner bootstraps
        from the last observation), so a dead client loses nothing it had reported.
        """
        now = self._clock()
        # An episode awaiting its action waits on the server (e.g. for the first weights), not
        # on its client, so it is never idle.
        stale = [
            e
            for e in self._active.values()
            if now - e.last_seen > idle_timeout and e.status is EpisodeStatus.ACTIVE
        ]
        summaries = []
        for episode in stale:
            self._mode(episode).hand_on_unfinished(episode)
            summaries.append(self._close(episode, "idle_timeout"))
        return summaries

    def abandon(self, episode: Episode, reason: str) -> EpisodeSummary:
        """Close an episode that cannot go on (its environment crashed or hung).

        No final observation exists: the steps collected so far are handed on as at idle
        expiry (the last one dropped, the rest bootstrapping from its observation).
        """
        self._mode(episode).hand_on_unfinished(episode)
        return self._close(episode, reason)

    def _mode(self, episode: Episode) -> EpisodeMode:
        return self._single if episode.agents is None else self._multi

    def _close(self, episode: Episode, reason: str, end_seq: int = 0) -> EpisodeSummary:
        episode.status = EpisodeStatus.ENDED
        del self._active[episode.episode_id]
        if episode.agents is not None:
            self.agent_counts.release(episode.owner, len(episode.agents))
        self._per_owner[episode.owner] -= 1
        if not self._per_owner[episode.owner]:
            del self._per_owner[episode.owner]
        self._ended[episode.episode_id] = _Ended(episode.owner, end_seq)
        if len(self._ended) > self._max_remembered:
            self._ended.pop(next(iter(self._ended)))
        return EpisodeSummary(
            episode.episode_id,
            episode.episode_return,
            episode.length,
            episode.training_enabled,
            reason,
            self._mode(episode).policy_returns(episode),
            episode.policy_id,
        )

    def open_episodes(self) -> list[Episode]:
        """The episodes not ended yet, oldest first."""
        return list(self._active.values())

    def owners(self) -> dict[str, int]:
        """Open episodes per owner."""
        return dict(self._per_owner)
