"""Reading the ``[policies.<id>]`` and ``[mapping]`` tables of a ``--config`` file.

::

    [policies.red]
    spaces_from = "CartPole-v1"          # or spaces_file = "red.json", or inline
                                         # observation_space = {...} and action_space = {...}
    [policies.red.ppo]                   # overrides of the top [ppo] table
    lr = 0.0005

    [policies.green]
    spaces_from = "CartPole-v1"
    algo = "dqn"                         # its own algorithm (default: the run's, --algo)
    [policies.green.dqn]                 # overrides of the top [dqn] table
    learning_starts = 500

    [policies.blue]
    spaces_file = "blue_spaces.json"
    frozen = true                        # never trained: serves its weights as they are
    init_checkpoint = "runs/old/checkpoints/ckpt_0000100.pt"

    [mapping]                            # agent id or shell pattern -> policy id
    "red_*" = "red"
    "blue_*" = "blue"

A policy's settings are its algorithm's defaults, then the top table of that algorithm
(``[dqn]``), then the policy's sub-table named after its algorithm; a sub-table of another
algorithm is refused. Every mistake is one :class:`~rlserve.errors.ConfigError` naming the file,
the line where it can tell, the key, and the fix, as for the other tables. Paths are relative to
the working folder, as everywhere in the file; ``init_checkpoint`` is saved absolute in the run
folder.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Any

from rlserve.config.fields import build, check_table, line_of_key
from rlserve.config.spaces_file import load_spaces_file
from rlserve.env.spaces_from import spaces_of_env
from rlserve.errors import ConfigError, RLServeError
from rlserve.learners.registry import ALGORITHMS, algorithm
from rlserve.policy.encoder_choice import settings_encoder
from rlserve.policy.frame_stacking import stacked_space
from rlserve.protocol.mapping import PolicyMapping
from rlserve.protocol.spaces import from_description
from rlserve.server.policies import PolicySpec, check_policy_id

POLICY_KEYS: dict[str, str] = {
    "spaces_from": "env whose spaces the policy uses: a Gymnasium id, module:Name or file.py:Name",
    "spaces_file": "JSON file with observation_space and action_space descriptions",
    "observation_space": "inline observation space description (with action_space)",
    "action_space": "inline action space description (with observation_space)",
    "frozen": "true: never trained, its weights are served as they are (default false)",
    "init_checkpoint": "checkpoint (e.g. of another run) whose weights the policy starts from",
    "algo": "the policy's algorithm: "
    + ", ".join(ALGORITHMS)
    + " (default: the run's, --algo or [algorithm] name)",
    **{
        name: f"sub-table [policies.<id>.{name}] overriding keys of the top [{name}] table, "
        f"for a policy trained by {name}"
        for name in ALGORITHMS
    },
}
"""The keys of a ``[policies.<id>]`` table, with what each means."""


class _Where:
    """Names a place in the file: ``file, line N: [table]``."""

    def __init__(self, path: str, text: str):
        self.path = path
        self.text = text

    def error(self, table: str, key: str, message: str) -> ConfigError:
        line = line_of_key(self.text, table, key)
        if line is None and key:
            line = line_of_key(self.text, table, "")
        where = f"{self.path}, line {line}" if line else self.path
        error = ConfigError(f"{where}: [{table}] {message}")
        error.key = key or None
        return error


def read_policies(path: str, table: Any, algo: str | None = None) -> dict[str, PolicySpec]:
    """The policies a ``[policies]`` table of the file ``path`` declares, in file order.

    Args:
        path: The file (named in errors).
        table: Its ``[policies]`` table.
        algo: The run's algorithm (``--algo``, ``[algorithm] name``; None: PPO), that of the
            policies that name none.

    Raises:
        ConfigError: A policy id, key, value, space or checkpoint is wrong (file, line, key).
    """
    where = _Where(path, Path(path).read_text(encoding="utf-8"))
    if not isinstance(table, dict) or not table:
        raise where.error(
            "policies", "", "must hold one table per policy: [policies.<id>] with its spaces"
        )
    policies: dict[str, PolicySpec] = {}
    for policy_id, entry in table.items():
        name = f"policies.{policy_id}"
        try:
            check_policy_id(policy_id)
        except ConfigError as exc:
            raise where.error(name, "", str(exc)) from None
        if not isinstance(entry, dict):
            raise where.error(
                "policies", policy_id, f"'{policy_id}' must be a table ([{name}] with keys)"
            )
        policies[policy_id] = _read_policy(where, name, policy_id, entry, algo)
    return policies


def _read_policy(
    where: _Where, name: str, policy_id: str, entry: dict[str, Any], run_algo: str | None
) -> PolicySpec:
    for key in entry:
        if key not in POLICY_KEYS:
            close = difflib.get_close_matches(key, list(POLICY_KEYS), n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            raise where.error(
                name, key, f"unknown key '{key}'; {hint}a policy takes {', '.join(POLICY_KEYS)}"
            )
    for key in ("spaces_from", "spaces_file", "init_checkpoint", "algo"):
        if key in entry and not isinstance(entry[key], str):
            raise where.error(name, key, f"'{key}' must be a string, got {entry[key]!r}")
    for key in ("observation_space", "action_space", *ALGORITHMS):
        if key in entry and not isinstance(entry[key], dict):
            raise where.error(name, key, f"'{key}' must be a table, got {entry[key]!r}")
    frozen = entry.get("frozen", False)
    if not isinstance(frozen, bool):
        raise where.error(name, "frozen", f"'frozen' must be true or false, got {frozen!r}")
    try:
        own = None if "algo" not in entry else algorithm(entry["algo"]).name
        policy_algo = own or algorithm(run_algo).name
    except ConfigError as exc:
        raise where.error(name, "algo", str(exc)) from None
    for other in ALGORITHMS:
        if other in entry and other != policy_algo:
            trained_by = f"algo = '{own}'" if own else f"the run's algorithm, {policy_algo}"
            raise where.error(
                f"{name}.{other}",
                "",
                f"sets {other} settings, but the policy '{policy_id}' is trained by "
                f"{policy_algo} ({trained_by}); rename the table [{name}.{policy_algo}], or "
                f"set algo = '{other}' in [{name}]",
            )
    observation_space, action_space = _spaces(where, name, entry)
    overrides = dict(entry.get(policy_algo, {}))
    try:
        check_table(algorithm(policy_algo).settings, overrides)
    except ConfigError as exc:
        raise where.error(f"{name}.{policy_algo}", exc.key or "", str(exc)) from None
    init = entry.get("init_checkpoint")
    if init is not None:
        if not os.path.isfile(init) or not os.access(init, os.R_OK):
            raise where.error(
                name,
                "init_checkpoint",
                f"init_checkpoint {init}: no such readable file; name a ckpt_*.pt file of a run "
                "folder (its checkpoints/ folder)",
            )
        init = os.path.abspath(init)
    return PolicySpec(
        policy_id,
        observation_space,
        action_space,
        config={k: tuple(v) if isinstance(v, list) else v for k, v in overrides.items()},
        frozen=frozen,
        init_checkpoint=init,
        algo=own,
    )


def _spaces(where: _Where, name: str, entry: dict[str, Any]) -> tuple[Any, Any]:
    """The policy's spaces from exactly one of its three ways of giving them."""
    inline = [k for k in ("observation_space", "action_space") if k in entry]
    given: list[str] = [k for k in ("spaces_from", "spaces_file") if k in entry]
    given += ["inline"] if inline else []
    if len(given) != 1 or (inline and len(inline) != 2):
        found = ", ".join(k for k in (*entry,) if k in ("spaces_from", "spaces_file", *inline))
        raise where.error(
            name,
            inline[0] if len(inline) == 1 else "",
            f"give the policy's spaces one way: spaces_from = ENV, spaces_file = FILE.json, "
            f"or both observation_space and action_space (found: {found or 'none'})",
        )
    try:
        if "spaces_from" in entry:
            return spaces_of_env(
                entry["spaces_from"], label="spaces_from", instead='spaces_file = "FILE.json"'
            )
        if "spaces_file" in entry:
            return load_spaces_file(entry["spaces_file"])
    except RLServeError as exc:
        raise where.error(name, given[0], str(exc)) from None
    described: list[Any] = []
    for key in ("observation_space", "action_space"):
        try:
            described.append(from_description(entry[key]))
        except RLServeError as exc:
            raise where.error(
                name, key, f"{key}: {exc} (space descriptions: docs/protocol.md, section 6.2)"
            ) from None
    return described[0], described[1]


def read_mapping(path: str | None, table: Any, policies: dict[str, PolicySpec]) -> PolicyMapping:
    """The ``[mapping]`` table (``"agent id or pattern" = "policy id"``) as a mapping.

    Raises:
        ConfigError: A rule names a policy that is not declared, or is not a string.
    """
    text = Path(path).read_text(encoding="utf-8") if path else ""
    where = _Where(path or "--config", text)
    if not isinstance(table, dict):
        raise where.error("mapping", "", 'must be a table of "agent id or pattern" = "policy"')
    for rule, policy_id in table.items():
        if not isinstance(policy_id, str):
            raise where.error(
                "mapping",
                rule,
                f"rule '{rule}' must name a policy id (a string), not {policy_id!r}",
            )
        if policy_id not in policies:
            close = difflib.get_close_matches(policy_id, list(policies), n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            raise where.error(
                "mapping",
                rule,
                f"rule '{rule}' names the policy '{policy_id}', which is not declared; {hint}"
                f"the policies are {', '.join(policies)}",
            )
    try:
        return PolicyMapping.from_table(table, policies)
    except ConfigError as exc:
        raise where.error("mapping", "", str(exc)) from None


def check_policies(
    policies: dict[str, PolicySpec],
    ppo: dict[str, Any],
    algo: str | None = None,
    tables: dict[str, dict[str, Any]] | None = None,
) -> None:
    """Refuse, before anything listens, a policy its algorithm cannot train or a wrong table.

    Each policy is checked with its own algorithm (its ``algo``, else the run's) and settings
    (that algorithm's top table with the policy's overrides).

    Args:
        policies: The declared policies.
        ppo: The top settings table of the run's algorithm (``[ppo]``, ``[dqn]``; flags
            applied).
        algo: The run's algorithm (None: PPO).
        tables: The top settings tables of the other algorithms, by name (missing: their
            defaults).

    Raises:
        ConfigError, UnsupportedSpaceError: The message names the policy (when there are
            several, or it is not ``default``) and, for spaces, the algorithms that fit.
    """
    run_algo = algorithm(algo).name
    for spec in policies.values():
        label = "" if spec.plain else f"policy '{spec.policy_id}': "
        try:
            entry = algorithm(spec.algorithm_of(run_algo))
            base = ppo if entry.name == run_algo else (tables or {}).get(entry.name, {})
            settings = build(entry.settings, spec.settings_table(base), None)
            space = spec.observation_space
            if settings.frame_stack > 1:  # the policy reads the stack of frame_stack frames
                space = stacked_space(space, settings.frame_stack)
            entry.check(space, spec.action_space)
            settings_encoder(settings, space)  # an image encoder that fits
        except RLServeError as exc:
            if not label:
                raise
            raise type(exc)(f"{label}{exc}") from None
