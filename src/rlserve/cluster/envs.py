"""Sub-environments as Ray actors (``remote_worker_envs=True`` with the Ray backend).

The remote sources (:class:`~rlserve.env.ProcessVectorSource`, and
:class:`~rlserve.env.ProcessMultiAgentSource` for multi-agent and PettingZoo envs) run each
group of ``envs_per_process`` copies in a worker of its own
(:class:`~rlserve.env.copy_workers.CopyWorkers`); :func:`ray_env_group` makes those workers Ray
actors, placed by
``num_cpus_per_remote_env`` and ``custom_resources_per_remote_env``, instead of sub-processes.
Everything else is the source's, the same for both: every copy's step is sent before any answer
is awaited (the actors step in parallel), a copy whose actor dies (its node lost, killed) or that
does not answer within ``sample_timeout_s`` is killed and started again, its episodes counted
as failed, and the copies are seeded as in process.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from rlserve.cluster.supervisor import RaySupervisor, Stamp
from rlserve.env.copies import EnvCopies
from rlserve.env.copy_workers import Supervise

__all__ = ["ray_env_group"]

logger = logging.getLogger("rlserve.env")

_CLOSE_WAIT_S = 2.0
"""How long closing waits for the actors to close their copies before killing them."""


def ray_env_group(num_cpus: float, resources: Mapping[str, float] | None = None) -> Supervise:
    """How a remote source's :class:`~rlserve.env.copy_workers.CopyWorkers` run as actors.

    Args:
        num_cpus: CPUs each actor holds (``num_cpus_per_remote_env``).
        resources: Custom resources each actor holds (``custom_resources_per_remote_env``).

    Returns:
        Its ``supervise`` argument. Calling it raises ``ConfigError`` when Ray is not
        installed or no node has the resources.
    """
    wanted = dict(resources or {})

    def supervise(labels: list[str], max_restarts: int) -> RaySupervisor:
        return RaySupervisor(
            labels,
            EnvCopies,
            what="env actor",
            logger=logger,
            restart_note="its actor",
            success="step",
            stamps=[Stamp() for _ in labels],
            num_cpus=num_cpus,
            resources=wanted,
            max_restarts=max_restarts,
            close_wait_s=_CLOSE_WAIT_S,
            placed="remote env",
        )

    return supervise
