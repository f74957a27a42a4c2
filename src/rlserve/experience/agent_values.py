"""Client side of multi-agent calls: the policies a server declares, and per-agent values.

The ``welcome`` reply lists the server's policies (each with its spaces) and the agent -> policy
mapping; :class:`PolicyTable` keeps them so that the client checks each agent's observation
against its own policy's space before sending, stacks the observations of agents that share one
Box space into one array (one typed array on the wire instead of one per agent), and turns the
reply's actions back into a dict keyed by agent id in each policy's action form. Where the
server maps agents with a function of its own (``welcome.map_agents``) the client asks it about
new agents and passes the answers (``assigned``) to the methods here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import spaces

from rlserve.errors import EpisodeError, SpaceError
from rlserve.experience.frame_stacks import FrameRule
from rlserve.policy.action_layout import action_from_wire
from rlserve.protocol.mapping import PolicyMapping
from rlserve.protocol.spaces import check_batch, check_value, from_description


@dataclass(frozen=True, slots=True)
class PolicySpaces:
    """One served policy's spaces."""

    policy_id: str
    observation_space: spaces.Space[Any]
    action_space: spaces.Space[Any]
    frames: FrameRule | None = None
    """The policy's frame stacking (``frame_stack`` > 1 in ``welcome``): episodes send single
    frames of ``observation_space`` and are recorded and acted on stacked."""

    @property
    def discrete(self) -> bool:
        """Whether the actions are Discrete (plain ints)."""
        return isinstance(self.action_space, spaces.Discrete)


class PolicyTable:
    """The server's policies and mapping, as told in ``welcome``.

    Args:
        welcome: The server's ``welcome`` reply.
        policy_ids: Explicit agent -> policy choices of this client (they win over the mapping).
    """

    def __init__(self, welcome: dict[str, Any], policy_ids: Mapping[str, str] | None = None):
        self.policies = {
            pid: PolicySpaces(
                pid,
                from_description(desc["observation_space"]),
                from_description(desc["action_space"]),
                _frames(desc),
            )
            for pid, desc in welcome["policies"].items()
        }
        self.mapping = PolicyMapping.from_wire(welcome.get("mapping"), self.policies)
        self.multi_agent = bool(welcome.get("multi_agent", False))
        self.map_agents = welcome.get("map_agents") is True
        """Whether the server maps the agents no rule maps with a function (ask it)."""
        self.explicit = dict(policy_ids or {})
        # The policies of the last agent-id list seen (a simulator sends the same list tick
        # after tick): the list, each agent's policy, and the one policy they share (or None).
        self._recent: tuple[list[str], list[PolicySpaces], PolicySpaces | None] | None = None
        for agent_id, pid in self.explicit.items():
            if pid not in self.policies:
                raise EpisodeError(
                    f"policy_ids names the policy '{pid}' for agent '{agent_id}', which the "
                    f"server does not serve; it serves {sorted(self.policies)}"
                )

    def policy_of(self, agent_id: str, assigned: Mapping[str, str] | None = None) -> PolicySpaces:
        """The policy acting for ``agent_id`` (``assigned``: the server function's answers).

        Raises:
            SpaceError: No mapping rule matches (the message says how to fix it).
        """
        explicit = self.explicit.get(agent_id)
        if explicit is None and assigned:
            explicit = assigned.get(agent_id)
        if explicit is not None:
            return self.policies[explicit]
        return self.policies[self.mapping.resolve(agent_id)]

    def unmapped(self, agent_ids: list[str], known: Mapping[str, str]) -> list[str]:
        """The agents neither this client, ``known`` nor a rule maps: ask the server."""
        explicit, mapping = self.explicit, self.mapping
        return [
            a
            for a in agent_ids
            if a not in known and a not in explicit and mapping.policy_for(a) is None
        ]

    def frame_rule(self, policy_id: str) -> FrameRule | None:
        """The policy's frame stacking (None: it reads single frames)."""
        return self.policies[policy_id].frames

    def explicit_ids(self, agent_ids: list[str]) -> list[str | None] | None:
        """The wire's ``policy_ids`` for these agents (None when none is chosen explicitly)."""
        if not self.explicit:
            return None
        chosen = [self.explicit.get(a) for a in agent_ids]
        return chosen if any(c is not None for c in chosen) else None

    def policies_of(
        self, agent_ids: list[str], assigned: Mapping[str, str] | None = None
    ) -> tuple[list[PolicySpaces], PolicySpaces | None]:
        """Each agent's policy, and the policy they all share (None when they do not).

        Raises:
            SpaceError: No mapping rule matches an agent.
        """
        recent = self._recent
        if not assigned and recent is not None and recent[0] == agent_ids:
            return recent[1], recent[2]
        policies = [self.policy_of(a, assigned) for a in agent_ids]
        first = policies[0] if policies else None
        shared = first if all(p is first for p in policies) else None
        if not assigned:  # answers are per episode: not remembered across calls
            self._recent = (list(agent_ids), policies, shared)
        return policies, shared

    def observations(
        self,
        agent_ids: list[str],
        rows: list[Any],
        check: bool,
        assigned: Mapping[str, str] | None = None,
    ) -> Any:
        """Check each agent's observation; one stacked array when all share one Box policy.

        Args:
            agent_ids: The agents.
            rows: Their observations, in the same order.
            check: Check them against the spaces (else only stack them).
            assigned: The server function's answers for agents no rule maps.

        Raises:
            SpaceError: An observation does not fit its agent's policy (naming both).
        """
        policies, first = self.policies_of(agent_ids, assigned)
        if first is not None and isinstance(first.observation_space, spaces.Box):
            try:
                stacked = np.asarray(rows, dtype=first.observation_space.dtype)
            except (TypeError, ValueError):
                stacked = None
            if stacked is not None and stacked.shape[1:] == first.observation_space.shape:
                if check:
                    try:
                        check_batch(first.observation_space, stacked, len(rows), "observations")
                    except SpaceError:
                        self._name_bad(agent_ids, rows, policies)
                        raise
                return stacked
        if check:
            self._name_bad(agent_ids, rows, policies)
        return [plain_value(value) for value in rows]

    def actions(
        self, agent_ids: list[str], wire: Any, assigned: Mapping[str, str] | None = None
    ) -> dict[str, Any]:
        """The reply's actions as a dict keyed by agent id, in each policy's action form."""
        if isinstance(wire, np.ndarray):
            _, shared = self.policies_of(agent_ids, assigned)
            policy = shared or self.policy_of(agent_ids[0], assigned)
            if policy.discrete:
                return dict(zip(agent_ids, wire.tolist(), strict=True))
            return dict(zip(agent_ids, wire, strict=True))
        out = {}
        for agent_id, value in zip(agent_ids, wire, strict=True):
            policy = self.policy_of(agent_id, assigned)
            out[agent_id] = (
                int(value) if policy.discrete else action_from_wire(policy.action_space, value)
            )
        return out

    def taken_actions(
        self,
        agent_ids: list[str],
        actions: Mapping[str, Any],
        assigned: Mapping[str, str] | None = None,
    ) -> list[Any]:
        """Check actions taken by someone else against each agent's action space."""
        out = []
        for agent_id in agent_ids:
            policy = self.policy_of(agent_id, assigned)
            where = f"action of agent '{agent_id}' (policy '{policy.policy_id}')"
            out.append(plain_value(check_value(policy.action_space, actions[agent_id], where)))
        return out

    def _name_bad(
        self, agent_ids: list[str], rows: list[Any], policies: list[PolicySpaces]
    ) -> None:
        for agent_id, value, policy in zip(agent_ids, rows, policies, strict=True):
            where = f"observation of agent '{agent_id}' (policy '{policy.policy_id}')"
            check_value(policy.observation_space, value, where)


def plain_value(value: Any) -> Any:
    """A value with tuples turned into lists, recursively (msgpack and JSON have no tuple)."""
    if isinstance(value, tuple):
        return [plain_value(v) for v in value]
    if isinstance(value, dict):
        return {k: plain_value(v) for k, v in value.items()}
    return value


def _frames(desc: dict[str, Any]) -> FrameRule | None:
    """A policy's frame stacking from its ``welcome`` entry (``frame_stack``, absent: 1)."""
    n = desc.get("frame_stack", 1)
    if isinstance(n, bool) or not isinstance(n, int):
        raise SpaceError(f"welcome: frame_stack must be a whole number, got {n!r}")
    return FrameRule.of(from_description(desc["observation_space"]), n)
