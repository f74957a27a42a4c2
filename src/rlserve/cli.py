"""The ``rlserve`` command: ``serve`` and ``demo``."""

from __future__ import annotations

import argparse
import json
import sys
import tomllib
from pathlib import Path
from typing import Any

from rlserve.config import add_arguments, build, to_table
from rlserve.errors import RLServeError


def _spaces(config: Any) -> tuple[Any, Any]:
    import gymnasium as gym

    from rlserve.errors import ConfigError
    from rlserve.spaces import describe, from_description

    if config.spaces_from:
        try:
            env = gym.make(config.spaces_from)
        except gym.error.Error as exc:
            raise ConfigError(f"--spaces-from {config.spaces_from}: {exc}") from exc
        # Rebuilt from their descriptions, so the server flattens observations exactly as a
        # client that rebuilt them from the welcome does (e.g. the key order of a Dict).
        spaces = (
            from_description(describe(env.observation_space)),
            from_description(describe(env.action_space)),
        )
        env.close()
        return spaces
    if config.spaces_file:
        raw = json.loads(Path(config.spaces_file).read_text())
        return from_description(raw["observation_space"]), from_description(raw["action_space"])
    raise ConfigError(
        "the server needs the policy's spaces: pass --spaces-from ENV_ID (e.g. CartPole-v1) or "
        "--spaces-file FILE.json with observation_space and action_space descriptions"
    )


def _serve(args: argparse.Namespace) -> int:
    import asyncio

    from rlserve.algorithms.ppo_config import PPOConfig
    from rlserve.errors import ConfigError
    from rlserve.policy.distributions import check_learnable
    from rlserve.server.app import PolicyServer, install_uvloop, serve_forever
    from rlserve.server.config import ServerConfig, with_token_from_env
    from rlserve.server.run_folder import RunFolder
    from rlserve.spaces import describe, from_description

    if args.resume:
        run = RunFolder.existing(args.resume)
        tables, spaces = run.load()
        server_config = build(ServerConfig, with_token_from_env(tables.get("server")), args)
        if run.token_required and not server_config.token:
            raise ConfigError(
                f"the run in {run.path} was started with a token, which is not saved in the run "
                "folder: pass it again with RLSERVE_TOKEN=... or --token"
            )
        ppo_config = build(PPOConfig, tables.get("ppo"), args, prefix="ppo_")
        observation_space = from_description(spaces["observation_space"])
        action_space = from_description(spaces["action_space"])
    else:
        tables = {}
        if args.config:
            with open(args.config, "rb") as fh:
                tables = tomllib.load(fh)
        server_config = build(ServerConfig, with_token_from_env(tables.get("server")), args)
        ppo_config = build(PPOConfig, tables.get("ppo"), args, prefix="ppo_")
        observation_space, action_space = _spaces(server_config)
    # Loaded now, so a bad certificate or key stops the command before anything is created.
    server_config.ssl_context()
    check_learnable(observation_space, action_space)  # not in the learner, after listening
    if not args.resume:
        run = RunFolder.create(server_config.run_dir, server_config.name)
    warning = server_config.plaintext_warning()
    if warning:
        print(f"rlserve: {warning}", file=sys.stderr, flush=True)
    run.save(
        {"server": to_table(server_config), "ppo": to_table(ppo_config)},
        {"observation_space": describe(observation_space), "action_space": describe(action_space)},
    )
    install_uvloop()

    async def main() -> Path | None:
        server = PolicyServer(
            server_config,
            to_table(ppo_config),
            observation_space,
            action_space,
            run,
            resume=bool(args.resume),
        )
        return await serve_forever(server)

    checkpoint = asyncio.run(main())
    print(f"stopped; final checkpoint: {checkpoint}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from rlserve.demo import DemoConfig, run_demo

    return run_demo(build(DemoConfig, None, args))


def _export(args: argparse.Namespace) -> int:
    from rlserve.export import export_onnx

    path = export_onnx(args.run_dir, args.output, args.checkpoint)
    print(f"wrote {path} (inputs and outputs described in {path}.json)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``rlserve`` command."""
    from rlserve.algorithms.ppo_config import PPOConfig
    from rlserve.demo import DemoConfig
    from rlserve.server.config import ServerConfig

    parser = argparse.ArgumentParser(prog="rlserve", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser(
        "serve",
        help="run a policy server that trains PPO from external clients",
        description="Run a policy server. Flags override the tables of --config.",
    )
    serve.add_argument("--config", help="TOML file with [server] and [ppo] tables")
    serve.add_argument("--resume", metavar="RUN_DIR", help="continue the run in this folder")
    add_arguments(serve, ServerConfig)
    ppo = serve.add_argument_group("PPO (also the [ppo] table of --config)")
    add_arguments(ppo, PPOConfig, prefix="ppo_")  # type: ignore[arg-type]
    demo = commands.add_parser(
        "demo", help="train CartPole from 4 external client processes and stop when solved"
    )
    demo.add_argument("task", choices=["cartpole"], help="the demo to run")
    add_arguments(demo, DemoConfig)
    export = commands.add_parser(
        "export", help="export a run's policy to run it in a simulator (ONNX)"
    )
    export.add_argument("run_dir", help="the run folder, e.g. runs/<name>")
    export.add_argument("--format", choices=["onnx"], default="onnx", help="the model format")
    export.add_argument("--output", help="file to write (default: RUN_DIR/policy.onnx)")
    export.add_argument("--checkpoint", help="checkpoint to export (default: the newest)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``rlserve`` command."""
    args = build_parser().parse_args(argv)
    try:
        if args.command == "serve":
            return _serve(args)
        if args.command == "export":
            return _export(args)
        return _demo(args)
    except RLServeError as exc:
        print(f"rlserve: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
