"""Running parts of rlserve on a Ray cluster (``pip install -e '.[ray]'``).

Only this package imports Ray, and only when a Ray backend is asked for: without Ray installed
everything else works as before, and asking for it raises a one-line
:class:`~rlserve.errors.ConfigError` naming the install command. Unlike rlserve's own wire,
Ray pickles what it moves between nodes (a worker's setup, its messages and answers): a Ray
cluster is one trusted machine spread over a private network.

* :mod:`~rlserve.cluster.ray_import`: importing Ray on demand and choosing the backend.
* :mod:`~rlserve.cluster.resources`: refusing, before anything starts, a resource no node has.
* :mod:`~rlserve.cluster.supervisor`: :class:`RaySupervisor`, supervised workers as Ray actors
  (the Ray twin of :class:`~rlserve.processes.supervisor.ProcessSupervisor`); the env runners
  of :class:`~rlserve.algorithm.runner_group.RunnerGroup` run in it with ``backend="ray"``.
* :mod:`~rlserve.cluster.actor`: the actor around a :class:`Worker` (what a part must offer
  to run as a supervised actor: a greeting, ``handle(message)``, a progress stamp, ``close``).
"""

from __future__ import annotations

from rlserve.cluster.actor import Worker
from rlserve.cluster.ray_import import RAY_INSTALL, import_ray, use_ray
from rlserve.cluster.resources import check_resources
from rlserve.cluster.supervisor import RaySupervisor, Stamp

__all__ = [
    "RAY_INSTALL",
    "RaySupervisor",
    "Stamp",
    "Worker",
    "check_resources",
    "import_ray",
    "use_ray",
]
