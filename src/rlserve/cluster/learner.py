"""A policy's learner as a Ray actor, on the node that has the resources it asks for.

``.learners(num_gpus_per_learner=1)`` (or ``num_learners=1``, ``custom_resources_per_learner``)
with the Ray backend: the Algorithm's learner of each policy is a :class:`LearnerHost` actor
holding ``num_cpus_per_learner`` CPUs, ``num_gpus_per_learner`` GPUs and the custom resources,
and the Algorithm talks to it through a :class:`RemoteLearner`, a
:class:`~rlserve.learners.base.Learner` whose every call is one actor call:

* ``ingest`` sends a round's fragments (through Ray's object store), ``update`` runs one update
  there; each answers with the learner's small state (version, buffered steps, whether it is
  ready, counters), kept here so the driver's questions between calls cost nothing.
* ``weights`` fetches the new weights once per version.
* ``save`` and ``load`` move a checkpoint's bytes, so the checkpoint is written and read where
  the Algorithm runs, whichever node the learner is on.

The learner's device is its settings' (``device="auto"``: CUDA when torch finds it on that
node). A node given a GPU by ``ray start --num-gpus=1`` without one places the actor, but torch
finds no CUDA there and ``auto`` falls back to the CPU. The actor is not restarted when it dies
(its weights and optimiser state would be lost): the next call raises, naming the fix.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rlserve.cluster.failures import actor_failure
from rlserve.cluster.ray_import import import_ray
from rlserve.cluster.resources import check_resources
from rlserve.learners.base import Learner
from rlserve.learners.registry import algorithm
from rlserve.policy.weights import WeightsPackage
from rlserve.protocol.fragment import Fragment
from rlserve.run.durable import atomic_write_bytes

__all__ = ["LearnerHost", "RemoteLearner", "learner_actor"]

START_TIMEOUT_S = 120.0
"""Seconds the learner actor may take to be placed and build its learner."""

_FILE = "learner.pt"


class LearnerHost:
    """The learner of one policy inside its actor (made a Ray actor by :func:`learner_actor`).

    Args:
        algo: The policy's algorithm name.
        observation_space: The policy's observation space.
        action_space: Its action space.
        settings: Its algorithm's settings dataclass.
    """

    def __init__(self, algo: str, observation_space: Any, action_space: Any, settings: Any) -> None:
        self._learner = algorithm(algo).make_learner(observation_space, action_space, settings)
        self._folder = Path(tempfile.mkdtemp(prefix="rlserve-learner-"))

    def where(self) -> dict[str, Any]:
        """Its node's address, process id and torch device."""
        import ray

        return {
            "node": ray.util.get_node_ip_address(),
            "pid": os.getpid(),
            "device": str(getattr(self._learner, "device", "cpu")),
        }

    def state(self) -> dict[str, Any]:
        """What the driver asks between calls: version, buffered and owed steps, readiness."""
        learner = self._learner
        return {
            "version": learner.version,
            "buffered_steps": learner.buffered_steps,
            "owed_steps": learner.owed_steps,
            "sample_steps": learner.sample_steps,
            "ready": learner.ready(),
            "counters": learner.counters(),
        }

    def ingest(self, fragments: list[Fragment]) -> dict[str, Any]:
        """Take ``fragments`` in; the new state."""
        self._learner.ingest(fragments)
        return self.state()

    def update(self) -> tuple[dict[str, float], dict[str, Any]]:
        """One update: its metrics and the new state."""
        return self._learner.update(), self.state()

    def weights(self) -> WeightsPackage:
        """The current weights."""
        return self._learner.weights()

    def continue_versions_from(self, version: int) -> dict[str, Any]:
        """Number later weights after ``version``; the new state."""
        self._learner.continue_versions_from(version)
        return self.state()

    def save(self, extra: dict[str, Any]) -> bytes:
        """A checkpoint's bytes (what ``Learner.save`` writes)."""
        path = self._folder / _FILE
        self._learner.save(path, extra)
        return path.read_bytes()

    def load(self, data: bytes) -> tuple[dict[str, Any], dict[str, Any]]:
        """Restore from a checkpoint's bytes: its ``extra`` and the new state."""
        path = self._folder / _FILE
        path.write_bytes(data)
        return self._learner.load(path), self.state()

    def initialise_from(self, data: bytes) -> dict[str, Any]:
        """Take the weights of a checkpoint's bytes; the new state."""
        path = self._folder / _FILE
        path.write_bytes(data)
        self._learner.initialise_from(path)
        return self.state()

    def close(self) -> None:
        """Remove its scratch folder."""
        shutil.rmtree(self._folder, ignore_errors=True)


class RemoteLearner(Learner):
    """A :class:`Learner` whose learning happens in a :class:`LearnerHost` actor.

    Attributes:
        node: The address of the actor's node.
        device: The torch device it learns on there.
    """

    def __init__(self, ray: Any, actor: Any, where: dict[str, Any], state: dict[str, Any]):
        self._ray = ray
        self._actor = actor
        self._state = state
        self._weights: WeightsPackage | None = None
        self.node = str(where["node"])
        self.device = str(where["device"])

    def _call(self, method: str, *args: Any) -> Any:
        try:
            return self._ray.get(getattr(self._actor, method).remote(*args))
        except self._ray.exceptions.RayActorError as exc:
            raise RuntimeError(
                f"the learner actor on {self.node} died during {method}: {actor_failure(exc)}; "
                "its state since the last checkpoint is lost: restore that checkpoint "
                "(Algorithm.from_checkpoint) and train on"
            ) from None

    @property
    def version(self) -> int:
        """Version of the current weights."""
        return int(self._state["version"])

    def continue_versions_from(self, version: int) -> None:
        """Number later weights after ``version`` if it is ahead."""
        self._state = self._call("continue_versions_from", version)

    def ingest(self, fragments: list[Fragment]) -> None:
        """Send ``fragments`` to the actor's learner."""
        self._state = self._call("ingest", fragments)

    @property
    def buffered_steps(self) -> int:
        """Steps taken in but not yet trained on."""
        return int(self._state["buffered_steps"])

    @property
    def owed_steps(self) -> int:
        """Env steps whose scheduled training is still to do."""
        return int(self._state["owed_steps"])

    @property
    def sample_steps(self) -> int:
        """Env steps a synchronous sampler collects between two looks at :meth:`ready`."""
        return int(self._state["sample_steps"])

    def ready(self) -> bool:
        """Whether the actor's learner has a batch for :meth:`update`."""
        return bool(self._state["ready"])

    def update(self) -> dict[str, float]:
        """One update in the actor; its metrics."""
        metrics, self._state = self._call("update")
        return dict(metrics)

    def weights(self) -> WeightsPackage:
        """The current weights, fetched once per version."""
        if self._weights is None or self._weights.version != self.version:
            self._weights = self._call("weights")
        assert self._weights is not None
        return self._weights

    def counters(self) -> dict[str, int]:
        """The actor's learner's counters and version."""
        return dict(self._state["counters"])

    def save(self, path: Path, extra: dict[str, Any]) -> None:
        """Write the actor's checkpoint to ``path`` here."""
        atomic_write_bytes(path, self._call("save", extra))

    def load(self, path: Path) -> dict[str, Any]:
        """Restore the actor's learner from the checkpoint at ``path``; its ``extra``."""
        extra, self._state = self._call("load", Path(path).read_bytes())
        return dict(extra)

    def initialise_from(self, path: Path) -> None:
        """Take the weights of the checkpoint at ``path``."""
        self._state = self._call("initialise_from", Path(path).read_bytes())

    def close(self) -> None:
        """End the actor (idempotent)."""
        actor, self._actor = self._actor, None
        if actor is None:
            return
        with contextlib.suppress(Exception):
            self._ray.get(actor.close.remote(), timeout=5.0)
        with contextlib.suppress(Exception):
            self._ray.kill(actor, no_restart=True)


def learner_actor(
    algo: str,
    observation_space: Any,
    action_space: Any,
    settings: Any,
    *,
    num_cpus: float = 1.0,
    num_gpus: float = 0.0,
    resources: Mapping[str, float] | None = None,
) -> RemoteLearner:
    """Start one policy's learner as an actor where the resources are; its proxy.

    Raises:
        ConfigError: Ray is not installed, or no node has the resources (before starting).
        RuntimeError: The actor could not be placed or could not build its learner.
    """
    ray = import_ray("num_gpus_per_learner")
    wanted = dict(resources or {})
    check_resources(ray, {"CPU": num_cpus, "GPU": num_gpus, **wanted}, "learner")
    options: dict[str, Any] = {"num_cpus": num_cpus, "num_gpus": num_gpus}
    if wanted:
        options["resources"] = wanted
    actor_cls = ray.remote(max_restarts=0)(LearnerHost)
    actor = actor_cls.options(**options).remote(algo, observation_space, action_space, settings)
    try:
        where, state = ray.get(
            [actor.where.remote(), actor.state.remote()], timeout=START_TIMEOUT_S
        )
    except Exception as exc:
        with contextlib.suppress(Exception):
            ray.kill(actor, no_restart=True)
        raise RuntimeError(
            f"the learner actor could not start within {START_TIMEOUT_S:g} s: "
            f"{actor_failure(exc)}; check that the node with the resources is up and can "
            "import rlserve and torch"
        ) from None
    return RemoteLearner(ray, actor, where, state)
