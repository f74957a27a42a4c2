"""Which policy acts for which agent: the agent-id -> policy-id mapping of a multi-agent server.

A server declares its policies (each with its own spaces and algorithm settings) and a mapping
from agent ids to policy ids. Functions cannot travel over the wire, so the mapping is data: an
ordered list of rules, each an exact agent id or a shell-style pattern (``red_*``, ``unit_??``,
``[ab]_*``; :mod:`fnmatch` rules, case-sensitive) and the policy it selects. An exact id wins
over every pattern; among patterns the first that matches wins. With one policy and no rules,
every agent maps to that policy. The server sends the rules in ``welcome``, so a client resolves
agents exactly as the server does; a call may also name an agent's policy explicitly.

Needs only the standard library: the client embeds it.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping
from typing import Any

from rlserve.errors import ConfigError, SpaceError

ALL_AGENTS = "__all__"
"""The key of ``multiagent_done_dict`` that ends the whole episode (RLlib's convention)."""

MAX_AGENTS_CACHE = 100_000
"""Resolved agent ids remembered by a mapping (pattern matching is done once per id)."""

_PATTERN_CHARS = frozenset("*?[")


def is_pattern(rule: str) -> bool:
    """Whether a mapping rule is a pattern (has ``*``, ``?`` or ``[``) rather than an exact id."""
    return any(ch in _PATTERN_CHARS for ch in rule)


class PolicyMapping:
    """Resolves agent ids to policy ids from exact ids and shell-style patterns.

    Args:
        rules: ``(agent id or pattern, policy id)`` pairs, in order of precedence for patterns.
        policies: The policy ids the server serves; every rule must name one of them.

    Raises:
        ConfigError: A rule names an unknown policy, or a rule is empty.
    """

    def __init__(self, rules: Iterable[tuple[str, str]], policies: Iterable[str]):
        self.policies = tuple(policies)
        self.rules: list[tuple[str, str]] = []
        self._exact: dict[str, str] = {}
        self._patterns: list[tuple[str, re.Pattern[str], str]] = []
        known = set(self.policies)
        for rule, policy_id in rules:
            if not isinstance(rule, str) or not rule:
                raise ConfigError(f"mapping rule {rule!r} must be a non-empty agent id or pattern")
            if policy_id not in known:
                raise ConfigError(
                    f"mapping rule '{rule}' names the policy '{policy_id}', which is not "
                    f"declared; declared policies: {sorted(known)}"
                )
            self.rules.append((rule, policy_id))
            if is_pattern(rule):
                self._patterns.append((rule, re.compile(fnmatch.translate(rule)), policy_id))
            else:
                self._exact.setdefault(rule, policy_id)
        self._cache: dict[str, str | None] = {}

    @classmethod
    def from_table(cls, table: Mapping[str, Any] | None, policies: Iterable[str]) -> PolicyMapping:
        """Build from a TOML ``[mapping]`` table (``"red_*" = "red"``), in file order."""
        rules = []
        for rule, policy_id in (table or {}).items():
            if not isinstance(policy_id, str):
                raise ConfigError(
                    f"mapping rule '{rule}' must name a policy id (a string), got "
                    f"{type(policy_id).__name__}"
                )
            rules.append((rule, policy_id))
        return cls(rules, policies)

    def to_wire(self) -> list[list[str]]:
        """The rules as ``[[agent id or pattern, policy id], ...]`` for ``welcome``."""
        return [[rule, policy_id] for rule, policy_id in self.rules]

    @classmethod
    def from_wire(cls, raw: Any, policies: Iterable[str]) -> PolicyMapping:
        """Rebuild from :meth:`to_wire` output (as the client receives it)."""
        if raw is None:
            return cls([], policies)
        if not isinstance(raw, list) or not all(
            isinstance(r, list | tuple) and len(r) == 2 for r in raw
        ):
            raise SpaceError("welcome 'mapping' must be a list of [agent id or pattern, policy id]")
        return cls([(str(rule), str(pid)) for rule, pid in raw], policies)

    def policy_for(self, agent_id: str) -> str | None:
        """The policy of ``agent_id``, or None when no rule matches it."""
        try:
            return self._cache[agent_id]
        except KeyError:
            pass
        found = self._exact.get(agent_id)
        if found is None:
            for _, pattern, policy_id in self._patterns:
                if pattern.fullmatch(agent_id):
                    found = policy_id
                    break
        if found is None and not self.rules and len(self.policies) == 1:
            found = self.policies[0]
        if len(self._cache) >= MAX_AGENTS_CACHE:
            self._cache.clear()
        self._cache[agent_id] = found
        return found

    def resolve(self, agent_id: str) -> str:
        """The policy of ``agent_id``.

        Raises:
            SpaceError: No rule maps it (the message lists the rules and how to fix it).
        """
        policy_id = self.policy_for(agent_id)
        if policy_id is None:
            raise SpaceError(self.unmapped_message(agent_id))
        return policy_id

    def unmapped_message(self, agent_id: str) -> str:
        """The error text for an agent no rule maps."""
        rules = ", ".join(f"'{r}' -> '{p}'" for r, p in self.rules) or "none"
        return (
            f"agent '{agent_id}' maps to no policy (mapping rules: {rules}; policies: "
            f"{list(self.policies)}); add a rule to the server's [mapping] table, or name the "
            "agent's policy in the call"
        )
