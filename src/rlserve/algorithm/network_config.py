"""The settings of an Algorithm without environments, read and written both ways.

A network-only Algorithm (``rlserve serve``) is configured by an :class:`AlgorithmConfig`
with spaces and ``serving(...)``; the server underneath takes a
:class:`~rlserve.server.config.ServerConfig`. This module turns one into the other
(:func:`server_config_of`, :func:`serving_config`), finds the policies of such a config
(:func:`network_policies`), and reads a run folder's config back (:func:`run_folder_config`)
so that :meth:`Algorithm.from_checkpoint` can resume a served run. A ``policy_mapping_fn`` is
kept in the run folder (and given to ``rlserve serve --config``) by its importable name, as the
table ``[mapping_function]`` with ``name = "module:function"`` (:func:`mapping_function_table`,
:func:`mapping_function_of`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlserve.algorithm.config import AlgorithmConfig, config_for
from rlserve.algorithm.network_ray import load_ray_placement
from rlserve.algorithm.saved_config import UNSAVED, env_reference, resolve_saved
from rlserve.algorithm.serving_settings import RAY_SETTINGS, ServingSettings
from rlserve.config.fields import build
from rlserve.errors import ConfigError
from rlserve.learners.registry import algorithm, algorithm_of_settings, run_algorithm
from rlserve.protocol.episode_requests import DEFAULT_POLICY_ID
from rlserve.protocol.mapping import PolicyMapping
from rlserve.run.run_folder import RunFolder
from rlserve.server.config import ServerConfig, with_token_from_env
from rlserve.server.policies import PolicySpec, check_policy_id, policies_from_run, single_policy

SERVER_DEFAULTS = ServerConfig()
"""The server's defaults (``checkpoint_every`` and the like when the config leaves them out)."""

REPORTING_FIELDS = ("run_dir", "name", "checkpoint_every", "keep_checkpoints", "progress")
"""ServerConfig fields that come from :meth:`AlgorithmConfig.reporting`."""


def network_policies(config: AlgorithmConfig) -> tuple[dict[str, PolicySpec], PolicyMapping | None]:
    """The policies (with their spaces) and the mapping rules of a config without an environment.

    A ``policy_mapping_fn`` is not part of them: the server asks it about the agents no rule
    maps (:mod:`~rlserve.server.mapping_function`).

    Raises:
        ConfigError: A policy has no spaces.
    """
    declared = config.policies or {}
    if config.policy_specs:
        missing = [pid for pid in declared if pid not in config.policy_specs]
        if missing:
            raise ConfigError(
                f"policies {missing} have no spaces; declare each as (None, observation_space, "
                "action_space, overrides) in multi_agent(policies=...)"
            )
        specs = {
            pid: dataclasses.replace(
                spec,
                policy_id=check_policy_id(pid),
                config=dict(declared[pid]),
                frozen=spec.frozen or not config.trains(pid),
                algo=config.policy_algorithms.get(pid),
            )
            for pid, spec in config.policy_specs.items()
        }
    elif config.observation_space is not None and config.action_space is not None:
        if len(declared) > 1:
            raise ConfigError(
                "several policies need each its spaces: multi_agent(policies={id: (None, "
                "observation_space, action_space, overrides)})"
            )
        pid = check_policy_id(next(iter(declared), DEFAULT_POLICY_ID))
        specs = single_policy(config.observation_space, config.action_space)
        specs = {
            pid: dataclasses.replace(
                specs[DEFAULT_POLICY_ID],
                policy_id=pid,
                config=dict(declared.get(pid, {})),
                frozen=not config.trains(pid),
                algo=config.policy_algorithms.get(pid),
            )
        }
    else:
        raise ConfigError(
            "an Algorithm without an environment needs the policy's spaces: "
            ".environment(observation_space=..., action_space=...) (or multi_agent(policies="
            "{id: (None, observation_space, action_space, overrides)}))"
        )
    config.check_policies_to_train(specs)
    mapping = PolicyMapping(config.policy_mapping, specs) if config.policy_mapping else None
    return specs, mapping


def mapping_function_table(fn: Callable[..., Any]) -> dict[str, str]:
    """The ``[mapping_function]`` table that names ``fn`` (a lambda or local one: unsaved)."""
    return {"name": env_reference(fn) or UNSAVED}


def mapping_function_of(
    tables: dict[str, Any], where: str, trust_code: bool
) -> Callable[..., Any] | None:
    """The function a ``[mapping_function]`` table names (None without one).

    ``trust_code``: the caller vouches for the file (the operator's own ``--config``, or a run
    folder resumed with ``--trust-code``); a run folder may come from anyone, and the function
    is called with agent ids from the wire (:func:`~rlserve.algorithm.saved_config.resolve_saved`).

    Raises:
        ConfigError: The name is not ``module:function``, cannot be imported, is not callable,
            was a lambda that could not be saved, or the file is not trusted (the message says
            what to pass instead).
    """
    table = tables.get("mapping_function")
    if table is None:
        return None
    name = table.get("name") if isinstance(table, dict) else None
    if name == UNSAVED:
        raise ConfigError(
            f"the policy_mapping_fn of {where} cannot be found again (it was a lambda or a "
            "local function): pass config=... with it to Algorithm.from_checkpoint, or make it "
            "a module-level function"
        )
    if not isinstance(name, str) or ":" not in name:
        raise ConfigError(
            f'{where}: [mapping_function] needs name = "module:function" (a policy_mapping_fn '
            f"the server can import, e.g. with PYTHONPATH=.), got {name!r}"
        )
    try:
        fn = resolve_saved(name, "policy_mapping_fn", where, trust_code)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(
            f"{where}: the policy_mapping_fn {name} cannot be imported ({exc}); run the "
            "server where that module can be imported (PYTHONPATH)"
        ) from None
    if not callable(fn):
        raise ConfigError(f"{where}: the policy_mapping_fn {name} is not callable")
    return fn


def server_config_of(config: AlgorithmConfig) -> ServerConfig:
    """The :class:`ServerConfig` of a network-only Algorithm (serving + reporting settings)."""
    settings = ServingSettings(**(config.serving_settings or {}))
    taken = settings.server_config(config.rollout_fragment_length, config.seed)
    every = config.checkpoint_every
    return dataclasses.replace(
        taken,
        run_dir=config.run_dir or SERVER_DEFAULTS.run_dir,
        name=config.run_name,
        checkpoint_every=SERVER_DEFAULTS.checkpoint_every if every is None else every,
        keep_checkpoints=config.keep_checkpoints,
        progress=config.progress,
    )


def serving_config(
    server: ServerConfig,
    ppo: Any,
    policies: dict[str, PolicySpec],
    mapping: PolicyMapping | None,
    others: dict[str, Any] | None = None,
    mapping_fn: Callable[..., Any] | None = None,
) -> AlgorithmConfig:
    """The AlgorithmConfig of a server configuration (``rlserve serve``'s flags and file).

    ``ppo`` is the algorithm's settings (``PPOSettings``, ``DQNSettings``...): its type picks
    the algorithm, that of the policies that name none. ``others`` holds the settings of the
    other algorithms the policies name (their top tables), by name. ``mapping_fn`` is a
    ``policy_mapping_fn`` for the agents no rule of ``mapping`` maps.
    """
    own = {f.name for f in dataclasses.fields(ServingSettings)} - {
        "server",
        "max_queued_steps_per_source",
        *RAY_SETTINGS,
    }
    skip = own | set(REPORTING_FIELDS) | {"fragment_length", "seed", "spaces_from", "spaces_file"}
    further = {
        f.name: getattr(server, f.name)
        for f in dataclasses.fields(ServerConfig)
        if f.name not in skip and getattr(server, f.name) != getattr(SERVER_DEFAULTS, f.name)
    }
    config = (
        config_for(algorithm_of_settings(ppo).name)
        .multi_agent(
            policies=dict(policies),
            algorithm_settings={
                name: dataclasses.asdict(settings) for name, settings in (others or {}).items()
            },
        )
        .training(**dataclasses.asdict(ppo))
        .env_runners(rollout_fragment_length=server.fragment_length)
        .debugging(seed=server.seed)
        .serving(**{name: getattr(server, name) for name in own}, server=further)
        .reporting(
            run_dir=server.run_dir,
            name=server.name,
            progress=server.progress,
            checkpoint_every=server.checkpoint_every,
            keep_checkpoints=server.keep_checkpoints,
        )
    )
    if mapping is not None:
        config.multi_agent(policy_mapping=mapping)
    if mapping_fn is not None:
        config.multi_agent(policy_mapping_fn=mapping_fn)
    return config


def run_folder_config(folder: Path, trust_code: bool = False) -> AlgorithmConfig:
    """The AlgorithmConfig a ``rlserve serve`` run folder was started with (token: from env).

    ``trust_code`` lets its ``[mapping_function]`` be imported (:func:`mapping_function_of`).

    A run served on Ray through ``serving(ray_address=...)`` is placed there again (its
    ``ray_placement.json``).
    """
    run = RunFolder.existing(folder)
    tables, spaces = run.load()
    server = build(ServerConfig, with_token_from_env(tables.get("server")), None)
    if run.token_required and not server.token:
        raise ConfigError(
            run.token_refusal("set RLSERVE_TOKEN, or pass a config with .serving(token=...)")
        )
    policies, mapping = policies_from_run(tables, spaces)
    entry = run_algorithm(tables)
    settings = build(entry.settings, tables.get(entry.name), None)
    others = {
        name: build(algorithm(name).settings, tables.get(name), None)
        for name in {spec.algorithm_of(entry.name) for spec in policies.values()} - {entry.name}
    }
    mapping_fn = mapping_function_of(tables, str(run.path), trust_code)
    config = serving_config(server, settings, policies, mapping, others, mapping_fn)
    return load_ray_placement(config, run.path)
