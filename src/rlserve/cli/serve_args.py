"""The flags of ``rlserve serve``, in groups; the rarely used ones only in ``--help-all``.

Every :class:`~rlserve.server.config.ServerConfig` field has a flag: those named in
:data:`SERVER_GROUPS` are shown in their group, any other one under "limits" (with the
per-algorithm settings, only in ``rlserve serve --help-all``).
"""

from __future__ import annotations

import argparse
from typing import Any

from rlserve.cli.logs import add_log_level
from rlserve.config.fields import add_arguments

SERVER_GROUPS: dict[str, tuple[str, ...]] = {
    "run folder": (
        "run_dir",
        "name",
        "spaces_from",
        "spaces_file",
        "checkpoint_every",
        "keep_checkpoints",
        "seed",
    ),
    "network": ("host", "port", "http_port", "http_allowed_origins"),
    "security": ("token", "tls_cert", "tls_key"),
    "training": (
        "fragment_length",
        "idle_timeout",
        "max_sample_queue_steps",
        "max_learner_lag_steps",
        "learner_niceness",
        "sync_reports",
    ),
    "logging": ("progress", "metrics_interval", "callbacks"),
}
"""The shown groups of the server's settings, by title."""

MORE_HELP = (
    "Connection limits and each algorithm's settings (--ppo-*, --dqn-*, --sac-*; also the "
    "[ppo], [dqn], [sac] tables of --config): rlserve serve --help-all."
)
"""The line of ``rlserve serve --help`` that points to the hidden flags."""


HIDDEN = "rlserve_hidden"
"""Attribute of a flag's action left out of ``--help`` (``--help-all`` shows it)."""


class GroupedHelp(argparse.HelpFormatter):
    """argparse's help with a wider flag column, without the flags marked :data:`HIDDEN`."""

    show_hidden = False

    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=34)

    def add_argument(self, action: argparse.Action) -> None:
        """Format ``action`` unless it is hidden (a group of hidden flags gets no heading)."""
        if self.show_hidden or not getattr(action, HIDDEN, False):
            super().add_argument(action)


class _AllHelp(GroupedHelp):
    show_hidden = True


class FullHelp(argparse.Action):
    """``--help-all``: the help with the hidden flags too, then exit."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest=argparse.SUPPRESS, nargs=0, **kwargs)

    @staticmethod
    def hide(actions: list[argparse.Action]) -> None:
        """Leave ``actions`` out of ``--help``; the parser's formatter must be GroupedHelp."""
        for action in actions:
            setattr(action, HIDDEN, True)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        """Print the full help and exit."""
        parser.formatter_class = _AllHelp
        parser.print_help()
        parser.exit()


def add_server_arguments(serve: argparse.ArgumentParser) -> None:
    """Add the server's flags to ``serve`` in groups, ``--log-level`` and ``--help-all``."""
    import dataclasses

    from rlserve.learners.registry import ALGORITHMS
    from rlserve.server.config import ServerConfig

    serve.add_argument(
        "--help-all", action=FullHelp, help="show every flag, the hidden ones too, and exit"
    )
    grouped = {name for names in SERVER_GROUPS.values() for name in names}
    for title, names in SERVER_GROUPS.items():
        group = serve.add_argument_group(title)
        add_arguments(group, ServerConfig, names=names)  # type: ignore[arg-type]
        if title == "logging":
            add_log_level(serve, group)
    rest = [f.name for f in dataclasses.fields(ServerConfig) if f.name not in grouped]
    limits = serve.add_argument_group("limits")
    FullHelp.hide(add_arguments(limits, ServerConfig, names=rest))  # type: ignore[arg-type]
    for entry in ALGORITHMS.values():
        group = serve.add_argument_group(
            f"{entry.name.upper()} (--algo {entry.name}; also the [{entry.name}] table of --config)"
        )
        FullHelp.hide(add_arguments(group, entry.settings, prefix=f"{entry.name}_"))  # type: ignore[arg-type]
    add_ray_arguments(serve)


def add_ray_arguments(serve: argparse.ArgumentParser) -> None:
    """Add the flags that run the server on a Ray cluster (all but ``--ray`` in --help-all)."""
    group = serve.add_argument_group("Ray cluster (pip install -e '.[ray]'; docs/scaling.md)")
    group.add_argument(
        "--ray",
        metavar="ADDRESS",
        default=None,
        help="run the learner as an actor on the Ray cluster at ADDRESS (HOST:PORT or auto)",
    )
    group.add_argument(
        "--replicas",
        metavar="N",
        type=int,
        default=None,
        help="with --ray: N serving front-ends, one per node, on the same --port",
    )
    hidden = [
        group.add_argument(
            "--ray-node-ip",
            metavar="IP",
            default=None,
            help="this machine's address as the cluster knows it (ray.init's _node_ip_address)",
        ),
        group.add_argument(
            "--ray-learner-resources",
            metavar="JSON",
            default=None,
            help="what the learner actor holds, which picks its node, e.g. '{\"GPU\": 1}' (CPU, "
            "GPU and custom resources; default 1 CPU)",
        ),
    ]
    hidden.append(
        group.add_argument(
            "--config-from-run",
            metavar="FOLDER",
            default=None,
            help="(set by .serving(replicas=N)) a new run with the configuration, algorithm "
            "settings and policies of the run folder FOLDER (its flags still apply)",
        )
    )
    hidden.append(
        group.add_argument(
            "--front-end-of",
            metavar="NAME",
            default=None,
            help="(set by --replicas) serve as a front-end of the learner actor NAME",
        )
    )
    FullHelp.hide(hidden)


def refuse_unused_algorithm_flags(args: argparse.Namespace, used: list[str]) -> None:
    """Refuse ``--ALGO-*`` settings flags of an algorithm no policy learns with.

    ``used`` names the algorithms in use, the run's first. Without this check such a flag would
    be dropped without a word (``rlserve serve --algo dqn --ppo-lr 0.1`` trains DQN).

    Raises:
        ConfigError: A flag of an algorithm not in ``used`` was given.
    """
    import dataclasses

    from rlserve.errors import ConfigError
    from rlserve.learners.registry import ALGORITHMS

    for other in ALGORITHMS.values():
        if other.name in used:
            continue
        given = [
            f"--{other.name}-{f.name.replace('_', '-')}"
            for f in dataclasses.fields(other.settings)
            if getattr(args, f"{other.name}_{f.name}", None) is not None
        ]
        if given:
            learns = (
                f"the algorithm is {used[0]}"
                if len(used) == 1
                else (f"the policies learn with {', '.join(used)}")
            )
            raise ConfigError(
                f"{', '.join(given)} set {other.name} settings, but {learns}; pass --algo "
                f"{other.name}, or --{used[0]}-* settings"
            )
