"""The multi-agent calls of the :class:`~rlserve.experience.collector.Collector`.

A mixin (its own module to keep the collector's single-agent and vector paths short to read):
each call groups the agents by policy with the server's
:class:`~rlserve.experience.agent_groups.AgentGrouper`, so one forward pass serves every agent
of a policy, and records them in the collector's
:class:`~rlserve.experience.episodes.EpisodeTable`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from gymnasium import spaces

from rlserve.errors import SpaceError
from rlserve.experience.agent_columns import AgentTick
from rlserve.experience.agent_groups import AgentGrouper, AskPolicies, Grouping, assigned
from rlserve.experience.agent_values import PolicyTable
from rlserve.experience.episode_records import Episode, EpisodeSummary
from rlserve.experience.episodes import EpisodeTable
from rlserve.experience.frame_stacks import final_rows, stack_agents
from rlserve.experience.recurrent_states import advance_rows, log_rows, read_rows
from rlserve.policy import NumpyPolicy
from rlserve.policy.acting import explores
from rlserve.policy.action_layout import actions_to_space
from rlserve.protocol.limits import DEFAULT_LIMITS
from rlserve.protocol.mapping import ALL_AGENTS


class MultiAgentCalls:
    """The multi-agent part of :class:`~rlserve.experience.collector.Collector`."""

    # Set and documented in Collector.__init__.
    table: EpisodeTable
    table_of_policies: PolicyTable
    ask_policies: AskPolicies | None
    explore: bool
    _grouper: AgentGrouper
    _policies: dict[str, NumpyPolicy]
    _on_summary: Callable[[EpisodeSummary], None]

    def _explicit(
        self, episode: Episode, agent_ids: list[str], named: list[str | None] | None
    ) -> list[str | None] | None:
        """The call's explicit policies: named ones, and the server's answers for new agents."""
        if self.ask_policies is None:
            return named
        mapping = self.table_of_policies.mapping
        limit = DEFAULT_LIMITS.max_agents_per_episode
        return assigned(episode, agent_ids, named, mapping, self.ask_policies, limit)

    def _observe_agents(
        self,
        episode: Episode,
        agent_ids: list[str],
        grouping: Grouping,
        blocks: list[np.ndarray],
        call: str,
    ) -> tuple[AgentTick, list[np.ndarray]]:
        """Record the agents' observations (stacked for a policy that stacks frames)."""
        stacks = stack_agents(
            self.table_of_policies.frame_rule, episode, agent_ids, grouping.groups, blocks
        )
        if stacks is not None:
            blocks = stacks.blocks
        tick = self.table.observe_agents(
            episode, agent_ids, grouping.policy_ids, grouping.groups, blocks, None, None, call
        )
        if stacks is not None:
            stacks.keep(episode)
        return tick, blocks

    def get_agent_actions(self, episode_id: str, observation: Any) -> dict[str, Any]:
        """Record each agent's observation and compute its action, one pass per policy."""
        episode = self.table.get(episode_id)
        agent_ids = [str(a) for a in observation]
        if not agent_ids:
            raise SpaceError(
                f"get_action for episode '{episode_id}': the observation dict names no agent"
            )
        named = self.table_of_policies.explicit_ids(agent_ids)
        grouping = self._grouper.group(agent_ids, self._explicit(episode, agent_ids, named))
        blocks = self._grouper.blocks(
            grouping, agent_ids, list(observation.values()), "observations"
        )
        tick, blocks = self._observe_agents(episode, agent_ids, grouping, blocks, "get_action")
        single = len(blocks) == 1
        out: dict[str, Any] = {}
        try:
            for g, ((policy_id, idx), block) in enumerate(
                zip(grouping.groups, blocks, strict=True)
            ):
                policy = self._policies[policy_id]
                explore = explores(policy, episode.training_enabled, self.explore)
                if policy.state_size:
                    columns, rows = tick.parts[g]
                    state = read_rows(columns, rows, policy.state_size)
                    computed = policy.compute_actions(block, explore, state)
                    advance_rows(columns, rows, computed.state)
                else:
                    computed = policy.compute_actions(block, explore)
                space = self.table_of_policies.policies[policy_id].action_space
                sent = policy.to_env_actions(computed.actions)
                self.table.act_agents(
                    episode, tick, g, computed.actions, computed.logp, True, policy.version
                )
                ids = agent_ids if single else [agent_ids[i] for i in idx.tolist()]
                if isinstance(space, spaces.Discrete):
                    values = sent.tolist()
                else:
                    values = actions_to_space(space, sent)
                if single:
                    out = dict(zip(ids, values, strict=True))
                else:
                    out.update(zip(ids, values, strict=True))
        finally:
            self.table.finish_tick(episode)
        return out

    def log_agent_actions(self, episode_id: str, observation: Any, action: Any) -> None:
        """Record actions someone else took for several agents."""
        episode = self.table.get(episode_id)
        agent_ids = [str(a) for a in observation]
        named = self.table_of_policies.explicit_ids(agent_ids)
        grouping = self._grouper.group(agent_ids, self._explicit(episode, agent_ids, named))
        blocks = self._grouper.blocks(
            grouping, agent_ids, [observation[a] for a in agent_ids], "observations"
        )
        taken = self._grouper.actions(
            grouping, agent_ids, [action[a] for a in agent_ids], "log_action 'actions'"
        )
        tick, blocks = self._observe_agents(episode, agent_ids, grouping, blocks, "log_action")
        for g, (policy_id, idx) in enumerate(grouping.groups):
            positions = idx.tolist()
            policy = self._policies[policy_id]
            if policy.state_size:
                # The LSTM reads every observation: a logged step advances the state too.
                log_rows(*tick.parts[g], blocks[g], policy)
            self.table.act_agents(
                episode,
                tick,
                g,
                np.asarray([taken[i] for i in positions]),
                np.full(len(positions), np.nan, np.float32),
                False,
                self._policies[policy_id].version,
            )
        self.table.finish_tick(episode)

    def log_agent_returns(
        self,
        episode_id: str,
        rewards: dict[str, float],
        infos: dict[str, dict[str, Any]],
        done: dict[str, bool],
    ) -> None:
        """Add each agent's reward; finish the done agents; ``__all__`` ends the episode."""
        episode = self.table.get(episode_id)
        all_done = done.pop(ALL_AGENTS, None)
        agent_ids = list(rewards)
        values = np.fromiter(rewards.values(), np.float64, len(agent_ids))
        if infos:
            extra = [a for a in infos if a not in rewards]
            agent_ids += extra
            values = np.concatenate([values, np.zeros(len(extra))])
        self.table.log_returns_agents(
            episode,
            agent_ids,
            values,
            [infos.get(a) for a in agent_ids] if infos else None,
            done,
        )
        if all_done is not None:
            summary = self.table.end_agents(episode, [], [], None, None, not all_done)
            self._on_summary(summary)

    def end_agent_episode(self, episode_id: str, observation: Any, truncated: bool) -> None:
        """End a multi-agent episode with final observations of any of its agents."""
        if self.table.ended(episode_id):
            return  # '__all__' ended it already (RLlib's clients call end_episode after it)
        episode = self.table.get(episode_id)
        known = episode.agents
        agent_ids = [str(a) for a in observation if known is None or not known.is_done(str(a))]
        rows: list[Any] = []
        if agent_ids:
            explicit: list[str | None] | None = [
                None if known is None else known.policy_of(a) for a in agent_ids
            ]
            explicit = self._explicit(episode, agent_ids, explicit)
            grouping = self._grouper.group(agent_ids, explicit)
            rows = final_rows(
                self._grouper,
                self.table_of_policies.frame_rule,
                episode,
                grouping,
                agent_ids,
                [observation[a] for a in agent_ids],
                "observations",
            )
        summary = self.table.end_agents(episode, agent_ids, rows, None, None, truncated)
        self._on_summary(summary)
