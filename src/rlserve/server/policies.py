"""The policies a server hosts: how each is declared, and where each keeps its files.

A server hosts one or more policies, each with its own spaces, PPO settings (the top ``[ppo]``
table with the policy's own overrides), whether it trains (``frozen``) and where it starts
(``init_checkpoint``). A server with the one policy ``"default"`` keeps the run-folder layout of
a single-policy server (``checkpoints/``, ``weights/policy.npz``); with any other set of
policies each policy has its own folder::

    runs/<name>/policies/<id>/checkpoints/ckpt_<updates>.pt   (and ckpt_<updates>.json)
    runs/<name>/policies/<id>/weights.npz

The run folder saves the declarations (``config.toml``: ``[policies.<id>]`` and ``[mapping]``;
``spaces.json``: ``{"policies": {id: {observation_space, action_space}}}``), so ``--resume``
restores them. No torch here: the serving process reads it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym

from rlserve.errors import ConfigError
from rlserve.multiagent import PolicyMapping
from rlserve.protocol.messages import DEFAULT_POLICY_ID
from rlserve.spaces import describe, from_description

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
        ppo: Its overrides of the top ``[ppo]`` table (plain values; empty: none).
        frozen: Never trained: its initial weights are served as they are and its experience is
            skipped (counted).
        init_checkpoint: A checkpoint (of another run) whose model weights it starts from, when
            it has no checkpoint of its own yet; None: fresh weights.
    """

    policy_id: str
    observation_space: gym.Space[Any]
    action_space: gym.Space[Any]
    ppo: dict[str, Any] = field(default_factory=dict)
    frozen: bool = False
    init_checkpoint: str | None = None

    def ppo_table(self, base: dict[str, Any]) -> dict[str, Any]:
        """The policy's whole PPO table: ``base`` (the top ``[ppo]`` table) with its overrides."""
        return {**base, **self.ppo}

    def spaces(self) -> dict[str, Any]:
        """Its space descriptions, as ``spaces.json`` holds them."""
        return {
            "observation_space": describe(self.observation_space),
            "action_space": describe(self.action_space),
        }

    def to_table(self) -> dict[str, Any]:
        """Its ``[policies.<id>]`` table in the run folder's ``config.toml`` (spaces apart)."""
        table: dict[str, Any] = {"frozen": self.frozen}
        if self.init_checkpoint is not None:
            table["init_checkpoint"] = self.init_checkpoint
        if self.ppo:
            table["ppo"] = {k: list(v) if isinstance(v, tuple) else v for k, v in self.ppo.items()}
        return table

    @property
    def plain(self) -> bool:
        """Whether it is the policy of a server started without ``[policies]``."""
        return (
            self.policy_id == DEFAULT_POLICY_ID
            and not self.ppo
            and not self.frozen
            and self.init_checkpoint is None
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
    policies: dict[str, PolicySpec], mapping: PolicyMapping | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """What the run folder saves of the policies: extra ``config.toml`` tables and ``spaces.json``.

    A server started without ``[policies]`` saves exactly what it always did (the one pair of
    spaces, no extra table); otherwise ``[policies.<id>]`` tables and per-policy spaces.
    """
    tables: dict[str, Any] = {}
    if mapping is not None and mapping.rules:
        tables["mapping"] = dict(mapping.rules)
    specs = list(policies.values())
    if len(specs) == 1 and specs[0].plain:
        return tables, specs[0].spaces()
    tables["policies"] = {pid: spec.to_table() for pid, spec in policies.items()}
    return tables, {SPACES_KEY: {pid: spec.spaces() for pid, spec in policies.items()}}


def policies_from_run(
    tables: dict[str, Any], spaces: dict[str, Any]
) -> tuple[dict[str, PolicySpec], PolicyMapping | None]:
    """Rebuild the policies and the mapping that :func:`run_folder_form` saved.

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
        for pid, described in spaces[SPACES_KEY].items():
            table = declared[pid]
            policies[pid] = PolicySpec(
                pid,
                from_description(described["observation_space"]),
                from_description(described["action_space"]),
                ppo=dict(table.get("ppo") or {}),
                frozen=bool(table.get("frozen", False)),
                init_checkpoint=table.get("init_checkpoint"),
            )
    rules = tables.get("mapping")
    mapping = None if rules is None else PolicyMapping.from_table(rules, policies)
    return policies, mapping
