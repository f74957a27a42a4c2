"""The policies a server hosts: how each is declared, and where each keeps its files.

A server hosts one or more policies, each with its own spaces, algorithm (``algo``: the run's,
``--algo``, unless the policy names its own), settings (the top table of its algorithm, ``[ppo]``
or ``[dqn]``..., with the policy's own overrides), whether it trains (``frozen``) and where it
starts (``init_checkpoint``). A server with the one policy ``"default"`` keeps the run-folder
layout of a single-policy server (``checkpoints/``, ``weights/policy.npz``); with any other set
of policies each policy has its own folder::

    runs/<name>/policies/<id>/checkpoints/ckpt_<updates>.pt   (and ckpt_<updates>.json)
    runs/<name>/policies/<id>/weights.npz

The run folder saves the declarations (``config.toml``: ``[policies.<id>]`` with each policy's
algorithm, its overrides in ``[policies.<id>.<algo>]``, and ``[mapping]``; ``spaces.json``:
``{"policies": {id: {observation_space, action_space}}}``), so ``--resume`` restores them. No
torch here: the serving process reads it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym

from rlserve.errors import ConfigError
from rlserve.learners.registry import algorithm, run_algorithm
from rlserve.protocol.episode_requests import DEFAULT_POLICY_ID
from rlserve.protocol.mapping import PolicyMapping
from rlserve.protocol.spaces import describe, from_description

POLICY_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
"""What a declared policy id may be: it names a folder of the run folder."""

SPACES_KEY = "policies"
"""The key of ``spaces.json`` under which a run with declared policies keeps their spaces."""


def check_policy_id(policy_id: str) -> str:
    """Return ``policy_id`` if a policy may be called so.

    Raises:
        ConfigError: It is not 1 to 64 letters, digits, ``_``, ``.`` or ``-`` (starting with a
            letter or digit).
    """
    if not POLICY_ID_PATTERN.fullmatch(policy_id):
        raise ConfigError(
            f"policy id '{policy_id}' is not allowed: use 1 to 64 letters, digits, '_', '.' or "
            "'-', starting with a letter or digit (it names a folder of the run folder)"
        )
    return policy_id


@dataclass(slots=True)
class PolicySpec:
    """One policy a server hosts.

    Attributes:
        policy_id: Its id (clients name it in ``start_episode``; the mapping names it).
        observation_space: Its observation space.
        action_space: Its action space.
        config: Its overrides of its algorithm's settings, the top table of that algorithm
            (``[ppo]``, ``[dqn]``...; plain values; empty: none).
        frozen: Never trained: its initial weights are served as they are and its experience is
            skipped (counted).
        init_checkpoint: A checkpoint (of another run) whose model weights it starts from, when
            it has no checkpoint of its own yet; None: fresh weights.
        algo: Its algorithm's name (``ppo``, ``dqn``, ``sac``); None: the run's (``--algo``, or
            the config class's).
    """

    policy_id: str
    observation_space: gym.Space[Any]
    action_space: gym.Space[Any]
    config: dict[str, Any] = field(default_factory=dict)
    frozen: bool = False
    init_checkpoint: str | None = None
    algo: str | None = None

    def __post_init__(self) -> None:
        if self.algo is not None:
            self.algo = algorithm(self.algo).name  # an unknown name is refused with the list

    @property
    def ppo(self) -> dict[str, Any]:
        """The old name of :attr:`config` (from when every policy was PPO's)."""
        return self.config

    def algorithm_of(self, default: str | None) -> str:
        """Its algorithm's name: :attr:`algo`, else ``default`` (the run's; None: PPO)."""
        return self.algo or algorithm(default).name

    def settings_table(self, base: dict[str, Any]) -> dict[str, Any]:
        """Its whole settings table: ``base`` (its algorithm's top table) with its overrides."""
        return {**base, **self.config}

    def ppo_table(self, base: dict[str, Any]) -> dict[str, Any]:
        """The old name of :meth:`settings_table`."""
        return self.settings_table(base)

    def spaces(self) -> dict[str, Any]:
        """Its space descriptions, as ``spaces.json`` holds them."""
        return {
            "observation_space": describe(self.observation_space),
            "action_space": describe(self.action_space),
        }

    def to_table(self, default_algo: str | None = None) -> dict[str, Any]:
        """Its ``[policies.<id>]`` table in the run folder's ``config.toml`` (spaces apart).

        It names the policy's algorithm (``default_algo``, the run's, when it names none), so
        a resume rebuilds the same learner; its overrides are the sub-table named after it.
        """
        name = self.algorithm_of(default_algo)
        table: dict[str, Any] = {"frozen": self.frozen, "algo": name}
        if self.init_checkpoint is not None:
            table["init_checkpoint"] = self.init_checkpoint
        if self.config:
            table[name] = {
                k: list(v) if isinstance(v, tuple) else v for k, v in self.config.items()
            }
        return table

    @property
    def plain(self) -> bool:
        """Whether it is the policy of a server started without ``[policies]``."""
        return (
            self.policy_id == DEFAULT_POLICY_ID
            and not self.config
            and not self.frozen
            and self.init_checkpoint is None
            and self.algo is None
        )


def single_policy(
    observation_space: gym.Space[Any], action_space: gym.Space[Any]
) -> dict[str, PolicySpec]:
    """The policies of a single-policy server: ``"default"`` with these spaces."""
    return {DEFAULT_POLICY_ID: PolicySpec(DEFAULT_POLICY_ID, observation_space, action_space)}


def is_flat(policy_ids: Any) -> bool:
    """Whether a server with these policies keeps the single-policy layout, metrics and files.

    True for exactly one policy called ``"default"``.
    """
    return list(policy_ids) == [DEFAULT_POLICY_ID]


@dataclass(frozen=True, slots=True)
class PolicyPaths:
    """Where one policy keeps its files in a run folder."""

    checkpoints: Path
    """The folder of its checkpoints (``ckpt_<updates>.pt`` with a ``.json`` side file)."""
    weights: Path
    """Its newest published actor (npz, written by the serving process)."""


def policy_paths(run_dir: Path, policy_id: str, flat: bool) -> PolicyPaths:
    """The files of ``policy_id`` in the run folder ``run_dir`` (see :func:`is_flat`)."""
    if flat:
        return PolicyPaths(run_dir / "checkpoints", run_dir / "weights" / "policy.npz")
    folder = run_dir / "policies" / policy_id
    return PolicyPaths(folder / "checkpoints", folder / "weights.npz")


def run_folder_form(
    policies: dict[str, PolicySpec], mapping: PolicyMapping | None, algo: str | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """What the run folder saves of the policies: extra ``config.toml`` tables and ``spaces.json``.

    A server started without ``[policies]`` saves exactly what it always did (the one pair of
    spaces, no extra table); otherwise ``[policies.<id>]`` tables (each naming its algorithm;
    ``algo``, the run's, for a policy that names none) and per-policy spaces.
    """
    tables: dict[str, Any] = {}
    if mapping is not None and mapping.rules:
        tables["mapping"] = dict(mapping.rules)
    specs = list(policies.values())
    if len(specs) == 1 and specs[0].plain:
        return tables, specs[0].spaces()
    tables["policies"] = {pid: spec.to_table(algo) for pid, spec in policies.items()}
    return tables, {SPACES_KEY: {pid: spec.spaces() for pid, spec in policies.items()}}


def policies_from_run(
    tables: dict[str, Any], spaces: dict[str, Any]
) -> tuple[dict[str, PolicySpec], PolicyMapping | None]:
    """Rebuild the policies and the mapping that :func:`run_folder_form` saved.

    Each policy's algorithm is its table's ``algo``, else the run's (``[algorithm] name``, PPO
    without one: run folders from before policies named theirs); its overrides are the
    sub-table named after that algorithm.

    Raises:
        ConfigError: The saved files do not describe the same policies.
    """
    if SPACES_KEY not in spaces:
        policies = single_policy(
            from_description(spaces["observation_space"]),
            from_description(spaces["action_space"]),
        )
    else:
        declared = tables.get("policies") or {}
        if set(declared) != set(spaces[SPACES_KEY]):
            raise ConfigError(
                "the run folder's config.toml and spaces.json name different policies "
                f"({sorted(declared)} and {sorted(spaces[SPACES_KEY])})"
            )
        policies = {}
        default = run_algorithm(tables).name
        for pid, described in spaces[SPACES_KEY].items():
            table = declared[pid]
            name = algorithm(table.get("algo") or default).name
            policies[pid] = PolicySpec(
                pid,
                from_description(described["observation_space"]),
                from_description(described["action_space"]),
                config=dict(table.get(name) or {}),
                frozen=bool(table.get("frozen", False)),
                init_checkpoint=table.get("init_checkpoint"),
                algo=name,
            )
    rules = tables.get("mapping")
    mapping = None if rules is None else PolicyMapping.from_table(rules, policies)
    return policies, mapping


def check_same_algorithms(
    saved: dict[str, Any], policies: dict[str, PolicySpec], algo: str | None
) -> None:
    """Refuse to resume a run whose policies would be trained by other algorithms than before.

    A checkpoint of one algorithm cannot be loaded into another's learner.

    Args:
        saved: The run folder's ``config.toml`` tables.
        policies: The policies of the resumed run.
        algo: The resumed run's algorithm (for the policies that name none).

    Raises:
        ConfigError: A policy's algorithm changed; the message names it and the fix.
    """
    default = run_algorithm(saved).name
    declared = saved.get("policies") or {}
    for pid, spec in policies.items():
        table = declared.get(pid) if isinstance(declared, dict) else None
        before = algorithm((table or {}).get("algo") or default).name
        now = spec.algorithm_of(algo)
        if now != before:
            raise ConfigError(
                f"policy '{pid}' of this run is trained by {before}, and its checkpoints hold "
                f"{before}'s model, which {now} cannot continue; declare it with algo = "
                f"'{before}' (as the run folder's config.toml does), or start a new run"
            )
