"""The episode calls of multi-agent episodes: calls that name the agents acting.

A call's agents are grouped by the policy each maps to (:mod:`~rlserve.experience.agent_groups`)
and each group's values are checked in one pass. A ``get_action`` waits as one part per policy in
those policies' slots (:mod:`~rlserve.server.batching`) and is answered when every part has its
actions. The answer is kept in the episode for a retry; a retry while the call still waits joins
it. With a mapping function (:mod:`~rlserve.server.mapping_function`) the agents that no rule maps
get their policy from it, once per agent per episode.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlserve.errors import CapacityError, EpisodeError
from rlserve.experience.agent_groups import assigned
from rlserve.experience.episode_records import Episode, EpisodeSummary
from rlserve.experience.frame_stacks import FrameRule, final_rows, stack_agents
from rlserve.experience.recurrent_states import log_rows
from rlserve.protocol.messages import EndEpisode, GetAction, LogAction, LogReturns, MapAgents
from rlserve.protocol.replies import AgentsMapped, actions_reply
from rlserve.server.batching import AgentPart, AgentsPending
from rlserve.server.episode_calls import EpisodeCalls
from rlserve.server.mapping_function import MappingFunction, rules_only
from rlserve.server.replies import Respond
from rlserve.server.sessions import Session


class MultiAgentCalls(EpisodeCalls):
    """The calls of multi-agent episodes (see :class:`EpisodeCalls` for the arguments)."""

    mapper: MappingFunction | None = None
    """The server's mapping function, when it has one (set by the service)."""

    def _explicit(
        self, episode: Episode, agent_ids: list[str], named: list[str | None] | None
    ) -> list[str | None] | None:
        """The call's explicit policies: named ones, and the mapping function's answers."""
        mapper = self.mapper
        if mapper is None:
            return named
        limit = self.limits.max_agents_per_episode
        return assigned(episode, agent_ids, named, mapper.mapping, mapper.ask, limit)

    def _frame_rule(self, policy_id: str) -> FrameRule | None:
        return self.slots[policy_id].frames

    def map_agents(self, request: MapAgents, session: Session) -> dict[str, Any]:
        """Answer ``map_agents``: the policy each agent acts for, or would act for, if it joined.

        In an episode of this client that the server holds (remote inference) the answers are
        the episode's (kept for its later calls); for any other id (a local-inference client's
        own episode) the function is asked without keeping anything.
        """
        mapper = self.mapper
        if mapper is None:
            return rules_only(self.grouper.mapping, request)
        try:
            episode = self._episode(request.episode_id, session)
        except EpisodeError:
            return mapper.map_agents(request)
        limit = self.limits.max_agents_per_episode
        found = assigned(episode, request.agent_ids, None, mapper.mapping, mapper.ask, limit)
        policy_ids: list[str] = []
        for i, agent_id in enumerate(request.agent_ids):
            policy_id = None if found is None else found[i]
            policy_ids.append(mapper.mapping.resolve(agent_id) if policy_id is None else policy_id)
        return AgentsMapped(request.id, policy_ids).to_wire()

    def get_action(self, request: GetAction, session: Session, respond: Respond) -> bool:
        """Record a ``get_action`` and queue its parts for the next flush, or answer a retry.

        Returns:
            True when ``respond`` will be called later.
        """
        assert request.agent_ids is not None
        episode = self._episode(request.episode_ids[0], session)
        seq = None if request.seqs is None else request.seqs[0]
        if self.episodes.check_seq(episode, seq, "get_action"):
            return self._retry(request, episode, respond)
        agent_ids = request.agent_ids
        self._check_agent_count(episode, agent_ids)
        grouping = self.grouper.group(
            agent_ids, self._explicit(episode, agent_ids, request.policy_ids)
        )
        blocks = self.grouper.blocks(
            grouping, agent_ids, request.observations, "get_action 'observations'"
        )
        for (policy_id, _), block in zip(grouping.groups, blocks, strict=True):
            legal_moves = self.slots[policy_id].legal_moves
            if legal_moves is not None:
                legal_moves.check(block, f"get_action 'observations' of policy '{policy_id}'")
        stacks = stack_agents(self._frame_rule, episode, agent_ids, grouping.groups, blocks)
        if stacks is not None:
            blocks = stacks.blocks
        tick = self.episodes.observe_agents(
            episode,
            agent_ids,
            grouping.policy_ids,
            grouping.groups,
            blocks,
            request.rewards,
            request.infos,
            "get_action",
        )
        if stacks is not None:
            stacks.keep(episode)
        self.episodes.record_seq(episode, seq, "get_action")
        pending = AgentsPending(request, episode, tick, respond, len(grouping.groups))
        if seq is not None:
            # A retry while it is pending joins it. A call without seq leaves the last
            # numbered call's answer for a retry of that one.
            episode.answer = pending
        ready = False
        for g, ((policy_id, idx), block) in enumerate(zip(grouping.groups, blocks, strict=True)):
            slot = self.slots[policy_id]
            slot.parts.append(AgentPart(pending, slot, g, idx, block))
            ready = ready or slot.policy is not None
        if ready:
            self._schedule_flush()
        return True

    def _check_agent_count(self, episode: Episode, agent_ids: list[str]) -> None:
        """Refuse a call whose new agents would take the episode, client or server over its limit.

        The common case (every agent known, or far from the limits) costs no count of new agents.
        """
        known = episode.agents
        held = 0 if known is None else len(known)
        limit = self.limits.max_agents_per_episode
        counts = self.episodes.agent_counts
        if held + len(agent_ids) <= limit and counts.fits(episode.owner, len(agent_ids)):
            return
        new = sum(1 for a in agent_ids if known is None or a not in known)
        if held + new > limit:
            raise CapacityError(
                f"episode '{episode.episode_id}' would hold {held + new} agents; the "
                f"limit is {limit} (max_agents_per_episode): end the episode and start a new "
                "one, or reuse agent ids"
            )
        counts.check(episode.owner, new)

    def _retry(self, request: GetAction, episode: Episode, respond: Respond) -> bool:
        """Answer a repeated ``get_action`` with the first answer, or join it while pending."""
        answer = episode.answer
        if isinstance(answer, AgentsPending):
            if answer.request.agent_ids != request.agent_ids:
                raise EpisodeError(
                    "get_action retry names other agents than the call it repeats, which is "
                    "still being answered; re-send a call exactly as it was"
                )
            answer.joined.append((request, respond))
            return True
        respond(actions_reply(request.id, answer))
        return False

    def _log_action(self, request: LogAction, episode: Episode) -> int:
        assert request.agent_ids is not None
        agent_ids = request.agent_ids
        self._check_agent_count(episode, agent_ids)
        grouping = self.grouper.group(
            agent_ids, self._explicit(episode, agent_ids, request.policy_ids)
        )
        blocks = self.grouper.blocks(
            grouping, agent_ids, request.observation, "log_action 'observations'"
        )
        actions = self.grouper.actions(grouping, agent_ids, request.action, "log_action 'actions'")
        for (policy_id, idx), block in zip(grouping.groups, blocks, strict=True):
            legal_moves = self.slots[policy_id].legal_moves
            if legal_moves is not None:
                taken = np.asarray([actions[i] for i in idx.tolist()])
                legal_moves.check_actions(block, taken, f"log_action of policy '{policy_id}'")
        stacks = stack_agents(self._frame_rule, episode, agent_ids, grouping.groups, blocks)
        if stacks is not None:
            blocks = stacks.blocks
        tick = self.episodes.observe_agents(
            episode,
            agent_ids,
            grouping.policy_ids,
            grouping.groups,
            blocks,
            request.rewards,
            request.infos,
            "log_action",
        )
        if stacks is not None:
            stacks.keep(episode)
        for g, (policy_id, idx) in enumerate(grouping.groups):
            slot = self.slots[policy_id]
            if slot.policy is not None and slot.policy.state_size:
                # The LSTM reads every observation: a logged step advances the state too.
                log_rows(*tick.parts[g], blocks[g], slot.policy)
            version = slot.policy.version if slot.policy is not None else 0
            positions = idx.tolist()
            self.episodes.act_agents(
                episode,
                tick,
                g,
                np.asarray([actions[i] for i in positions]),
                np.full(len(positions), np.nan, np.float32),
                False,
                version,
            )
        self.episodes.finish_tick(episode)
        return len(agent_ids)

    def _log_returns(self, request: LogReturns, episode: Episode) -> None:
        assert request.agent_ids is not None and request.rewards is not None
        self.episodes.log_returns_agents(
            episode, request.agent_ids, request.rewards, request.infos, request.done or {}
        )

    def _end(self, request: EndEpisode, episode: Episode) -> EpisodeSummary:
        assert request.agent_ids is not None
        rows: list[Any] = []
        if request.agent_ids:
            known = episode.agents
            explicit: list[str | None] | None = [
                None if known is None else known.policy_of(a) for a in request.agent_ids
            ]
            explicit = self._explicit(episode, request.agent_ids, explicit)
            grouping = self.grouper.group(request.agent_ids, explicit)
            rows = final_rows(
                self.grouper,
                self._frame_rule,
                episode,
                grouping,
                request.agent_ids,
                request.observation,
                "end_episode 'observations'",
            )
        return self.episodes.end_agents(
            episode,
            request.agent_ids,
            rows,
            request.rewards,
            request.infos,
            request.truncated,
            request.seq,
        )
