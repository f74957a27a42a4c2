"""The episode calls as the service sees them: one interface for both kinds of episode.

``get_action``, ``log_action``, ``log_returns`` and ``end_episode`` name no agent for a
single-agent episode (:mod:`~rlserve.server.single_agent_calls`) and the acting agents for a
multi-agent one (:mod:`~rlserve.server.multi_agent_calls`); the service hands each call to the
kind it names. A call numbered with the episode's last ``seq`` is a retry: it gets the first
call's reply and changes nothing (docs/protocol.md). What both kinds share is here: the owner
check, and the ``seq`` handling of ``log_action``, ``log_returns`` and ``end_episode``; each kind
checks and records the values.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from rlserve.experience.agent_groups import AgentGrouper
from rlserve.experience.episode_records import Episode, EpisodeSummary
from rlserve.experience.episodes import EpisodeTable
from rlserve.protocol.limits import Limits
from rlserve.protocol.messages import EndEpisode, GetAction, LogAction, LogReturns
from rlserve.protocol.replies import Ok
from rlserve.server.batching import PolicySlot
from rlserve.server.replies import Respond
from rlserve.server.sessions import Session, source_name
from rlserve.server.stats import ServerStats


class EpisodeCalls(ABC):
    """The episode calls of one kind of episode (single- or multi-agent).

    Args:
        slots: The policies served, by id; a ``get_action`` waits in its policy's slot.
        episodes: The episodes, their owners and their call numbers.
        grouper: Groups a call's agents by policy and checks their values.
        limits: Wire limits (``max_agents_per_episode``).
        stats: Counters for metrics.
        schedule_flush: Called when a ``get_action`` waits in a slot that has weights.
    """

    def __init__(
        self,
        slots: dict[str, PolicySlot],
        episodes: EpisodeTable,
        grouper: AgentGrouper,
        limits: Limits,
        stats: ServerStats,
        schedule_flush: Callable[[], None],
    ):
        self.slots = slots
        self.episodes = episodes
        self.grouper = grouper
        self.limits = limits
        self.stats = stats
        self._schedule_flush = schedule_flush

    @abstractmethod
    def get_action(self, request: GetAction, session: Session, respond: Respond) -> bool:
        """Record a ``get_action`` and queue it for the next flush, or answer a retry.

        Returns:
            True when ``respond`` will be called later.
        """

    def log_action(self, request: LogAction, session: Session) -> dict[str, Any]:
        """Record an action the client chose itself; return the reply."""
        episode = self._episode(request.episode_id, session)
        if self.episodes.check_seq(episode, request.seq, "log_action"):
            return Ok(request.id).to_wire()
        count = self._log_action(request, episode)
        self.episodes.record_seq(episode, request.seq, "log_action")
        self.stats.count_actions(count, batch=0)
        return Ok(request.id).to_wire()

    def log_returns(self, request: LogReturns, session: Session) -> dict[str, Any]:
        """Add rewards (and ``info``) to the last action; return the reply."""
        episode = self._episode(request.episode_id, session)
        if not self.episodes.check_seq(episode, request.seq, "log_returns"):
            self._log_returns(request, episode)
            self.episodes.record_seq(episode, request.seq, "log_returns")
        return Ok(request.id).to_wire()

    def end_episode(self, request: EndEpisode, session: Session) -> dict[str, Any]:
        """End an episode with its last observation; return the reply."""
        if self.episodes.ended_by(request.episode_id, session.key, request.seq):
            return Ok(request.id).to_wire()  # a retry of the call that ended it
        episode = self._episode(request.episode_id, session)
        self.episodes.check_seq(episode, request.seq, "end_episode")
        summary = self._end(request, episode)
        self.stats.record_episode(replace(summary, source=source_name(episode.owner)))
        self.stats.episodes_active = len(self.episodes)
        return Ok(request.id).to_wire()

    @abstractmethod
    def _log_action(self, request: LogAction, episode: Episode) -> int:
        """Check and record a new ``log_action``; return how many actions it logged."""

    @abstractmethod
    def _log_returns(self, request: LogReturns, episode: Episode) -> None:
        """Check and record a new ``log_returns``."""

    @abstractmethod
    def _end(self, request: EndEpisode, episode: Episode) -> EpisodeSummary:
        """Check an ``end_episode`` and end the episode; return its summary."""

    def _episode(self, episode_id: str, session: Session) -> Episode:
        return self.episodes.owned(episode_id, session.key)
