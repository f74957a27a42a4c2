"""``rlserve serve --ray``: the learner as a Ray actor, and ``--replicas N`` front-ends.

Everything here is checked before anything is created: Ray installed, the cluster answering,
the learner's resources on some node, enough nodes for the replicas, the port free on each.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

from rlserve.errors import ConfigError

_RAY_ONLY = (
    "ray_node_ip",
    "ray_learner_resources",
    "replicas",
    "front_end_of",
    "config_from_run",
)


def ray_serving(args: argparse.Namespace, server_config: Any) -> Any:
    """Connect and check what the Ray flags ask for; how the server runs on Ray.

    Returns a :class:`~rlserve.cluster.serving.RayServing` (without ``--ray``: the server
    config alone, no learner link, no other front-ends).

    Raises:
        ConfigError: A Ray flag without ``--ray``, Ray not installed, a cluster that does not
            answer, learner resources no node has, too few nodes for ``--replicas``, or the
            port taken on one of their nodes.
    """
    if args.ray is None:
        given = [f for f in _RAY_ONLY if getattr(args, f, None)]
        if given:
            flags = ", ".join(f"--{f.replace('_', '-')}" for f in given)
            raise ConfigError(f"{flags} apply to a server on Ray: add --ray ADDRESS, or drop them")
        return _NotOnRay(server_config)
    from rlserve.cluster.connect import LearnerPlacement
    from rlserve.cluster.serving import serve_on_ray

    learner_name = None
    if args.resume and int(args.replicas or 1) > 1:
        from rlserve.cluster.replicas import saved_learner_name

        # The same name again: the front-ends that outlived the driver find the new learner.
        learner_name = saved_learner_name(Path(args.resume))
    return serve_on_ray(
        args.ray,
        server_config,
        node_ip=args.ray_node_ip,
        placement=LearnerPlacement.parse(args.ray_learner_resources),
        replicas=int(args.replicas or 1),
        front_end_of=args.front_end_of,
        learner_name=learner_name,
    )


@dataclasses.dataclass
class _NotOnRay:
    """A server not on Ray: its settings, no learner link, no other front-ends."""

    server_config: Any
    learner_link: Any = None

    def replicas(self, argv: Any) -> None:
        """No other front-ends."""
        return None
