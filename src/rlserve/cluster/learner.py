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
finds no CUDA there and ``auto`` falls back to the CPU.

An actor that dies (its node lost, its process killed) is replaced: a new one is placed by the
same resources, on whichever node has them, and restored from the newest recovery point the
driver holds: the newest checkpoint this Algorithm saved or restored through it, or a snapshot
of the learner's whole state (weights, optimiser, counters) that the proxy takes after an update
at most every :data:`SNAPSHOT_EVERY_S` seconds, whichever is newer (no snapshots with
``checkpoint_replay``, whose checkpoints hold the replay buffer: only checkpoints then). Its
versions go on after the newest one the driver saw, so weights never go back; the call that
found the actor dead is sent again to the new one (an update is not: what it had buffered is
lost). Each replacement is logged once, with the cause and what was lost (the updates since the
recovery point, the steps buffered), and counted (:attr:`RemoteLearner.restarts`, the results'
``learner_restarts``). After :data:`MAX_RESTARTS` replacements in a row without one successful
call, or when no node has the resources any more, the call raises, naming the fix.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from rlserve.cluster.failures import actor_failure
from rlserve.cluster.ray_import import import_ray
from rlserve.cluster.resources import check_resources
from rlserve.learners.base import Learner
from rlserve.learners.registry import algorithm
from rlserve.policy.weights import WeightsPackage
from rlserve.processes.restarts import RestartPolicy
from rlserve.protocol.fragment import Fragment
from rlserve.run.durable import atomic_write_bytes

__all__ = ["LearnerHost", "RemoteLearner", "learner_actor"]

START_TIMEOUT_S = 120.0
"""Seconds the learner actor may take to be placed and build its learner."""

MAX_RESTARTS = 3
"""Replacements of a dead learner actor in a row, without a successful call, before giving up
(as many as an env runner's)."""

SNAPSHOT_EVERY_S = 60.0
"""Least seconds between two snapshots of the learner's state kept for a replacement."""

logger = logging.getLogger("rlserve.algorithm")

Started = tuple[Any, dict[str, Any], dict[str, Any]]
"""A started learner actor: its handle, :meth:`LearnerHost.where` and its state."""

_FILE = "learner.pt"


@contextlib.contextmanager
def _scratch() -> Iterator[Path]:
    """A checkpoint file's path, in a folder removed after use.

    ``Learner`` saves and loads paths. A folder per call, not one kept for the actor's life:
    an actor that is killed leaves nothing behind.
    """
    with tempfile.TemporaryDirectory(prefix="rlserve-learner-") as folder:
        yield Path(folder) / _FILE


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
        with _scratch() as path:
            self._learner.save(path, extra)
            return path.read_bytes()

    def load(self, data: bytes) -> tuple[dict[str, Any], dict[str, Any]]:
        """Restore from a checkpoint's bytes: its ``extra`` and the new state."""
        with _scratch() as path:
            path.write_bytes(data)
            return self._learner.load(path), self.state()

    def initialise_from(self, data: bytes) -> dict[str, Any]:
        """Take the weights of a checkpoint's bytes; the new state."""
        with _scratch() as path:
            path.write_bytes(data)
            self._learner.initialise_from(path)
        return self.state()

    def close(self) -> None:
        """Nothing to release (kept for the driver's call): each file is removed after use."""


class RemoteLearner(Learner):
    """A :class:`Learner` whose learning happens in a :class:`LearnerHost` actor.

    Args:
        ray: The ``ray`` module, initialised.
        start: Starts a new actor and awaits it (raises when it cannot).
        snapshots: Whether to keep snapshots of the learner's state for a replacement.
        max_restarts: Replacements in a row, without a successful call, before giving up.

    Attributes:
        node: The address of the actor's node.
        device: The torch device it learns on there.
        restarts: Dead actors replaced since this proxy was made.
    """

    def __init__(
        self,
        ray: Any,
        start: Callable[[], Started],
        *,
        snapshots: bool = True,
        max_restarts: int | None = MAX_RESTARTS,
    ) -> None:
        self._ray = ray
        self._start = start
        self._actor, where, self._state = start()
        self._weights: WeightsPackage | None = None
        self._snapshots = snapshots
        self._snapshot_at = -float("inf")
        self._recovery: tuple[str, bytes] | None = None
        """What a replacement is restored from: what it is, and a checkpoint's bytes."""
        self._policy = RestartPolicy(max_restarts)
        self.restarts = 0
        self.node = str(where["node"])
        self.device = str(where["device"])

    def _call(self, method: str, *args: Any, again: bool = True) -> Any:
        """The actor's answer to ``method(*args)``; a dead actor is replaced first.

        With ``again`` False the call is not sent to the replacement: the answer is then None.
        """
        while True:
            try:
                answer = self._ray.get(getattr(self._actor, method).remote(*args))
            except self._ray.exceptions.RayActorError as exc:
                self._replace(method, exc)
                if not again:
                    return None
                continue
            self._policy.succeeded()
            return answer

    def _replace(self, during: str, exc: BaseException) -> None:
        """Start a new actor in place of the dead one and restore it (see the module doc).

        Raises:
            RuntimeError: Given up (too many in a row), or no new actor could start.
        """
        cause = f"the learner actor on {self.node} died during {during}: {actor_failure(exc)}"
        last, buffered = self.version, self.buffered_steps
        while True:
            if self._policy.failed():
                raise RuntimeError(
                    f"{cause}; given up after {self._policy.in_a_row()} deaths in a row without "
                    "a successful call: check the nodes with the learner's resources, then "
                    "restore the newest checkpoint (Algorithm.from_checkpoint) and train on"
                )
            self._policy.restarting()
            self._kill()
            try:
                self._actor, where, self._state = self._start()
                if self._recovery is not None:
                    _, self._state = self._ray.get(self._actor.load.remote(self._recovery[1]))
                # The replacement's weights are a version of their own: never one seen before.
                self._state = self._ray.get(self._actor.continue_versions_from.remote(last + 1))
            except self._ray.exceptions.RayActorError as again:
                cause = f"its replacement died while starting: {actor_failure(again)}"
                continue
            except Exception as error:
                raise RuntimeError(
                    f"{cause}, and no new learner actor could start: {error}"
                ) from None
            break
        self.restarts += 1
        self._weights = None
        self.node, self.device = str(where["node"]), str(where["device"])
        if self._recovery is None:
            restored = "started afresh (no checkpoint or snapshot yet): lost what it had learned"
        else:
            restored = f"restored from {self._recovery[0]}: lost its updates since then"
        logger.warning(
            "rlserve: %s; replaced by a new one on %s (learner restart %d), %s, and %d buffered "
            "steps; its weights go on from version %d",
            cause,
            self.node,
            self.restarts,
            restored,
            buffered,
            self.version,
        )

    def _kill(self) -> None:
        if self._actor is not None:
            with contextlib.suppress(Exception):
                self._ray.kill(self._actor, no_restart=True)

    def _snapshot(self) -> None:
        """Keep the learner's whole state for a replacement, at most every SNAPSHOT_EVERY_S."""
        now = time.monotonic()
        if not self._snapshots or now - self._snapshot_at < SNAPSHOT_EVERY_S:
            return
        data = self._call("save", {}, again=False)
        if data is not None:
            self._snapshot_at = now
            self._recovery = (f"a snapshot at version {self.version}", data)

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
        """One update in the actor; its metrics (none when the actor died during it)."""
        answer = self._call("update", again=False)
        if answer is None:
            return {}
        metrics, self._state = answer
        self._snapshot()
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
        """Write the actor's checkpoint to ``path`` here (and keep it for a replacement)."""
        data = self._call("save", extra)
        atomic_write_bytes(path, data)
        self._keep(f"the checkpoint {path} (version {self.version})", data)

    def load(self, path: Path) -> dict[str, Any]:
        """Restore the actor's learner from the checkpoint at ``path``; its ``extra``."""
        data = Path(path).read_bytes()
        extra, self._state = self._call("load", data)
        self._keep(f"the checkpoint {path} (version {self.version})", data)
        return dict(extra)

    def _keep(self, what: str, data: bytes) -> None:
        """``data`` is now what a replacement is restored from (the newest state saved)."""
        self._recovery = (what, data)
        self._snapshot_at = time.monotonic()

    def initialise_from(self, path: Path) -> None:
        """Take the weights of the checkpoint at ``path``."""
        self._state = self._call("initialise_from", Path(path).read_bytes())

    def close(self) -> None:
        """End the actor (idempotent)."""
        actor = self._actor
        if actor is None:
            return
        with contextlib.suppress(Exception):
            self._ray.get(actor.close.remote(), timeout=5.0)
        self._kill()
        self._actor = None


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
    options: dict[str, Any] = {"num_cpus": num_cpus, "num_gpus": num_gpus}
    if wanted:
        options["resources"] = wanted
    actor_cls = ray.remote(max_restarts=0)(LearnerHost)

    def start() -> Started:
        # Asked again at each replacement: a lost node's resources are gone from the cluster.
        check_resources(ray, {"CPU": num_cpus, "GPU": num_gpus, **wanted}, "learner")
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
        return actor, where, state

    # A checkpoint holding the replay buffer is too big to snapshot as we go.
    snapshots = not bool(getattr(settings, "checkpoint_replay", False))
    return RemoteLearner(ray, start, snapshots=snapshots, max_restarts=MAX_RESTARTS)
