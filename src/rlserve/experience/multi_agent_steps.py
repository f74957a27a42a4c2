"""The bookkeeping of multi-agent episodes: ticks of many agents, recorded column by column.

The rules of :mod:`rlserve.experience.episodes`, per agent: each agent's reward belongs to its own
previous action, each agent's steps become its own fragments (with its policy id), and an episode
is one call at a time. Agents join with their first observation and act at their own pace. The
agents of each policy are stored column by column (:mod:`rlserve.experience.agent_columns`), so
a call's agents are checked (:mod:`rlserve.experience.agent_checks`) and recorded with a few
numpy operations per policy. :class:`MultiAgentSteps` is the table's multi-agent mode.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from rlserve.errors import EpisodeError
from rlserve.experience.agent_checks import (
    check_agents_one_by_one,
    check_done_one_by_one,
    check_end_one_by_one,
    check_rewards_one_by_one,
    done_named,
    done_refused,
    find_rows,
    locate,
    rewards_refused,
    tick_refused,
)
from rlserve.experience.agent_columns import AgentColumns, AgentTick, EpisodeAgents, Located
from rlserve.experience.episode_records import Episode, EpisodeMode, EpisodeStatus


class MultiAgentSteps(EpisodeMode):
    """The calls of multi-agent episodes (see :class:`EpisodeMode` for the arguments)."""

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

        Args:
            episode: The episode.
            agent_ids: The call's agents.
            policy_ids: Each agent's policy, in the call's order.
            groups: ``(policy id, positions in the call)`` of each policy's agents (as
                :meth:`rlserve.experience.agent_groups.AgentGrouper.group` makes them).
            obs: Per group, its agents' flattened float32 observations ``[k, D]``.
            rewards: Each agent's reward for its previous action (call order), or None.
            infos: Each agent's info for its previous action (call order), or None.
            call: The call's name for error messages.

        Returns:
            Where :meth:`act_agents` records each group's actions.

        Raises:
            EpisodeError: The episode is single-agent or awaiting an action; an agent is done,
                or changes its policy; a reward names an agent that has not acted yet.
            SpaceError: A reward is out of range.
            LimitExceededError: An agent's infos for one step merge to more than
                ``max_info_bytes``. Nothing is changed when it raises.
        """
        self._check_multi(episode, call)
        state = episode.agents
        reward_array = None if rewards is None else np.asarray(rewards, dtype=np.float64)
        plan = None if state is None else state.known_plan(agent_ids, policy_ids)
        if plan is not None:
            parts, mismatch = plan.parts, False
        else:
            parts, mismatch = find_rows(state, agent_ids, groups)
        if mismatch or tick_refused(parts, groups, reward_array):
            check_agents_one_by_one(episode, agent_ids, policy_ids, rewards, call)
        if infos is not None:
            located = ((c, rows, idx) for (c, rows), (_, idx) in zip(parts, groups, strict=True))
            self._check_info_merges(episode, located, infos, call)
        if state is None:
            state = episode.agents = EpisodeAgents(self.fragment_length)
        if plan is None:
            for g, (policy_id, idx) in enumerate(groups):
                columns, rows = parts[g]
                missing = rows < 0
                if missing.any():
                    new_ids = [agent_ids[i] for i in idx[missing].tolist()]
                    columns, new_rows = state.join(policy_id, new_ids)
                    rows = rows.copy()
                    rows[missing] = new_rows
                    parts[g] = (columns, rows)
            state.remember(list(agent_ids), list(policy_ids), parts)
        single = len(groups) == 1
        rewarded = reward_array is not None and bool(reward_array.any())
        for g, (_, idx) in enumerate(groups):
            columns, rows = parts[g]
            if rewarded:
                assert reward_array is not None
                columns.add_rewards(rows, reward_array if single else reward_array[idx])
            if infos is not None:
                for row, i in zip(rows.tolist(), idx.tolist(), strict=True):
                    info = infos[i]
                    if info and columns.steps[row]:
                        columns.merge_info(row, info)
            block = obs[g]
            acted = np.flatnonzero(columns.count[rows] > 0)
            if acted.size:
                closing = rows[acted]
                columns.close_steps(closing)
                full = np.flatnonzero(columns.count[closing] >= self.fragment_length)
                if full.size:
                    # A full fragment ends in this observation (the learner bootstraps from it).
                    cut = closing[full]
                    columns.write_obs(cut, block[acted[full]])
                    self._hand_on(episode, columns, cut, columns.count[cut], False, False)
            columns.write_obs(rows, block)
        if rewarded:
            assert reward_array is not None
            episode.episode_return += float(reward_array.sum())
        episode.status = EpisodeStatus.AWAITING_ACTION
        episode.last_seen = self._clock()
        return AgentTick(parts)

    @staticmethod
    def act_agents(
        tick: AgentTick, group: int, actions: Any, logps: Any, chosen: bool, version: int
    ) -> None:
        """Record the actions of one group of the last :meth:`observe_agents`.

        ``actions`` are the group's actions as the learner trains on them (``[k]`` choice
        indices, or ``[k, A]`` floats), ``logps`` their behaviour log-probabilities. One group
        at a time; :meth:`finish_tick` once every group has its actions.
        """
        columns, rows = tick.parts[group]
        columns.record(
            rows, np.asarray(actions), np.asarray(logps, dtype=np.float32), chosen, version
        )

    def finish_tick(self, episode: Episode) -> None:
        """Every agent of the last :meth:`observe_agents` has its action: one more step."""
        episode.length += 1
        episode.status = EpisodeStatus.ACTIVE
        episode.last_seen = self._clock()

    def log_returns_agents(
        self,
        episode: Episode,
        agent_ids: list[str],
        rewards: Any,
        infos: list[dict[str, Any] | None] | None,
        done: dict[str, bool],
    ) -> None:
        """Add each agent's reward (and info) to its previous action; finish the done agents.

        ``done`` maps an agent id to ``True`` (terminated) or ``False`` for an agent cut short
        (truncated): its steps go to its policy now, and it may not act again. A truncated agent
        has no next observation to bootstrap from, so its last step is dropped and the steps
        before it bootstrap from the observation of that last step (as for an idle episode).
        A zero reward or an info for an agent that has not acted has no step and is not kept.
        Nothing is changed when any of it is refused.

        Raises:
            EpisodeError: The episode is single-agent or awaiting an action; a reward names an
                agent that has not acted or is done; a done agent is unknown or already done.
            SpaceError: A reward is out of range.
            LimitExceededError: An agent's infos for one step merge to more than
                ``max_info_bytes``.
        """
        self._check_multi(episode, "log_returns")
        state = episode.agents
        reward_array = np.asarray(rewards, dtype=np.float64)
        located = locate(state, agent_ids)
        if rewards_refused(located, reward_array) or done_refused(state, done):
            check_rewards_one_by_one(episode, agent_ids, rewards, "log_returns")
            check_done_one_by_one(episode, done)
        if infos is not None:
            self._check_info_merges(episode, located.parts, infos, "log_returns")
        self._add_agent_rewards(episode, located, reward_array, infos)
        if state is not None:
            for agent_id, terminated in done.items():
                columns, row = state.where[agent_id]
                self._finish_rows(episode, columns, np.array([row]), None, terminated)
        episode.last_seen = self._clock()

    def end(
        self,
        episode: Episode,
        agent_ids: list[str],
        obs: Any,
        rewards: Any,
        infos: list[dict[str, Any] | None] | None,
        truncated: bool,
    ) -> None:
        """Finish every agent not yet done (the table then closes the episode).

        ``obs[i]`` is agent ``agent_ids[i]``'s final observation (what a truncated agent
        bootstraps from); an agent left out finishes as in :meth:`log_returns_agents`. An agent
        named here that never acted has no steps: its observation is not kept.

        Raises:
            EpisodeError / SpaceError: As :meth:`log_returns_agents`; nothing is changed.
        """
        self._check_multi(episode, "end_episode")
        located = locate(episode.agents, agent_ids)
        reward_array = None if rewards is None else np.asarray(rewards, dtype=np.float64)
        if done_named(located) or (
            reward_array is not None and rewards_refused(located, reward_array)
        ):
            check_end_one_by_one(episode, agent_ids, rewards)
        if infos is not None:
            self._check_info_merges(episode, located.parts, infos, "end_episode")
        if episode.agents is None:  # an unused episode becomes multi-agent here
            episode.agents = EpisodeAgents(self.fragment_length)
        state = episode.agents
        if reward_array is not None:
            self._add_agent_rewards(episode, located, reward_array, infos)
        elif infos is not None:
            self._add_agent_rewards(episode, located, np.zeros(len(agent_ids)), infos)
        terminated = not truncated
        finals: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for columns, rows, positions in located.parts:
            if isinstance(obs, np.ndarray):
                block = obs[positions]
            else:
                block = np.stack([obs[i] for i in positions.tolist()])
            finals[id(columns)] = (rows, block)
        for columns in state.columns.values():
            left = ~columns.done[: columns.size]
            given = finals.get(id(columns))
            if given is not None:
                rows, block = given
                left[rows] = False
                self._finish_rows(episode, columns, rows, block, terminated)
            self._finish_rows(episode, columns, np.flatnonzero(left), None, terminated)

    def hand_on_unfinished(self, episode: Episode) -> None:
        """See :meth:`EpisodeMode.hand_on_unfinished`; agents that are done have nothing left."""
        assert episode.agents is not None  # the table picks this mode by it
        for columns in episode.agents.columns.values():
            left = np.flatnonzero(~columns.done[: columns.size])
            self._hand_on_unfinished_rows(episode, columns, left)

    def policy_returns(self, episode: Episode) -> dict[str, float]:
        """Each policy's agents' returns in the order they joined, added one after the other."""
        assert episode.agents is not None  # the table picks this mode by it
        return {
            policy_id: sum(columns.returns[: columns.size].tolist(), 0.0)
            for policy_id, columns in episode.agents.columns.items()
        }

    @staticmethod
    def _check_multi(episode: Episode, call: str) -> None:
        if episode.agents is None and (episode.length or episode.agent.obs):
            raise EpisodeError(
                f"{call} for episode '{episode.episode_id}' names agents, but the episode is "
                "single-agent (its earlier calls named none); use one form for a whole episode"
            )
        if episode.status is EpisodeStatus.AWAITING_ACTION:
            raise EpisodeError(
                f"{call} for episode '{episode.episode_id}' while its previous get_action is "
                "still being answered; wait for the actions before the next call"
            )

    def _check_info_merges(
        self,
        episode: Episode,
        parts: Iterable[tuple[AgentColumns, np.ndarray, np.ndarray]],
        infos: list[dict[str, Any] | None],
        call: str,
    ) -> None:
        """Refuse a call whose info would take an agent's step over ``max_info_bytes``.

        ``parts`` are ``(columns, rows, positions in the call)``; a row of -1 (an agent new to
        the episode) has nothing kept to merge with.
        """
        for columns, rows, positions in parts:
            kept = columns.pending_info
            if not kept:
                continue
            for row, i in zip(rows.tolist(), positions.tolist(), strict=True):
                info = infos[i]
                if info and row in kept:
                    where = f"{call} for episode '{episode.episode_id}', agent '{columns.ids[row]}'"
                    self.merged_info(kept[row], info, where)

    @staticmethod
    def _add_agent_rewards(
        episode: Episode,
        located: Located,
        rewards: np.ndarray,
        infos: list[dict[str, Any] | None] | None,
    ) -> None:
        """Add the (checked) rewards and infos of a call to the agents' last actions."""
        whole = len(located.parts) == 1 and not located.unknown
        for columns, rows, positions in located.parts:
            own = rewards if whole else rewards[positions]
            if own.any():
                columns.add_rewards(rows, own)
            if infos is not None:
                for row, i in zip(rows.tolist(), positions.tolist(), strict=True):
                    info = infos[i]
                    if info and columns.steps[row]:
                        columns.merge_info(row, info)
        if rewards.any():
            # Agents the episode does not know have no reward here (refused otherwise).
            episode.episode_return += float(rewards.sum())

    def _finish_rows(
        self,
        episode: Episode,
        columns: AgentColumns,
        rows: np.ndarray,
        final_obs: np.ndarray | None,
        terminated: bool,
    ) -> None:
        """Hand on the last steps of finished agents and mark them done.

        With ``final_obs`` (one per row) the fragments end in it; without, a terminated agent's
        last observation stands in (it is never bootstrapped from), and a truncated agent's last
        step is dropped (nothing followed it).
        """
        columns.done[rows] = True
        has_steps = np.flatnonzero(columns.count[rows] > 0)
        rows = rows[has_steps]
        if not rows.size:
            return
        if final_obs is None and not terminated:
            self._hand_on_unfinished_rows(episode, columns, rows)
            return
        columns.close_steps(rows)
        next_obs = columns.last_obs(rows) if final_obs is None else final_obs[has_steps]
        columns.write_obs(rows, next_obs)
        self._hand_on(episode, columns, rows, columns.count[rows], terminated, not terminated)

    def _hand_on_unfinished_rows(
        self, episode: Episode, columns: AgentColumns, rows: np.ndarray
    ) -> None:
        """Hand on the steps of agents that stopped without a next observation.

        No observation followed their last action, so that one step cannot be used; the steps
        before it bootstrap from the observation the last action was taken in.
        """
        counts = columns.count[rows]
        more = counts > 1
        if more.any():
            self._hand_on(episode, columns, rows[more], counts[more] - 1, False, False)
        columns.take(rows[~more], counts[~more], episode.episode_id, False, False, keep=False)

    def _hand_on(
        self,
        episode: Episode,
        columns: AgentColumns,
        rows: np.ndarray,
        steps: np.ndarray,
        terminated: bool,
        truncated: bool,
    ) -> None:
        """Cut the rows' first ``steps`` steps as fragments (kept when the episode trains)."""
        for fragment in columns.take(
            rows, steps, episode.episode_id, terminated, truncated, episode.training_enabled
        ):
            self._on_fragment(fragment)
