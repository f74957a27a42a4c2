"""Parsers of the multi-agent forms of the episode calls (a request with ``agent_ids``).

``observations``, ``rewards``, ``infos`` and ``policy_ids`` then hold one entry per agent named
in ``agent_ids`` (``docs/protocol.md``, the multi-agent section). ``map_agents`` (a
local-inference client asking which policy acts for new agents) is here too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlserve.errors import DecodeError, LimitExceededError
from rlserve.protocol.episode_requests import EndEpisode, GetAction, LogAction, LogReturns
from rlserve.protocol.fields import RequestFields, checked_numbers, float_list

_STR_ONLY = {str}


def _agent_ids(f: RequestFields, name: str = "agent_ids", allow_empty: bool = False) -> list[str]:
    ids = f.raw.get(name)
    if ids is None:
        if allow_empty:
            return []
        raise f.missing(name)
    if not isinstance(ids, list) or (not ids and not allow_empty):
        raise f.wrong(name, "a non-empty list of strings", ids)
    if len(ids) > f.limits.max_agents_per_call:
        raise LimitExceededError(
            f"'{f.kind}' names {len(ids)} agents in '{name}'; the limit is "
            f"{f.limits.max_agents_per_call} (max_agents_per_call)"
        )
    if (
        ids
        and set(map(type, ids)) == _STR_ONLY
        and min(map(len, ids)) >= 1
        and max(map(len, ids)) <= f.limits.max_id_length
    ):
        agent_ids: list[str] = ids  # every id is a string of an allowed length
    else:
        agent_ids = [f.check_id(name, agent_id) for agent_id in ids]
    if len(set(agent_ids)) != len(agent_ids):
        raise DecodeError(f"'{f.kind}' '{name}' names an agent more than once")
    return agent_ids


def _per_agent_rewards(f: RequestFields, count: int) -> np.ndarray | None:
    rewards = f.raw.get("rewards")
    if rewards is None:
        return None
    numbers = checked_numbers(rewards, count)
    if numbers is None:
        numbers = np.asarray(float_list(f, "rewards", rewards, count), dtype=np.float64)
    return numbers


def _per_agent_infos(f: RequestFields, count: int) -> list[dict[str, Any] | None] | None:
    infos = f.raw.get("infos")
    if infos is None:
        return None
    if not isinstance(infos, list) or len(infos) != count:
        raise DecodeError(
            f"'{f.kind}' 'infos' must be a list of {count} maps or nils, one per agent of "
            "'agent_ids'"
        )
    return [f.check_info("infos", info) for info in infos]


def _per_agent_policies(f: RequestFields, count: int) -> list[str | None] | None:
    policies = f.raw.get("policy_ids")
    if policies is None:
        return None
    if not isinstance(policies, list) or len(policies) != count:
        raise DecodeError(
            f"'{f.kind}' 'policy_ids' must be a list of {count} policy ids or nils, one per "
            "agent of 'agent_ids'"
        )
    return [None if p is None else f.check_id("policy_ids", p) for p in policies]


def _parse_multi_get_action(f: RequestFields, request_id: int) -> GetAction:
    agent_ids = _agent_ids(f)
    seq = f.seq_opt("seq")
    return GetAction(
        request_id,
        [f.id_("episode_id")],
        f.present("observations"),
        _per_agent_rewards(f, len(agent_ids)),
        batched=False,
        seqs=None if seq is None else [seq],
        infos=_per_agent_infos(f, len(agent_ids)),
        agent_ids=agent_ids,
        policy_ids=_per_agent_policies(f, len(agent_ids)),
    )


def _parse_multi_log_action(f: RequestFields, request_id: int) -> LogAction:
    agent_ids = _agent_ids(f)
    return LogAction(
        request_id,
        f.id_("episode_id"),
        f.present("observations"),
        f.present("actions"),
        seq=f.seq_opt("seq"),
        agent_ids=agent_ids,
        rewards=_per_agent_rewards(f, len(agent_ids)),
        infos=_per_agent_infos(f, len(agent_ids)),
        policy_ids=_per_agent_policies(f, len(agent_ids)),
    )


def _parse_multi_log_returns(f: RequestFields, request_id: int) -> LogReturns:
    agent_ids = _agent_ids(f, allow_empty=True)
    rewards = _per_agent_rewards(f, len(agent_ids))
    if rewards is None:
        if agent_ids:
            raise f.missing("rewards")
        rewards = np.zeros(0)
    done: dict[str, bool] = {}
    for name, terminated in (("terminated_agents", True), ("truncated_agents", False)):
        for agent_id in _agent_ids(f, name, allow_empty=True):
            if agent_id in done:
                raise DecodeError(
                    f"'log_returns' marks agent '{agent_id}' both terminated and truncated"
                )
            done[agent_id] = terminated
    if not agent_ids and not done:
        raise DecodeError(
            "'log_returns' with 'agent_ids' needs at least one agent: a reward, or one in "
            "'terminated_agents' / 'truncated_agents'"
        )
    return LogReturns(
        request_id,
        f.id_("episode_id"),
        0.0,
        seq=f.seq_opt("seq"),
        agent_ids=agent_ids,
        rewards=rewards,
        infos=_per_agent_infos(f, len(agent_ids)),
        done=done,
    )


def _parse_multi_end_episode(f: RequestFields, request_id: int) -> EndEpisode:
    agent_ids = _agent_ids(f, allow_empty=True)
    observations = f.raw.get("observations", [])
    if not agent_ids:
        observations = []
    elif "observations" not in f.raw:
        raise f.missing("observations")
    return EndEpisode(
        request_id,
        f.id_("episode_id"),
        observations,
        f.bool_("truncated", False),
        seq=f.seq_opt("seq"),
        agent_ids=agent_ids,
        rewards=_per_agent_rewards(f, len(agent_ids)),
        infos=_per_agent_infos(f, len(agent_ids)),
    )


@dataclass(slots=True)
class MapAgents:
    """Which policy acts for each of an episode's new agents (``type: map_agents``).

    A local-inference client sends it for agents that no ``welcome.mapping`` rule maps, when
    ``welcome.map_agents`` says the server maps them with a function of its own.

    Attributes:
        id: Request id.
        episode_id: The client's episode the agents joined.
        agent_ids: The agents (1 to ``max_agents_per_call``, each once).
    """

    id: int
    episode_id: str
    agent_ids: list[str]

    def to_wire(self) -> dict[str, Any]:
        """The request as a map for the codec."""
        return {
            "type": "map_agents",
            "episode_id": self.episode_id,
            "agent_ids": self.agent_ids,
            "id": self.id,
        }


def parse_map_agents(f: RequestFields, request_id: int) -> MapAgents:
    """Read a ``map_agents`` request (its ids checked against the limits)."""
    return MapAgents(request_id, f.id_("episode_id"), _agent_ids(f))


MULTI_AGENT_PARSERS: dict[
    str, Callable[[RequestFields, int], GetAction | LogAction | LogReturns | EndEpisode]
] = {
    "get_action": _parse_multi_get_action,
    "log_action": _parse_multi_log_action,
    "log_returns": _parse_multi_log_returns,
    "end_episode": _parse_multi_end_episode,
}
"""Parsers of the multi-agent forms (a request with ``agent_ids``)."""
