"""``rlserve serve --ray``: the learner as a Ray actor, and ``--replicas N`` front-ends.

Everything here is checked before anything is created: Ray installed, the cluster answering,
the learner's resources on some node, enough nodes for the replicas, the port free on each.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import uuid
from typing import Any

from rlserve.errors import ConfigError

_RAY_ONLY = ("ray_node_ip", "ray_learner_resources", "replicas", "front_end_of")


@dataclasses.dataclass
class RayServing:
    """What ``rlserve serve`` runs differently on Ray."""

    server_config: Any
    """The server's settings (with ``--replicas``: listening on this node's address)."""
    learner_link: Any = None
    """Makes the learner link (None: the learner process)."""
    replicas: Any = None
    """The other front-ends (:class:`~rlserve.cluster.replicas.Replicas`), or None."""


def ray_serving(args: argparse.Namespace, server_config: Any) -> RayServing:
    """Connect and check what the Ray flags ask for; how the server runs on Ray.

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
        return RayServing(server_config)
    from rlserve.cluster.connect import LearnerPlacement, connect
    from rlserve.cluster.front_end_link import FrontEndLink
    from rlserve.cluster.learner_link import RayLearnerLink

    placement = LearnerPlacement.parse(args.ray_learner_resources)
    ray = connect(args.ray, args.ray_node_ip)
    own_ip = args.ray_node_ip or ray.util.get_node_ip_address()
    if args.front_end_of:
        from rlserve.cluster.front_ends import die_with_launcher

        die_with_launcher()
        link = functools.partial(
            FrontEndLink, front_end=own_ip, learner_name=args.front_end_of, owner=False
        )
        return RayServing(server_config, link)
    placement.check(ray)
    replicas = int(args.replicas or 1)
    if replicas <= 1:
        return RayServing(server_config, functools.partial(RayLearnerLink, placement=placement))
    from rlserve.cluster.front_ends import check_ports, front_end_nodes
    from rlserve.cluster.replicas import Replicas

    if server_config.port <= 0:
        raise ConfigError(
            f"--replicas {replicas}: every front-end listens on the same port; pass --port N "
            "(not 0) with a port free on every node"
        )
    nodes = front_end_nodes(ray, replicas, own_ip)
    check_ports(ray, nodes[1:], server_config.port)
    name = f"rlserve-learner-{uuid.uuid4().hex[:12]}"
    link = functools.partial(
        FrontEndLink, placement=placement, front_end=own_ip, learner_name=name, owner=True
    )
    return RayServing(
        dataclasses.replace(server_config, host=own_ip),
        link,
        Replicas(ray, args.ray, nodes[1:], args.argv, name),
    )
