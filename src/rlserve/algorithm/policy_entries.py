"""A policy's entry in ``multi_agent(policies={id: entry})``: its overrides, algorithm and spaces.

An entry is a dict of settings overrides, RLlib's ``(None, observation_space, action_space,
overrides)`` tuple or an rlserve ``PolicySpec``; the overrides may name the policy's algorithm
(``"algo"``). Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlserve.algorithm.training_settings import settings_fields
from rlserve.errors import ConfigError
from rlserve.learners.registry import algorithm

if TYPE_CHECKING:
    from rlserve.server.policies import PolicySpec


@dataclass
class PolicyEntry:
    """What one entry of ``multi_agent(policies=...)`` declares."""

    overrides: dict[str, Any]
    """Its settings overrides, as fields of its algorithm's settings dataclass."""
    algo: str | None
    """The algorithm it names (the registry's name), or None: the config's own."""
    spec: PolicySpec | None
    """Its spaces, when the entry gives them."""


def policy_entry(policy_id: str, value: Any, default_algo: str) -> PolicyEntry:
    """Read a policy's entry; ``default_algo`` trains it unless it names an algorithm.

    Raises:
        ConfigError: Not one of the entry forms, a tuple of other than 4 items, an ``"algo"``
            that is not a known algorithm's name or disagrees with the ``PolicySpec``'s, or an
            override that is not a setting of the policy's algorithm.
    """
    from rlserve.server.policies import PolicySpec

    if isinstance(value, PolicySpec):
        overrides, algo = _overrides(policy_id, dict(value.config), value.algo, default_algo)
        return PolicyEntry(overrides, algo, value)
    if isinstance(value, tuple | list):
        if len(value) != 4:
            raise ConfigError(
                f"policy '{policy_id}': a tuple must be (None, observation_space, "
                f"action_space, overrides), RLlib's PolicySpec form; got {len(value)} items"
            )
        _, obs_space, act_space, given = value
        overrides, algo = _overrides(policy_id, dict(given or {}), None, default_algo)
        spec = None
        if obs_space is not None and act_space is not None:
            spec = PolicySpec(policy_id, obs_space, act_space, overrides, algo=algo)
        return PolicyEntry(overrides, algo, spec)
    if value is not None and not isinstance(value, dict):
        raise ConfigError(
            f"policy '{policy_id}': give settings overrides as a dict, a PolicySpec or "
            f"(None, observation_space, action_space, overrides); got {type(value).__name__}"
        )
    overrides, algo = _overrides(policy_id, dict(value or {}), None, default_algo)
    return PolicyEntry(overrides, algo, None)


def _overrides(
    policy_id: str, overrides: dict[str, Any], algo: str | None, default_algo: str
) -> tuple[dict[str, Any], str | None]:
    """The overrides as fields of the policy's algorithm's settings, and the algorithm named.

    ``"algo"`` is taken out of the overrides; the algorithm is None when none is named.
    """
    named = overrides.pop("algo", None)
    if named is not None and not isinstance(named, str):
        raise ConfigError(
            f"policy '{policy_id}': 'algo' must name an algorithm (a string), got {named!r}"
        )
    if named is not None and algo is not None and algorithm(named).name != algo:
        raise ConfigError(
            f"policy '{policy_id}': PolicySpec(algo='{algo}') and the override "
            f"'algo': '{named}' disagree; name the algorithm once"
        )
    chosen = algo or named
    name = None if chosen is None else algorithm(chosen).name
    return settings_fields(name or default_algo, overrides, f"policy '{policy_id}'"), name
