"""A network-only Algorithm on Ray: ``.serving(ray_address=..., replicas=N)``.

The same as ``rlserve serve --ray ADDRESS --replicas N`` (both go through
:func:`rlserve.cluster.serving.serve_on_ray`): the learner is a Ray actor placed by
``.learners(num_cpus_per_learner=..., num_gpus_per_learner=..., custom_resources_per_learner=...)``
and, with ``replicas`` > 1, every other front-end is an ``rlserve serve`` process on its own
node started from this run folder's configuration (``--config-from-run``), one learner for all.
Without ``ray_address`` the learner is the process beside the server, as without Ray.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rlserve.algorithm.config import AlgorithmConfig
from rlserve.algorithm.serving_settings import RAY_SETTINGS, ServingSettings
from rlserve.errors import ConfigError
from rlserve.run.durable import atomic_write_bytes

__all__ = [
    "RAY_PLACEMENT_FILE",
    "front_end_argv",
    "load_ray_placement",
    "ray_serving_of",
    "save_ray_placement",
]

RAY_PLACEMENT_FILE = "ray_placement.json"
"""Where a run served on Ray keeps its placement, so that ``Algorithm.from_checkpoint`` of its
run folder serves on Ray again (JSON: the ``serving()`` Ray settings and the learner's
resources)."""

_LEARNER_SETTINGS = (
    "num_cpus_per_learner",
    "num_gpus_per_learner",
    "custom_resources_per_learner",
)


def ray_serving_of(
    config: AlgorithmConfig, server_config: Any, resume: str | Path | None = None
) -> Any:
    """How ``config``'s server runs on Ray (a :class:`~rlserve.cluster.serving.RayServing`).

    None when ``serving()`` names no Ray cluster. ``resume``: the run folder resumed, whose
    learner's name is taken again (its other front-ends that outlived a lost driver are kept).

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
    learner_name = None
    if resume is not None and settings.replicas > 1:
        from rlserve.cluster.replicas import saved_learner_name

        learner_name = saved_learner_name(Path(resume))
    return serve_on_ray(
        settings.ray_address,
        server_config,
        node_ip=settings.ray_node_ip,
        placement=placement,
        replicas=settings.replicas,
        learner_name=learner_name,
        replicas_setting="replicas=",
        port_setting="port=",
    )


def front_end_argv(run: Path) -> list[str]:
    """The ``rlserve`` arguments of the other front-ends: a new run like the run in ``run``.

    ``run`` was written by this process from its own config, so its mapping function is
    trusted.
    """
    return ["serve", "--config-from-run", str(run), "--trust-code"]


def save_ray_placement(config: AlgorithmConfig, run: Path) -> None:
    """Write how ``config`` placed its server on Ray into the run folder ``run``."""
    settings = config.serving_settings or {}
    placement = {name: settings.get(name) for name in RAY_SETTINGS if name in settings}
    placement.update({name: getattr(config, name) for name in _LEARNER_SETTINGS})
    atomic_write_bytes(run / RAY_PLACEMENT_FILE, json.dumps(placement, indent=2).encode())


def load_ray_placement(config: AlgorithmConfig, run: Path) -> AlgorithmConfig:
    """``config`` placed on Ray as the run in ``run`` was (unchanged when it was not on Ray).

    Raises:
        ConfigError: The placement file is unreadable (the message names it and the fix).
    """
    path = run / RAY_PLACEMENT_FILE
    if not path.exists():
        return config
    try:
        placement = json.loads(path.read_text())
        if not isinstance(placement, dict):
            raise ValueError("not a JSON object")
        ray_settings = {k: placement[k] for k in RAY_SETTINGS if k in placement}
        learner = {k: placement[k] for k in _LEARNER_SETTINGS if k in placement}
        config.serving(**{**(config.serving_settings or {}), **ray_settings})
        config.learners(**learner)
    except (OSError, ValueError, TypeError, ConfigError) as exc:
        raise ConfigError(
            f"{path} (how the run was placed on Ray) is unreadable: {exc}; fix or delete it, "
            "or pass config=... with .serving(ray_address=...) to Algorithm.from_checkpoint"
        ) from exc
    return config
