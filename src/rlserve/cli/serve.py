"""``rlserve serve``: a policy server for external clients, on a new run or a resumed one.

Reads the settings (``--config`` or the resumed run folder, then the flags), the policies and
the run's algorithm, refuses what would fail later (ports in use, a bad certificate, options a
resumed run ignores) before anything is created, then runs a ``NetworkAlgorithm`` on this
thread until SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import errno
import gc
import logging
import os
import shutil
import socket
from pathlib import Path
from typing import Any

from rlserve.cli.logs import log_to_run_folder
from rlserve.cli.serve_ray import ray_serving
from rlserve.config.fields import build, load_config_file, to_table
from rlserve.errors import ConfigError

logger = logging.getLogger("rlserve.cli")


def _spaces(config: Any) -> tuple[Any, Any]:
    from rlserve.errors import ConfigError

    if config.spaces_from:
        from rlserve.env.spaces_from import spaces_of_env

        return spaces_of_env(config.spaces_from)
    if config.spaces_file:
        from rlserve.config.spaces_file import load_spaces_file

        return load_spaces_file(config.spaces_file)
    raise ConfigError(
        "the server needs the policy's spaces: pass --spaces-from ENV (e.g. CartPole-v1, or "
        "examples/corridor.py:SimpleCorridor) or "
        "--spaces-file FILE.json with observation_space and action_space descriptions, or "
        "declare [policies.<id>] tables in --config"
    )


def _declared_policies(
    args: argparse.Namespace, tables: dict[str, Any], server: Any, algo: str
) -> Any:
    """The policies and mapping of a new run: ``[policies]`` of --config, or the one policy.

    ``algo`` is the run's algorithm, that of the declared policies that name none.
    """
    from rlserve.server.policies import single_policy
    from rlserve.server.policies_config import read_mapping, read_policies

    if "policies" in tables:
        if server.spaces_from or server.spaces_file:
            raise ConfigError(
                f"{args.config}: [policies] gives each policy its spaces; drop spaces_from and "
                "spaces_file ([server] table and --spaces-from / --spaces-file)"
            )
        policies = read_policies(args.config, tables["policies"], algo)
    else:
        policies = single_policy(*_spaces(server))
    mapping = None
    if "mapping" in tables:
        mapping = read_mapping(args.config, tables["mapping"], policies)
    return policies, mapping


def _run_algorithm(args: argparse.Namespace, tables: dict[str, Any], resumed: bool) -> str:
    """The run's algorithm: ``--algo``, else ``[algorithm] name`` (of --config or the run).

    PPO when neither names one; a resumed run keeps its own.
    """
    from rlserve.learners.registry import algorithm, run_algorithm

    try:
        run_algo = run_algorithm(tables).name
    except ConfigError as exc:
        source = args.resume or args.config_from_run or args.config
        raise ConfigError(f"{source}: {exc}") from None
    if resumed and args.algo and args.algo != run_algo:
        raise ConfigError(
            f"--algo {args.algo}: the run was started with {run_algo}; a run keeps its "
            "algorithm (drop --algo, or start a new run)"
        )
    return algorithm(args.algo or run_algo).name


def _settings_of(
    names: list[str], args: argparse.Namespace, tables: dict[str, Any], source: str | None = None
) -> Any:
    """Each named algorithm's settings: its table of --config (or the run), then its flags.

    ``source`` is the file the tables were read from (named in errors).

    ``--checkpoint-replay`` sets ``checkpoint_replay`` of each of them that keeps a replay
    buffer (off-policy algorithms).

    Raises:
        ConfigError: ``--checkpoint-replay`` and none of them keeps a replay buffer.
    """
    from rlserve.learners.registry import algorithm

    settings = {}
    for name in names:
        entry = algorithm(name)
        settings[name] = build(
            entry.settings,
            tables.get(name),
            args,
            prefix=f"{name}_",
            source=(source, name) if source else None,
        )
    if args.checkpoint_replay is not None:
        replaying = [s for s in settings.values() if hasattr(s, "checkpoint_replay")]
        if not replaying:
            raise ConfigError(
                f"--checkpoint-replay: {', '.join(names)} keeps no replay buffer; it applies to "
                "off-policy algorithms (--algo dqn or sac, or a policy with algo = 'dqn' or 'sac')"
            )
        for one in replaying:
            one.checkpoint_replay = bool(args.checkpoint_replay)
    return settings


def _algorithm_settings(
    args: argparse.Namespace, tables: dict[str, Any], resumed: bool = False
) -> Any:
    """The run's algorithm's settings: its table of --config (or the run), then its flags.

    The algorithm is ``--algo``, else the ``[algorithm] name`` of --config or the resumed run,
    else PPO. ``--checkpoint-replay`` sets an off-policy algorithm's ``checkpoint_replay``.
    """
    name = _run_algorithm(args, tables, resumed)
    return _settings_of([name], args, tables)[name]


def serve_command(args: argparse.Namespace) -> int:
    """Run ``rlserve serve`` with its parsed arguments; 0 once stopped."""
    from rlserve.algorithm.network import NetworkAlgorithm
    from rlserve.algorithm.network_config import mapping_function_of, serving_config
    from rlserve.cli.serve_args import refuse_unused_algorithm_flags
    from rlserve.learners.registry import ALGORITHMS
    from rlserve.learners.setting_checks import check_device_present
    from rlserve.run.run_folder import IN_USE_RESUME, RunFolder
    from rlserve.server.config import ServerConfig, with_token_from_env
    from rlserve.server.policies import policies_from_run
    from rlserve.server.policies_config import check_policies

    if args.resume or args.config_from_run:
        if args.resume:
            _refuse_ignored_on_resume(args)
        run = RunFolder.existing(args.resume or args.config_from_run)
        if args.resume:
            run.hold(IN_USE_RESUME).release()  # a live server's folder: say so before its ports do
        tables, spaces = run.load()
        source = str(run.config_file)
        server_config = build(
            ServerConfig,
            with_token_from_env(tables.get("server")),
            args,
            source=(source, "server"),
        )
        if run.token_required and not server_config.token:
            raise ConfigError(run.token_refusal("pass it again with RLSERVE_TOKEN=... or --token"))
        algo_name = _run_algorithm(args, tables, resumed=True)
        policies, mapping = policies_from_run(tables, spaces)
        mapping_fn = mapping_function_of(tables, str(run.path), args.trust_code)
    else:
        tables = {}
        source = args.config
        if args.config:
            tables = load_config_file(
                args.config,
                {"server": ServerConfig, **{n: e.settings for n, e in ALGORITHMS.items()}},
                free_tables=("policies", "mapping", "algorithm", "mapping_function"),
            )
        server_config = build(
            ServerConfig,
            with_token_from_env(tables.get("server")),
            args,
            source=(source, "server") if source else None,
        )
        algo_name = _run_algorithm(args, tables, resumed=False)
        policies, mapping = _declared_policies(args, tables, server_config, algo_name)
        # The operator's own file, like a flag: the function it names is theirs.
        mapping_fn = mapping_function_of(tables, args.config or "--config", trust_code=True)
    # The run's algorithm, then every other one a policy names (each with its own settings).
    names = [algo_name]
    for spec in policies.values():
        if spec.algorithm_of(algo_name) not in names:
            names.append(spec.algorithm_of(algo_name))
    refuse_unused_algorithm_flags(args, names)
    for name in ALGORITHMS:
        if isinstance(tables.get(name), dict) and name not in names and not args.resume:
            logger.warning(
                "%s: the [%s] table is not used: no policy learns with %s (the run's algorithm "
                "is %s; [algorithm] name = '%s' or --algo %s would use it)",
                source,
                name,
                name,
                algo_name,
                name,
                name,
            )
    settings = _settings_of(names, args, tables, source)
    ppo_config = settings.pop(algo_name)
    # Loaded now, so a bad certificate or key stops the command before anything is created.
    server_config.ssl_context()
    # Not in the learner, after listening: every policy with its own algorithm and settings.
    check_policies(
        policies,
        to_table(ppo_config),
        algo_name,
        {name: to_table(one) for name, one in settings.items()},
    )
    on_ray = ray_serving(args, server_config)
    if on_ray.learner_link is None:  # on Ray the learner may have a GPU node of its own
        for name, one in [(algo_name, ppo_config), *settings.items()]:
            check_device_present(
                one.device, f"the {name} device (--{name}-device, [{name}] device)"
            )
        for pid, spec in policies.items():
            device = spec.config.get("device")
            if isinstance(device, str):
                check_device_present(device, f"the device of policy '{pid}'")
    server_config = on_ray.server_config
    replicas = on_ray.replicas(args.argv)
    _check_ports_free(server_config)
    created = not args.resume and not _run_exists(server_config)
    # The Algorithm API with a server attached and no environment: its run folder is created
    # (or, resuming, reopened) here; it serves on this thread until SIGINT/SIGTERM.
    algo = NetworkAlgorithm(
        serving_config(server_config, ppo_config, policies, mapping, settings, mapping_fn),
        resume=run.path if args.resume else None,
        background=False,
        learner_link=on_ray.learner_link,
    )
    run = algo.folder
    log_to_run_folder(run.path)
    warning = server_config.plaintext_warning()
    if warning:
        logger.warning(warning.removeprefix("WARNING: "))
    if replicas is not None:
        replicas.start(run.path)
    # The command serves and nothing else: what start-up made (modules, spaces, policies) lives
    # until it returns, so the garbage collector's full scans, each a pause in serving (16-25 ms
    # on a slow 2-core VM), may skip it (unfrozen after, for a caller that goes on).
    gc.freeze()
    try:
        checkpoint = algo.serve_forever()
    except BaseException as exc:
        if _listened(run):
            raise
        # Nothing was served, so a folder this command created holds nothing worth keeping.
        if created:
            shutil.rmtree(run.path, ignore_errors=True)
        if not isinstance(exc, OSError):
            raise
        raise ConfigError(
            f"cannot listen on {server_config.host} ({exc.strerror or exc}); pass other ports "
            "with --port N --http-port N (0 picks free ones)"
        ) from None
    finally:
        gc.unfreeze()
        if replicas is not None:
            replicas.close()
    finals = algo.policy_server.final_checkpoints
    if len(policies) > 1:
        shown = ", ".join(f"{pid}: {finals.get(pid)}" for pid in policies)
        print(f"stopped; final checkpoints: {shown}")
    else:
        print(f"stopped; final checkpoint: {checkpoint}")
    return 0


RESUME_KEEPS = ("config", "spaces_from", "spaces_file", "run_dir", "name")
"""The options of ``rlserve serve`` a resumed run keeps from its own folder."""


def _refuse_ignored_on_resume(args: argparse.Namespace) -> None:
    """Refuse the options that ``--resume`` would silently ignore.

    Raises:
        ConfigError: One of :data:`RESUME_KEEPS` was given with ``--resume``.
    """
    given = [f"--{n.replace('_', '-')}" for n in RESUME_KEEPS if getattr(args, n, None)]
    if given:
        raise ConfigError(
            f"{', '.join(given)}: a resumed run keeps its own configuration, spaces and folder "
            f"({args.resume}/config.toml); drop {' and '.join(given)}, and pass the settings to "
            "change as flags (e.g. --port 0, --ppo-lr 0.0003)"
        )


def _listened(run: Any) -> bool:
    """Whether this process listened (it wrote the run folder's endpoints.json)."""
    import json

    try:
        return bool(json.loads(run.endpoints_file.read_text()).get("pid") == os.getpid())
    except (OSError, ValueError, AttributeError):
        return False


def _run_exists(config: Any) -> bool:
    return config.name is not None and (Path(config.run_dir) / config.name).exists()


def _check_ports_free(config: Any) -> None:
    """Refuse a port that is already taken before anything is created or started.

    Raises:
        ConfigError: The host is not an address of this machine, or a port is in use.
    """
    wanted = [("--port", config.port), ("--http-port", config.http_port)]
    for flag, port in wanted:
        if port <= 0:
            continue
        family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            # As the server binds: a port in TIME_WAIT after a restart is free.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((config.host, port))
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise ConfigError(
                        f"port {port} on {config.host} is in use (another rlserve server?); "
                        f"pass {flag} with a free port, or {flag} 0 to pick one (the ports are "
                        "then in the run folder's endpoints.json)"
                    ) from None
                raise ConfigError(
                    f"cannot listen on {config.host}:{port} ({exc.strerror or exc}); --host must "
                    "be an address of this machine (e.g. 127.0.0.1, or 0.0.0.0 for all)"
                ) from None
