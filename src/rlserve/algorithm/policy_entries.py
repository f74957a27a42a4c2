"""``AlgorithmConfig.multi_agent()``, and a policy's entry in it: overrides, algorithm, spaces.

:class:`MultiAgentConfig` gives the config ``multi_agent()`` (the policies, the settings of each
algorithm they name, and who uses which) and answers which algorithm trains a policy.

An entry is a dict of settings overrides, RLlib's ``(None, observation_space, action_space,
overrides)`` tuple or an rlserve ``PolicySpec``; the overrides may name the policy's algorithm
(``"algo"``). Torch-free.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from rlserve.algorithm.builder_arguments import builder
from rlserve.algorithm.training_settings import settings_fields
from rlserve.errors import ConfigError
from rlserve.learners.registry import algorithm

if TYPE_CHECKING:
    from rlserve.server.policies import PolicySpec

_Config = TypeVar("_Config", bound="MultiAgentConfig")


class MultiAgentConfig:
    """The policies part of :class:`~rlserve.algorithm.config.AlgorithmConfig`."""

    # Set and documented in AlgorithmConfig.__init__.
    algo_name: str
    policies: dict[str, dict[str, Any]] | None
    policy_algorithms: dict[str, str]
    algorithm_settings: dict[str, dict[str, Any]]
    policy_specs: dict[str, Any]
    policy_mapping: list[tuple[str, str]]
    policy_mapping_fn: Any
    policies_to_train: frozenset[str] | None

    @builder
    def multi_agent(
        self: _Config,
        *,
        policies: Any = None,
        policy_mapping_fn: Any = None,
        policy_mapping: Any = None,
        algorithm_settings: dict[str, dict[str, Any]] | None = None,
        policies_to_train: Any = None,
    ) -> _Config:
        """Several policies: ``policies`` (ids, or id -> settings overrides) and who uses which.

        A policy's value may also give its spaces, as RLlib's ``(None, observation_space,
        action_space, overrides)`` tuple or an rlserve ``PolicySpec``; an Algorithm without an
        environment needs them. ``policy_mapping_fn(agent_id, episode, **kwargs) ->
        policy_id`` (RLlib's form) or ``policy_mapping={agent id or pattern: policy id}``
        (rlserve's, the server's rules; a ``PolicyMapping`` is taken as its rules). Without
        either, every agent maps to the only policy.

        Policies may mix algorithms: ``"algo": "dqn"`` in a policy's overrides dict (plain, or
        the tuple's fourth item), or ``PolicySpec(..., algo="dqn")``, has DQN train it, with
        DQN's defaults (hosted or the server's), then ``algorithm_settings["dqn"]``, then the
        policy's own overrides; a policy that names no algorithm is this config's
        (:attr:`algo_name`), with the settings of :meth:`training`. Each trains on its own
        schedule (PPO's batches, DQN's and SAC's rounds of ``train_every`` steps).

        Args:
            policies: Ids, or id -> overrides / tuple / ``PolicySpec``.
            policy_mapping_fn: RLlib's mapping function (environments' agents only).
            policy_mapping: rlserve's mapping rules.
            algorithm_settings: Per algorithm name, the settings every policy of that
                algorithm starts from (RLlib's names work too), as the top ``[dqn]`` table of
                a config file does for ``rlserve serve``.
            policies_to_train: RLlib's list of the policies that learn (None: all); the others
                act with their initial weights and are never trained (``frozen``).
        """
        if algorithm_settings is not None:
            if not isinstance(algorithm_settings, dict):
                raise ConfigError(
                    "algorithm_settings must map an algorithm name to its settings, e.g. "
                    '{"dqn": {"lr": 5e-4}}'
                )
            for name, values in algorithm_settings.items():
                entry = algorithm(name)
                if not isinstance(values, dict):
                    raise ConfigError(
                        f"algorithm_settings['{name}'] must be a dict of {name} settings, got "
                        f"{type(values).__name__}"
                    )
                where = f"algorithm_settings['{entry.name}']"
                self.algorithm_settings[entry.name] = settings_fields(entry.name, values, where)
        if policies is not None:
            self.policy_specs = {}
            self.policy_algorithms = {}
            if isinstance(policies, dict):
                self.policies = {}
                for key, value in policies.items():
                    declared = policy_entry(str(key), value, self.algo_name)
                    if declared.algo is not None:
                        self.policy_algorithms[str(key)] = declared.algo
                    if declared.spec is not None:
                        self.policy_specs[str(key)] = declared.spec
                    self.policies[str(key)] = declared.overrides
            elif isinstance(policies, str) or not isinstance(policies, Iterable):
                raise ConfigError(
                    f"multi_agent(policies={policies!r}): pass the policy ids as a list or set "
                    "(e.g. policies=['main']), or a dict of id -> settings overrides"
                )
            else:
                self.policies = {str(p): {} for p in policies}
            if not self.policies:
                raise ConfigError("multi_agent(policies=...) names no policy")
        if policy_mapping_fn is not None:
            if not callable(policy_mapping_fn):
                raise ConfigError("policy_mapping_fn must be callable")
            self.policy_mapping_fn = policy_mapping_fn
        if policy_mapping is not None:
            self.policy_mapping = _mapping_rules(policy_mapping)
        if policies_to_train is not None:
            if isinstance(policies_to_train, str) or not isinstance(policies_to_train, Iterable):
                raise ConfigError(
                    "multi_agent(policies_to_train=...): pass the ids of the policies that learn "
                    "as a list (a function of the batch is RLlib's other form, which rlserve "
                    "does not take)"
                )
            self.policies_to_train = frozenset(str(p) for p in policies_to_train)
        if self.policies_to_train is not None and self.policies is not None:
            unknown = sorted(self.policies_to_train - set(self.policies))
            if unknown:
                raise ConfigError(
                    f"multi_agent(policies_to_train=...) names {unknown}, which policies does "
                    f"not declare ({sorted(self.policies)})"
                )
        return self

    def check_policies_to_train(self, policy_ids: Iterable[str]) -> None:
        """Refuse a ``policies_to_train`` id that is not one of ``policy_ids`` (the built ones).

        Raises:
            ConfigError: It names a policy the Algorithm does not have.
        """
        known = sorted(policy_ids)
        unknown = sorted((self.policies_to_train or set()) - set(known))
        if unknown:
            raise ConfigError(
                f"multi_agent(policies_to_train=...) names {unknown}, which are not policies of "
                f"this Algorithm ({known})"
            )

    def trains(self, policy_id: str) -> bool:
        """Whether ``policy_id`` learns (``policies_to_train`` names it, or is unset)."""
        return self.policies_to_train is None or policy_id in self.policies_to_train

    def algorithm_of(self, policy_id: str) -> str:
        """The algorithm that trains ``policy_id`` (its own, else :attr:`algo_name`)."""
        return self.policy_algorithms.get(policy_id, self.algo_name)

    def used_algorithms(self) -> list[str]:
        """:attr:`algo_name` and every other algorithm a declared policy names, in order."""
        names = [self.algo_name]
        for name in self.policy_algorithms.values():
            if name not in names:
                names.append(name)
        return names


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


def _mapping_rules(policy_mapping: Any) -> list[tuple[str, str]]:
    """``policy_mapping`` as (agent id or pattern, policy id) rules.

    It may be a dict, a ``PolicyMapping`` or a list of (pattern, policy id) pairs.

    Raises:
        ConfigError: Anything else.
    """
    rules = getattr(policy_mapping, "rules", None)
    if rules is not None:
        pairs: Any = list(rules)
    elif isinstance(policy_mapping, dict):
        pairs = list(policy_mapping.items())
    elif isinstance(policy_mapping, (list, tuple)):
        pairs = list(policy_mapping)
    else:
        pairs = None
    if pairs is None or not all(isinstance(p, (tuple, list)) and len(p) == 2 for p in pairs):
        raise ConfigError(
            f"multi_agent(policy_mapping={policy_mapping!r}): pass {{agent id or pattern: policy "
            "id}, e.g. {'red_*': 'red'}, or a list of (pattern, policy id) pairs"
        )
    return [(str(k), str(v)) for k, v in pairs]
