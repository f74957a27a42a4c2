"""The rlserve command: serve, train, check-env, status, demo, export."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from rlserve.cli.exit_codes import INTERRUPTED
from rlserve.cli.logs import add_log_level, configured_logging
from rlserve.cli.serve_args import MORE_HELP, GroupedHelp, add_server_arguments
from rlserve.config.fields import add_arguments, build
from rlserve.errors import ConfigError, RLServeError
from rlserve.version import __version__

DESCRIPTION = """\
Train reinforcement-learning policies (PPO, DQN, SAC) from simulators that run their own loop
and talk to this server over the network. 'rlserve COMMAND --help' describes each command's options.
"""

SERVER_EXTRA = frozenset(
    {"torch", "starlette", "uvicorn", "uvloop", "tensorboard", "prometheus_client", "tomli_w"}
    | {"onnx", "onnxscript"}
)
"""Top-level modules of the ``server`` extra: a client-only install lacks them."""


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
        help="TOML file with [server], [ppo] (or [dqn], [sac]) tables, and [policies.<id>] and "
        "[mapping] tables for several policies",
    )
    serve.add_argument("--resume", metavar="RUN_DIR", help="continue the run in this folder")
    serve.add_argument(
        "--trust-code",
        action="store_true",
        help="with --resume: import the mapping function the folder names (your own folders only)",
    )
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
        args.argv = list(sys.argv[1:] if argv is None else argv)  # front-ends on Ray reuse it
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
        from rlserve.cli.serve import serve_command

        return serve_command(args)
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
