"""A network-only Algorithm on Ray: ``.serving(ray_address=..., replicas=N)``.

The same as ``rlserve serve --ray ADDRESS --replicas N`` (both go through
:func:`rlserve.cluster.serving.serve_on_ray`): the learner is a Ray actor placed by
``.learners(num_cpus_per_learner=..., num_gpus_per_learner=..., custom_resources_per_learner=...)``
and, with ``replicas`` > 1, every other front-end is an ``rlserve serve`` process on its own
node started from this run folder's configuration (``--config-from-run``), one learner for all.
Without ``ray_address`` the learner is the process beside the server, as without Ray.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlserve.algorithm.config import AlgorithmConfig
from rlserve.algorithm.serving_settings import ServingSettings

__all__ = ["front_end_argv", "ray_serving_of"]


def ray_serving_of(config: AlgorithmConfig, server_config: Any) -> Any:
    """How ``config``'s server runs on Ray (a :class:`~rlserve.cluster.serving.RayServing`).

    None when ``serving()`` names no Ray cluster.

    Raises:
        ConfigError: As :func:`~rlserve.cluster.serving.serve_on_ray` (Ray not installed, a
            cluster that does not answer, resources no node has, too few nodes, a port taken).
    """
    settings = ServingSettings(**(config.serving_settings or {}))
    if settings.ray_address is None:
        return None
    from rlserve.cluster.connect import LearnerPlacement
    from rlserve.cluster.serving import serve_on_ray

    placement = LearnerPlacement(
        num_cpus=config.num_cpus_per_learner,
        num_gpus=config.num_gpus_per_learner,
        resources=dict(config.custom_resources_per_learner),
    )
    return serve_on_ray(
        settings.ray_address,
        server_config,
        node_ip=settings.ray_node_ip,
        placement=placement,
        replicas=settings.replicas,
        replicas_setting="replicas=",
        port_setting="port=",
    )


def front_end_argv(run: Path) -> list[str]:
    """The ``rlserve`` arguments of the other front-ends: a new run like the run in ``run``."""
    return ["serve", "--config-from-run", str(run)]
