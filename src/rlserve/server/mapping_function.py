"""A served Algorithm's ``policy_mapping_fn``: the server asks it about agents no rule maps.

The function is user code in the server's process; it never travels over the wire. It is called
as the hosted Algorithm calls it, ``policy_mapping_fn(agent_id, episode)``, where ``episode`` is
a :class:`MappedEpisode` (the episode's id). The server asks it once per agent per episode: for
remote inference when an agent first appears in a call (the answer is kept in the episode), for
local inference when the client asks with ``map_agents`` (the client keeps the answer). Mapping
rules stay the fast path: an agent a rule maps is never asked about. A function that raises or
answers something other than a served policy id fails the call with ``bad_value`` naming the
agent; the server goes on.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from rlserve.errors import SpaceError
from rlserve.protocol.mapping import PolicyMapping
from rlserve.protocol.multi_agent_requests import MapAgents
from rlserve.protocol.replies import AgentsMapped

MappingFn = Callable[..., Any]
"""RLlib's ``policy_mapping_fn(agent_id, episode, **kwargs) -> policy id``."""


def as_two_argument(fn: MappingFn) -> MappingFn:
    """``fn`` callable as ``fn(agent_id, episode)``, given ``worker=None`` where it takes one.

    RLlib's older API stack calls ``policy_mapping_fn(agent_id, episode, worker=worker)`` and its
    examples declare ``worker`` without a default; rlserve has no rollout worker to give.
    """
    try:
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # builtins and C callables: call as they are
        return fn
    worker = parameters.get("worker")
    named = worker is not None and worker.kind is not worker.POSITIONAL_ONLY
    if named or any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
        return functools.partial(fn, worker=None)
    return fn


@dataclass(frozen=True, slots=True)
class MappedEpisode:
    """The ``episode`` a mapping function is given for a network client's episode.

    Attributes:
        episode_id: The episode's id (the client's, for local inference).
    """

    episode_id: str


class MappingFunction:
    """Calls a mapping function for the agents of network clients' episodes.

    Args:
        fn: The function.
        mapping: The server's rules (they win: an agent a rule maps is not asked about).
        policies: The served policy ids (an answer must be one of them).
    """

    def __init__(self, fn: MappingFn, mapping: PolicyMapping, policies: Iterable[str]):
        self.fn = as_two_argument(fn)
        self.mapping = mapping
        self.policies = frozenset(policies)
        self.calls = 0
        """How many times the function was called."""

    def ask(self, episode_id: str, agent_ids: list[str]) -> list[str]:
        """The function's policy for each agent of an episode, in order.

        Raises:
            SpaceError: The function raised, or answered something that is not a served
                policy id (naming the agent, the episode and the answer).
        """
        episode = MappedEpisode(episode_id)
        out = []
        for agent_id in agent_ids:
            self.calls += 1
            try:
                policy_id = self.fn(agent_id, episode)
            except Exception as exc:  # user code: its failure is this call's error only
                raise SpaceError(
                    f"the server's policy_mapping_fn raised {exc!r} for agent '{agent_id}' of "
                    f"episode '{episode_id}'; fix the function (it runs in the server), or map "
                    "that agent with a rule: multi_agent(policy_mapping={...})"
                ) from None
            if not isinstance(policy_id, str) or policy_id not in self.policies:
                raise SpaceError(
                    f"the server's policy_mapping_fn maps agent '{agent_id}' of episode "
                    f"'{episode_id}' to {policy_id!r}, which is not a served policy "
                    f"({sorted(self.policies)}); make it return one of them"
                )
            out.append(policy_id)
        return out

    def map_agents(self, request: MapAgents) -> dict[str, Any]:
        """Answer ``map_agents``: each agent's policy by the rules, else by the function."""
        rules = [self.mapping.policy_for(agent_id) for agent_id in request.agent_ids]
        new = [a for a, p in zip(request.agent_ids, rules, strict=True) if p is None]
        asked = iter(self.ask(request.episode_id, new)) if new else iter(())
        return AgentsMapped(
            request.id, [p if p is not None else next(asked) for p in rules]
        ).to_wire()


def rules_only(mapping: PolicyMapping, request: MapAgents) -> dict[str, Any]:
    """Answer ``map_agents`` on a server without a function: by the rules.

    Raises:
        SpaceError: A rule maps no agent (as a call naming it would fail).
    """
    return AgentsMapped(request.id, [mapping.resolve(a) for a in request.agent_ids]).to_wire()
