"""The checks of a multi-agent episode's calls: vectorised first, one by one for the error.

A call with hundreds of agents is checked with a few numpy operations per policy (the
``*_refused`` functions: True when some agent may be refused). Only then are its agents checked
again one by one, in the call's order (the ``check_*_one_by_one`` functions), so the error names
the first agent that cannot go on. Nothing here changes an episode.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlserve.errors import EpisodeError
from rlserve.experience.agent_columns import AgentColumns, EpisodeAgents, Located
from rlserve.experience.episode_records import Episode, raise_reward
from rlserve.protocol.values import MAX_ABS_REWARD

# -- the vectorised checks: True when some agent may be refused (then checked one by one) -----


def find_rows(
    state: EpisodeAgents | None, agent_ids: list[str], groups: list[tuple[str, np.ndarray]]
) -> tuple[list[tuple[AgentColumns, np.ndarray]], bool]:
    """Each group's columns and the rows of its agents (-1: not in the episode yet).

    Also whether an agent is in the columns of another policy than its group's. A group whose
    policy has no columns yet gets a placeholder (every row -1).
    """
    parts: list[tuple[AgentColumns, np.ndarray]] = []
    mismatch = False
    where = {} if state is None else state.where
    for policy_id, idx in groups:
        columns = None if state is None else state.columns.get(policy_id)
        rows = np.full(len(idx), -1, np.int64)
        for j, i in enumerate(idx.tolist()):
            found = where.get(agent_ids[i])
            if found is not None:
                if found[0] is columns:
                    rows[j] = found[1]
                else:
                    mismatch = True
        parts.append((columns or _NO_COLUMNS, rows))
    return parts, mismatch


_NO_COLUMNS = AgentColumns("", 1)
"""Stands in for the columns of a policy that has no agents in the episode yet (never written)."""


def tick_refused(
    parts: list[tuple[AgentColumns, np.ndarray]],
    groups: list[tuple[str, np.ndarray]],
    rewards: np.ndarray | None,
) -> bool:
    """Whether an observing call may be refused: a done agent, or a reward it cannot take."""
    for (columns, rows), (_, idx) in zip(parts, groups, strict=True):
        known = rows >= 0
        every = bool(known.all())
        old = rows if every else rows[known]
        if old.size and columns.done[old].any():
            return True
        if rewards is None:
            continue
        own = rewards if len(groups) == 1 else rewards[idx]
        given = own != 0
        if not given.any():
            continue
        if not every and (given & ~known).any():
            return True
        if not every:
            own, given = own[known], given[known]
        if (columns.steps[old][given] == 0).any():
            return True
        if not (np.abs(columns.pending[old] + own) <= MAX_ABS_REWARD).all():  # NaN too
            return True
    return False


def locate(state: EpisodeAgents | None, agent_ids: list[str]) -> Located:
    """Where the episode keeps the call's agents (every agent unknown before the first call)."""
    if state is None or not agent_ids:
        return Located([], list(range(len(agent_ids))))
    return state.locate(agent_ids)


def rewards_refused(located: Located, rewards: np.ndarray) -> bool:
    """Whether a reward may be refused: for an unknown or done agent, or out of range."""
    if located.unknown and rewards[located.unknown].any():
        return True
    for columns, rows, positions in located.parts:
        if columns.done[rows].any():
            return True
        own = rewards[positions]
        given = own != 0
        if given.any():
            if (columns.steps[rows][given] == 0).any():
                return True
            if not (np.abs(columns.pending[rows] + own) <= MAX_ABS_REWARD).all():
                return True
    return False


def done_refused(state: EpisodeAgents | None, done: dict[str, bool]) -> bool:
    """Whether marking these agents done may be refused: unknown or done already."""
    if not done:
        return False
    if state is None:
        return True
    return any(agent_id not in state or state.is_done(agent_id) for agent_id in done)


def done_named(located: Located) -> bool:
    """Whether the call names an agent that is done."""
    return any(columns.done[rows].any() for columns, rows, _ in located.parts)


# -- one by one, in the call's order: raise the first agent's error ---------------------------


def check_agents_one_by_one(
    episode: Episode,
    agent_ids: list[str],
    policy_ids: list[str],
    rewards: Any,
    call: str,
) -> None:
    """Raise the error of the first agent of an observing call that cannot go on."""
    where = _where(episode)
    for i, agent_id in enumerate(agent_ids):
        found = where.get(agent_id)
        if found is not None:
            _check_agent_usable(episode, found, agent_id, policy_ids[i], call)
        if rewards is not None and rewards[i]:
            _check_agent_reward(episode, found, agent_id, policy_ids[i], float(rewards[i]), call)


def check_rewards_one_by_one(
    episode: Episode, agent_ids: list[str], rewards: Any, call: str
) -> None:
    """Raise the error of the first agent whose reward cannot be taken."""
    where = _where(episode)
    for i, agent_id in enumerate(agent_ids):
        found = where.get(agent_id)
        policy_id = "?" if found is None else found[0].policy_id
        if found is not None:
            _check_agent_usable(episode, found, agent_id, policy_id, call)
        if rewards[i]:
            _check_agent_reward(episode, found, agent_id, policy_id, float(rewards[i]), call)


def check_done_one_by_one(episode: Episode, done: dict[str, bool]) -> None:
    """Raise the error of the first agent of a ``log_returns`` that cannot be marked done."""
    where = _where(episode)
    for agent_id in done:
        found = where.get(agent_id)
        if found is None:
            raise EpisodeError(
                f"log_returns for episode '{episode.episode_id}' marks agent '{agent_id}' "
                "done, but it has not acted in this episode; mark only agents that acted"
            )
        _check_agent_usable(episode, found, agent_id, found[0].policy_id, "log_returns")


def check_end_one_by_one(episode: Episode, agent_ids: list[str], rewards: Any) -> None:
    """Raise the error of the first agent an ``end_episode`` names that cannot end."""
    where = _where(episode)
    for i, agent_id in enumerate(agent_ids):
        found = where.get(agent_id)
        if found is not None and found[0].done[found[1]]:
            _check_agent_usable(episode, found, agent_id, found[0].policy_id, "end_episode")
        if rewards is not None and rewards[i]:
            policy_id = "?" if found is None else found[0].policy_id
            _check_agent_reward(
                episode, found, agent_id, policy_id, float(rewards[i]), "end_episode"
            )


def _where(episode: Episode) -> dict[str, tuple[AgentColumns, int]]:
    return {} if episode.agents is None else episode.agents.where


def _check_agent_usable(
    episode: Episode, found: tuple[AgentColumns, int], agent_id: str, policy_id: str, call: str
) -> None:
    columns, row = found
    if columns.done[row]:
        raise EpisodeError(
            f"{call} for episode '{episode.episode_id}': agent '{agent_id}' (policy "
            f"'{columns.policy_id}') is done (marked in multiagent_done_dict) and cannot act, "
            "be rewarded or end again; use a new agent id for a new agent"
        )
    if columns.policy_id != policy_id:
        raise EpisodeError(
            f"{call} for episode '{episode.episode_id}': agent '{agent_id}' acts for policy "
            f"'{columns.policy_id}' in this episode, not '{policy_id}'; an agent keeps its "
            "policy for the whole episode"
        )


def _check_agent_reward(
    episode: Episode,
    found: tuple[AgentColumns, int] | None,
    agent_id: str,
    policy_id: str,
    reward: float,
    call: str,
) -> None:
    where = f"{call} for episode '{episode.episode_id}'"
    if found is None or not found[0].steps[found[1]]:
        raise EpisodeError(
            f"{where}: a reward for agent '{agent_id}' (policy '{policy_id}'), which has not "
            "acted in this episode; a reward belongs to the agent's previous action, so log "
            "it after the agent's first get_action/log_action"
        )
    pending = float(found[0].pending[found[1]])
    if not -MAX_ABS_REWARD <= pending + reward <= MAX_ABS_REWARD:
        raise_reward(f"{where}, agent '{agent_id}'", pending, reward)
