"""A server on Ray, for ``rlserve serve --ray`` and ``.serving(ray_address=...)`` alike.

:func:`serve_on_ray` checks and connects what both ask for (Ray installed, the cluster
answering, the learner's resources on some node, enough nodes for the replicas, the port free
on each) before anything is created, and says how the server then runs: its settings, the
learner link to make (the learner as an actor, or shared by N front-ends) and the other
front-ends (:class:`~rlserve.cluster.replicas.Replicas`) to start once it listens.
"""

from __future__ import annotations

import dataclasses
import functools
import uuid
from collections.abc import Sequence
from typing import Any

from rlserve.cluster.connect import LearnerPlacement, connect
from rlserve.errors import ConfigError

__all__ = ["RayServing", "serve_on_ray"]


@dataclasses.dataclass
class RayServing:
    """What a server runs differently on Ray."""

    server_config: Any
    """The server's settings (with replicas: listening on this node's address)."""
    learner_link: Any = None
    """Makes the learner link (None: the learner process)."""
    ray: Any = None
    """The ``ray`` module, connected (None: not on Ray)."""
    address: str = ""
    """The cluster's address, for the other front-ends' ``--ray``."""
    nodes: list[str] = dataclasses.field(default_factory=list)
    """The other front-ends' node addresses (none: one front-end)."""
    learner_name: str = ""
    """The shared learner actor's name (with other front-ends)."""

    def replicas(self, argv: Sequence[str]) -> Any:
        """The other front-ends, to start once this one listens; None without any.

        Args:
            argv: The ``rlserve`` arguments (``serve ...``) each other front-end starts from.
        """
        if not self.nodes:
            return None
        from rlserve.cluster.replicas import Replicas
        from rlserve.config.fields import TOKEN_ENV

        # The token reaches them through Ray (a trusted cluster), never a command line.
        token = getattr(self.server_config, "token", None)
        env = {TOKEN_ENV: token} if token else None
        return Replicas(self.ray, self.address, self.nodes, argv, self.learner_name, env)


def serve_on_ray(
    address: str,
    server_config: Any,
    *,
    node_ip: str | None = None,
    placement: LearnerPlacement | None = None,
    replicas: int = 1,
    front_end_of: str | None = None,
    learner_name: str | None = None,
    replicas_setting: str = "--replicas",
    port_setting: str = "--port",
) -> RayServing:
    """Connect to the cluster at ``address`` and check what is asked; how the server runs.

    Args:
        address: The head node's address (``HOST:PORT``, or ``auto``).
        server_config: The server's settings.
        node_ip: This machine's address as the cluster knows it (None: Ray's guess).
        placement: The learner actor's resources (None: 1 CPU).
        replicas: Front-ends, one per node, this one first.
        front_end_of: Serve as another front-end of this learner actor (set by a launcher).
        learner_name: The learner actor's name with replicas (None: a new one); a resumed
            driver passes its run's, and keeps the front-ends still running under it.
        replicas_setting: The setting's name in messages (``--replicas``, ``replicas=``).
        port_setting: The port setting's name in messages (``--port``, ``port=``).

    Raises:
        ConfigError: Ray not installed, a cluster that does not answer, learner resources no
            node has, too few nodes for the replicas, port 0 with replicas, or the port
            taken on one of their nodes.
    """
    from rlserve.cluster.front_end_link import FrontEndLink
    from rlserve.cluster.learner_link import RayLearnerLink

    placement = placement or LearnerPlacement()
    ray = connect(address, node_ip)
    own_ip = node_ip or ray.util.get_node_ip_address()
    if front_end_of:
        from rlserve.cluster.front_ends import die_with_launcher

        die_with_launcher()
        link: Any = functools.partial(
            FrontEndLink, front_end=own_ip, learner_name=front_end_of, owner=False
        )
        return RayServing(server_config, link, ray, address)
    placement.check(ray)
    if replicas <= 1:
        link = functools.partial(RayLearnerLink, placement=placement)
        return RayServing(server_config, link, ray, address)
    from rlserve.cluster.front_ends import check_ports, front_end_nodes, given

    if server_config.port <= 0:
        raise ConfigError(
            f"{given(replicas_setting, replicas)}: every front-end listens on the same port; "
            f"pass {given(port_setting, 'N')} (not 0) with a port free on every node"
        )
    name = learner_name or f"rlserve-learner-{uuid.uuid4().hex[:12]}"
    kept: list[str] = []
    if learner_name:
        from rlserve.cluster.replicas import live_launchers

        # Front-ends that outlived the driver before this one hold the port: they are kept
        # (their nodes first).
        alive = {str(n["NodeManagerAddress"]) for n in ray.nodes() if n.get("Alive")}
        kept = live_launchers(ray, name, sorted(alive - {own_ip}))
    nodes = front_end_nodes(ray, replicas, own_ip, replicas_setting, prefer=kept)
    check_ports(ray, [ip for ip in nodes[1:] if ip not in kept], server_config.port)
    link = functools.partial(
        FrontEndLink, placement=placement, front_end=own_ip, learner_name=name, owner=True
    )
    return RayServing(
        dataclasses.replace(server_config, host=own_ip),
        link,
        ray,
        address,
        nodes[1:],
        name,
    )
