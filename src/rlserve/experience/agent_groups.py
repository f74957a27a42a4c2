"""The agents of one multi-agent call, grouped by policy, with their values checked.

A multi-agent call names agents (``agent_ids``) and sends one observation (and, for
``log_action``, one action) per agent. The server resolves each agent's policy (the call's
``policy_ids`` first, then the mapping), groups the agents by policy and checks each group's
observations against that policy's space in one vectorised pass: the work per call is a few numpy
operations per policy, not a loop of single-agent checks. A value that does not fit is reported
naming the agent and its policy.

Where the server maps agents with a function (a served Algorithm's ``policy_mapping_fn``),
:func:`assigned` asks it once per new agent of an episode and keeps the answers in the episode.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from rlserve.errors import EpisodeError, SpaceError
from rlserve.experience.episode_records import Episode
from rlserve.policy.action_layout import encode_action
from rlserve.protocol.mapping import PolicyMapping
from rlserve.protocol.spaces import check_batch, check_one, check_value
from rlserve.protocol.values import check_float32

GROUPINGS_KEPT = 256
"""Agent-id lists whose grouping is remembered (a simulator sends the same list tick after tick)."""


@dataclass(frozen=True, slots=True)
class Grouping:
    """How the agents of a call split by policy.

    Attributes:
        policy_ids: Each agent's policy, in the call's order.
        groups: ``(policy id, positions of its agents in the call)``, in order of first
            appearance; a single group covers every agent.
    """

    policy_ids: list[str]
    groups: list[tuple[str, np.ndarray]]


def rows_of(grouping: Grouping, blocks: list[np.ndarray], count: int) -> list[Any]:
    """One row per agent of the call (``count``), in the call's order: views into ``blocks``."""
    if len(blocks) == 1:
        return list(blocks[0])
    rows: list[Any] = [None] * count
    for block, (_, idx) in zip(blocks, grouping.groups, strict=True):
        for j, i in enumerate(idx.tolist()):
            rows[i] = block[j]
    return rows


AskPolicies = Callable[[str, list[str]], list[str]]
"""Asks the mapping function for the policies of an episode's new agents: ``(episode id,
agent ids) -> policy ids``."""


def assigned(
    episode: Episode,
    agent_ids: list[str],
    named: list[str | None] | None,
    mapping: PolicyMapping,
    ask: AskPolicies,
    limit: int,
) -> list[str | None] | None:
    """The policies a call's agents act for where a mapping function decides them.

    A policy the call names wins; an agent a rule maps is left to the rules (None, as without
    a function); an agent the episode already has keeps its policy; every other agent is new
    to the episode and is asked about once (all of a call's new agents in one ``ask``), the
    answer kept in :attr:`Episode.mapped`. At ``limit`` answers kept the episode forgets them
    (its agents keep their policies; an agent that never joined is asked again).

    Returns:
        The call's explicit policy per agent for :meth:`AgentGrouper.group` (None when there
        is none, so that the rules' remembered groupings serve it).
    """
    mapped = episode.mapped
    if mapped is None:
        mapped = episode.mapped = {}
    known = episode.agents
    out: list[str | None] = []
    new: list[int] = []
    for i, agent_id in enumerate(agent_ids):
        policy_id = named[i] if named is not None else None
        if policy_id is None:
            policy_id = mapped.get(agent_id)
        if policy_id is None and mapping.policy_for(agent_id) is None:
            policy_id = None if known is None else known.policy_of(agent_id)
            if policy_id is None:
                new.append(i)
        out.append(policy_id)
    if new:
        if len(mapped) + len(new) > limit:
            mapped.clear()
        answers = ask(episode.episode_id, [agent_ids[i] for i in new])
        for i, policy_id in zip(new, answers, strict=True):
            mapped[agent_ids[i]] = out[i] = policy_id
    return out if any(p is not None for p in out) else None


class AgentGrouper:
    """Resolves and groups the agents of calls, remembering recent agent-id lists.

    Args:
        mapping: The server's agent -> policy mapping.
        policies: The served policies' spaces by id: ``(observation space, action space)``.
    """

    def __init__(
        self,
        mapping: PolicyMapping,
        policies: dict[str, tuple[gym.Space[Any], gym.Space[Any]]],
    ):
        self.mapping = mapping
        self.policies = policies
        self._recent: OrderedDict[tuple[str, ...], Grouping] = OrderedDict()

    def group(self, agent_ids: list[str], explicit: list[str | None] | None) -> Grouping:
        """The policy of each agent and the groups.

        Raises:
            SpaceError: An agent maps to no policy (naming it and the mapping rules).
            EpisodeError: An explicitly named policy is not served.
        """
        key = tuple(agent_ids)
        if explicit is None:
            known = self._recent.get(key)
            if known is not None:
                return known
        policy_ids = []
        for i, agent_id in enumerate(agent_ids):
            named = explicit[i] if explicit is not None else None
            if named is not None:
                if named not in self.policies:
                    raise EpisodeError(
                        f"agent '{agent_id}' names the policy '{named}', which this server does "
                        f"not serve; it serves {sorted(self.policies)}"
                    )
                policy_ids.append(named)
            else:
                policy_ids.append(self.mapping.resolve(agent_id))
        first = policy_ids[0]
        if all(p == first for p in policy_ids):
            groups = [(first, np.arange(len(agent_ids)))]
        else:
            positions: dict[str, list[int]] = {}
            for i, policy_id in enumerate(policy_ids):
                positions.setdefault(policy_id, []).append(i)
            groups = [(p, np.asarray(idx)) for p, idx in positions.items()]
        grouping = Grouping(policy_ids, groups)
        if explicit is None:
            self._recent[key] = grouping
            if len(self._recent) > GROUPINGS_KEPT:
                self._recent.popitem(last=False)
        return grouping

    def observations(
        self, grouping: Grouping, agent_ids: list[str], values: Any, where: str
    ) -> tuple[list[np.ndarray], list[Any]]:
        """Check the call's observations group by group.

        Args:
            grouping: From :meth:`group`.
            agent_ids: The call's agents.
            values: One observation per agent: a list, or a stacked array.
            where: The field's name for error messages.

        Returns:
            Each group's flattened float32 ``[k, D]`` observations, and one row per agent in
            the call's order (views into those blocks).

        Raises:
            SpaceError: The count is wrong, or an agent's observation does not fit its policy's
                space (naming the agent and the policy).
        """
        blocks = self.blocks(grouping, agent_ids, values, where)
        return blocks, rows_of(grouping, blocks, len(agent_ids))

    def blocks(
        self, grouping: Grouping, agent_ids: list[str], values: Any, where: str
    ) -> list[np.ndarray]:
        """Check the call's observations group by group; each group's ``[k, D]`` float32 block.

        Raises:
            SpaceError: As :meth:`observations`.
        """
        count = len(agent_ids)
        if isinstance(values, np.ndarray):
            if values.ndim == 0 or values.shape[0] != count:
                raise SpaceError(
                    f"{where}: {0 if values.ndim == 0 else values.shape[0]} observations for "
                    f"{count} agents; send one per agent of 'agent_ids', in order"
                )
        elif not isinstance(values, list) or len(values) != count:
            got = len(values) if isinstance(values, list) else type(values).__name__
            raise SpaceError(
                f"{where}: must hold one observation per agent of 'agent_ids' ({count}), got {got}"
            )
        blocks = []
        for policy_id, idx in grouping.groups:
            space = self.policies[policy_id][0]
            if len(grouping.groups) == 1:
                part = values
            elif isinstance(values, np.ndarray):
                part = values[idx]
            else:
                part = [values[i] for i in idx]
            try:
                blocks.append(check_batch(space, part, len(idx), where))
            except SpaceError:
                self._name_the_agent(space, policy_id, part, [agent_ids[i] for i in idx], where)
                raise
        return blocks

    def actions(
        self, grouping: Grouping, agent_ids: list[str], values: Any, where: str
    ) -> list[Any]:
        """Check one taken action per agent; return each in the form the learner trains on.

        Raises:
            SpaceError: The count is wrong, or an action does not fit its agent's policy.
        """
        count = len(agent_ids)
        if isinstance(values, np.ndarray) and values.ndim > 0:
            values = list(values)
        if not isinstance(values, list) or len(values) != count:
            raise SpaceError(
                f"{where}: must hold one action per agent of 'agent_ids' ({count}), in order"
            )
        out: list[Any] = []
        for i, agent_id in enumerate(agent_ids):
            policy_id = grouping.policy_ids[i]
            space = self.policies[policy_id][1]
            label = f"{where}[{i}] (agent '{agent_id}', policy '{policy_id}')"
            action = check_value(space, values[i], label)
            if isinstance(space, gym.spaces.Discrete):
                out.append(int(action) - int(space.start))
            else:
                out.append(check_float32(encode_action(space, action), label))
        return out

    @staticmethod
    def _name_the_agent(
        space: gym.Space[Any], policy_id: str, part: Any, agent_ids: list[str], where: str
    ) -> None:
        """Re-check one by one and raise naming the first agent whose observation is wrong."""
        for j, agent_id in enumerate(agent_ids):
            try:
                value = part[j]
            except (IndexError, KeyError, TypeError):
                return
            try:
                check_one(space, value, f"{where} of agent '{agent_id}' (policy '{policy_id}')")
            except SpaceError as exc:
                raise SpaceError(
                    f"{exc}; the policy '{policy_id}' takes observations in {space}"
                ) from None
