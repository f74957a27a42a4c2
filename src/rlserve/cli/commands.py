"""The rlserve command: serve, train, check-env, status, demo, export."""

from __future__ import annotations

import argparse
import errno
import logging
import os
import shutil
import socket
import sys
from pathlib import Path
from typing import Any

from rlserve.cli.exit_codes import INTERRUPTED
from rlserve.cli.logs import add_log_level, configured_logging, log_to_run_folder
from rlserve.cli.serve_args import MORE_HELP, GroupedHelp, add_server_arguments
from rlserve.config.fields import add_arguments, build, load_config_file, to_table
from rlserve.errors import ConfigError, RLServeError
from rlserve.version import __version__

logger = logging.getLogger("rlserve.cli")

DESCRIPTION = """\
Train reinforcement-learning policies (PPO, DQN, SAC) from simulators that run their own loop
and talk to this server over the network. 'rlserve COMMAND --help' describes each command's options.
"""

SERVER_EXTRA = frozenset(
    {"torch", "starlette", "uvicorn", "uvloop", "tensorboard", "prometheus_client", "tomli_w"}
    | {"onnx", "onnxscript"}
)
"""Top-level modules of the ``server`` extra: a client-only install lacks them."""


def _spaces(config: Any) -> tuple[Any, Any]:
    from rlserve.errors import ConfigError

    if config.spaces_from:
        from rlserve.config.spaces_file import spaces_of_env

        return spaces_of_env(config.spaces_from)
    if config.spaces_file:
        from rlserve.config.spaces_file import load_spaces_file

        return load_spaces_file(config.spaces_file)
    raise ConfigError(
        "the server needs the policy's spaces: pass --spaces-from ENV_ID (e.g. CartPole-v1) or "
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

    run_algo = run_algorithm(tables).name
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
                "off-policy algorithms (--algo dqn, or a policy with algo = 'dqn')"
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


def _serve(args: argparse.Namespace) -> int:
    from rlserve.algorithm.network import NetworkAlgorithm
    from rlserve.algorithm.network_config import mapping_function_of, serving_config
    from rlserve.learners.registry import ALGORITHMS
    from rlserve.run.run_folder import IN_USE_RESUME, RunFolder
    from rlserve.server.config import ServerConfig, with_token_from_env
    from rlserve.server.policies import policies_from_run
    from rlserve.server.policies_config import check_policies

    if args.resume:
        _refuse_ignored_on_resume(args)
        run = RunFolder.existing(args.resume)
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
            raise ConfigError(
                f"the run in {run.path} was started with a token, which is not saved in the run "
                "folder: pass it again with RLSERVE_TOKEN=... or --token"
            )
        algo_name = _run_algorithm(args, tables, resumed=True)
        policies, mapping = policies_from_run(tables, spaces)
        mapping_fn = mapping_function_of(tables, str(run.path))
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
        mapping_fn = mapping_function_of(tables, args.config or "--config")
    # The run's algorithm, then every other one a policy names (each with its own settings).
    names = [algo_name]
    for spec in policies.values():
        if spec.algorithm_of(algo_name) not in names:
            names.append(spec.algorithm_of(algo_name))
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
    _check_ports_free(server_config)
    created = not args.resume and not _run_exists(server_config)
    # The Algorithm API with a server attached and no environment: its run folder is created
    # (or, resuming, reopened) here; it serves on this thread until SIGINT/SIGTERM.
    algo = NetworkAlgorithm(
        serving_config(server_config, ppo_config, policies, mapping, settings, mapping_fn),
        resume=run.path if args.resume else None,
        background=False,
    )
    run = algo.folder
    log_to_run_folder(run.path)
    warning = server_config.plaintext_warning()
    if warning:
        logger.warning(warning.removeprefix("WARNING: "))
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


def _demo(args: argparse.Namespace) -> int:
    from rlserve.cli.demo import DemoConfig, run_demo

    return run_demo(build(DemoConfig, None, args), args.task)


def _export(args: argparse.Namespace) -> int:
    import json

    from rlserve.algorithm.export import export_onnx
    from rlserve.run.run_folder import resume_command

    path = export_onnx(args.run_dir, args.output, args.checkpoint, policy_id=args.policy)
    print(f"wrote {path} (inputs and outputs described in {path}.json)")
    description = json.loads(Path(f"{path}.json").read_text())
    if description["updates"] == 0:
        print(
            f"rlserve: warning: {description['checkpoint']} was never trained (0 learner "
            "updates): the exported policy acts on its initial random weights; train the run "
            f"first ({resume_command(Path(args.run_dir))}), then export again",
            file=sys.stderr,
        )
    return 0


def _check_env(args: argparse.Namespace) -> int:
    import json

    from rlserve.env.check import check_env
    from rlserve.env.locate import locate_env

    env_config = None
    if args.env_config is not None:
        try:
            env_config = json.loads(args.env_config)
        except ValueError as exc:
            raise ConfigError(
                f"--env-config is not valid JSON ({exc}): pass an object, e.g. "
                """'{"corridor_length": 5}'"""
            ) from None
        if not isinstance(env_config, dict):
            raise ConfigError(
                f"--env-config must be a JSON object, got {type(env_config).__name__}: pass e.g. "
                """'{"corridor_length": 5}'"""
            )
    for flag, value in (("--episodes", args.episodes), ("--max-steps", args.max_steps)):
        if value < 1:
            raise ConfigError(f"{flag} must be at least 1, got {value}")
    report = check_env(
        locate_env(args.env),
        env_config,
        episodes=args.episodes,
        max_steps=args.max_steps,
        seed=args.seed,
    )
    print(report.summary())
    return 0 if report.ok else 1


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``rlserve`` command."""
    from rlserve.cli.demo import TASKS, DemoConfig
    from rlserve.learners.registry import ALGORITHMS

    parser = argparse.ArgumentParser(
        prog="rlserve",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"rlserve {__version__}")
    commands = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", title="commands"
    )
    serve = commands.add_parser(
        "serve",
        help="run a policy server that trains policies (PPO, DQN, SAC) from external clients",
        description="Run a policy server. Flags override the tables of --config. " + MORE_HELP,
        usage="rlserve serve [--config FILE | --resume RUN_DIR] [options]",
        formatter_class=GroupedHelp,
    )
    serve.add_argument(
        "--config",
        help="TOML file with [server] and [ppo] (or [dqn], [sac]) tables, and [policies.<id>] "
        "and [mapping] tables for several policies (each may name its own algo)",
    )
    serve.add_argument("--resume", metavar="RUN_DIR", help="continue the run in this folder")
    serve.add_argument(
        "--algo",
        choices=list(ALGORITHMS),
        default=None,
        help="the learning algorithm (also [algorithm] name = ... in --config; a resumed run "
        "keeps its own; a [policies.<id>] table may name its own with algo = ...); default ppo. "
        + "; ".join(f"{e.name}: {e.summary}" for e in ALGORITHMS.values()),
    )
    serve.add_argument(
        "--checkpoint-replay",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="save an off-policy algorithm's replay buffer in its checkpoints, so a resumed run "
        "does not start with an empty one (default: off)",
    )
    add_server_arguments(serve)
    status = commands.add_parser(
        "status",
        help="show a running server's progress, clients, episodes and learner",
        description="Show a running server's progress, clients, episodes and learner state, "
        "read from its HTTP carrier.",
    )
    status.add_argument(
        "target",
        nargs="?",
        default=None,
        help="a run folder (its endpoints.json says where the server listens) or the HTTP "
        "address, e.g. localhost:9901 or https://host:9901 (default: the newest run in runs/)",
    )
    status.add_argument("--token", help="the server's token (default: RLSERVE_TOKEN)")
    status.add_argument(
        "--tls-ca", help="CA file of a TLS server's certificate (default: RLSERVE_TLS_CA)"
    )
    status.add_argument("--json", action="store_true", help="print the raw metrics as JSON")
    status.add_argument(
        "--timeout", type=float, default=5.0, help="seconds to wait for the server (default: 5)"
    )
    from rlserve.cli.train import add_train_parser

    add_train_parser(commands)
    demo = commands.add_parser(
        "demo",
        help="train CartPole (PPO or DQN) or Pendulum (SAC) from 4 external client processes "
        "and stop when solved",
    )
    demo.add_argument(
        "task", choices=list(TASKS), help="the demo to run: cartpole (PPO, DQN), pendulum (SAC)"
    )
    add_arguments(demo, DemoConfig)
    export = commands.add_parser(
        "export", help="export a run's policy to run it in a simulator (ONNX)"
    )
    export.add_argument("run_dir", help="the run folder, e.g. runs/<name>")
    export.add_argument("--format", choices=["onnx"], default="onnx", help="the model format")
    export.add_argument("--output", help="file to write (default: RUN_DIR/policy.onnx)")
    export.add_argument("--checkpoint", help="checkpoint to export (default: the newest)")
    export.add_argument(
        "--policy",
        default="default",
        metavar="ID",
        help="the policy to export, in a run with several (default: default)",
    )
    check = commands.add_parser(
        "check-env",
        help="run a few episodes of an environment and report every departure from the contract",
        description="Run a few episodes of an environment and report every departure from the "
        "gymnasium contract (RLlib's conventions for multi-agent envs): one line per problem "
        "or warning. Exit status: 0 without problems, 1 with problems, 2 on a usage error.",
    )
    check.add_argument(
        "env",
        metavar="ENV",
        help="a registered gymnasium id (e.g. CartPole-v1), or module:Name where module is a "
        "module name or a .py file and Name a class or creator taking an env_config dict "
        "(e.g. examples/corridor.py:SimpleCorridor)",
    )
    check.add_argument(
        "--env-config",
        metavar="JSON",
        help="a JSON object given to the class or creator (gym.make's keyword arguments for an id)",
    )
    check.add_argument("--episodes", type=int, default=3, help="episodes to run (default: 3)")
    check.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the first reset and of the sampled actions (default: 0)",
    )
    check.add_argument(
        "--max-steps",
        type=int,
        default=1000,
        help="steps after which an episode is cut off with a warning (default: 1000)",
    )
    for name, command in commands.choices.items():
        if name != "serve":
            add_log_level(command)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``rlserve`` command.

    Exit status: 0 on success, 1 when a command's goal was not met (or its output pipe was
    closed early, as by ``| head``), 2 on a usage error, 130 after Ctrl-C.
    """
    command = "?"
    try:
        args = build_parser().parse_args(argv)
        command = args.command
        with configured_logging(args.log_level):
            return _run_command(args)
    except RLServeError as exc:
        print(f"rlserve: error: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] not in SERVER_EXTRA:
            raise
        print(
            f"rlserve: error: 'rlserve {command}' needs the server extra ({exc.name} is "
            "not installed): pip install -e '.[server]' in a source checkout, or add [server] "
            "to the wheel you installed (README.md, Install)",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt:
        # Ctrl-C before a command could save anything (train and demo say what they saved).
        print("rlserve: interrupted", file=sys.stderr)
        return INTERRUPTED
    except BrokenPipeError:
        # The reader of stdout went away (rlserve status | head): nothing more to say to it.
        # Python's recipe: point stdout at devnull so the exit's flush cannot fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1


def _run_command(args: argparse.Namespace) -> int:
    if args.command == "serve":
        return _serve(args)
    if args.command == "export":
        return _export(args)
    if args.command == "train":
        from rlserve.cli.train import train_command

        return train_command(args)
    if args.command == "check-env":
        return _check_env(args)
    if args.command == "status":
        from rlserve.cli.status import run_status

        return run_status(args.target, args.token, args.tls_ca, args.json, args.timeout)
    return _demo(args)


if __name__ == "__main__":
    sys.exit(main())
