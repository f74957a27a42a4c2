"""Where the Algorithm's parts run on a Ray cluster: ``.learners(...)`` and its resources.

With the Ray backend (``env_runners(backend="ray")``, or ``ray.init`` called first) and
``num_learners=1``, ``num_gpus_per_learner > 0`` or ``custom_resources_per_learner``, each
policy's learner is a Ray actor placed by those resources
(:class:`~rlserve.cluster.learner.RemoteLearner`); otherwise it is in this process, as
without Ray (``num_gpus_per_learner`` then changes nothing: ``device="auto"`` already takes
the GPU of this machine when torch finds one).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

from rlserve.algorithm.builder_arguments import builder
from rlserve.errors import ConfigError
from rlserve.learners.registry import algorithm

if TYPE_CHECKING:
    from rlserve.algorithm.config import AlgorithmConfig
    from rlserve.learners.base import Learner
    from rlserve.server.policies import PolicySpec

__all__ = [
    "LearnersConfig",
    "amount",
    "close_learners",
    "learner_restarts",
    "make_learners",
    "resource_map",
]

_Config = TypeVar("_Config", bound="LearnersConfig")


def amount(value: Any, name: str) -> float:
    """``value`` as an amount of a resource, checked (a number >= 0)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
        raise ConfigError(f"{name} must be a number >= 0, got {value!r}")
    return float(value)


def resource_map(value: Any, setting: str, builtin: str) -> dict[str, float]:
    """A ``custom_resources_per_*`` setting, checked: resource name -> amount >= 0.

    Args:
        value: The setting's value.
        setting: Its name, for the message.
        builtin: The settings that ask for CPUs and GPUs instead, for the message.
    """
    if not isinstance(value, dict) or not all(
        isinstance(name, str) and isinstance(n, (int, float)) and not isinstance(n, bool) and n >= 0
        for name, n in value.items()
    ):
        raise ConfigError(
            f"{setting} must map resource names to amounts >= 0, e.g. {{'sim': 1}}, got {value!r}"
        )
    if "CPU" in value or "GPU" in value:
        raise ConfigError(f"{setting} takes custom resources only: ask for CPUs with {builtin}")
    return {name: float(n) for name, n in value.items()}


class LearnersConfig:
    """The learners part of :class:`~rlserve.algorithm.config.AlgorithmConfig`."""

    # Set and documented in AlgorithmConfig.__init__.
    num_learners: int
    num_cpus_per_learner: float
    num_gpus_per_learner: float
    custom_resources_per_learner: dict[str, float]

    @builder
    def learners(
        self: _Config,
        *,
        num_learners: int | None = None,
        num_cpus_per_learner: float | None = None,
        num_gpus_per_learner: float | None = None,
        custom_resources_per_learner: dict[str, float] | None = None,
    ) -> _Config:
        """Where the learners run (RLlib's names); with Ray only (see the module doc).

        Args:
            num_learners: 0 (the default): each policy's learner in this process; 1: a Ray
                actor per policy. One learner per policy: more are refused.
            num_cpus_per_learner: CPUs each learner actor holds (default 1).
            num_gpus_per_learner: GPUs each learner actor holds (default 0); more than 0 puts
                the learner in an actor on a node that has them.
            custom_resources_per_learner: Custom resources each learner actor holds, e.g.
                ``{"trainer": 1}`` for a node started with ``--resources``; given, the
                learner is an actor.
        """
        if num_learners is not None:
            if num_learners not in (0, 1) or isinstance(num_learners, bool):
                raise ConfigError(
                    f"num_learners must be 0 (in this process) or 1 (a Ray actor per policy), "
                    f"got {num_learners!r}: rlserve trains each policy with one learner"
                )
            self.num_learners = num_learners
        if num_cpus_per_learner is not None:
            self.num_cpus_per_learner = amount(num_cpus_per_learner, "num_cpus_per_learner")
        if num_gpus_per_learner is not None:
            self.num_gpus_per_learner = amount(num_gpus_per_learner, "num_gpus_per_learner")
        if custom_resources_per_learner is not None:
            self.custom_resources_per_learner = resource_map(
                custom_resources_per_learner,
                "custom_resources_per_learner",
                "num_cpus_per_learner and GPUs with num_gpus_per_learner",
            )
        return self


def learner_actors(config: AlgorithmConfig) -> bool:
    """Whether the learners of ``config`` run as Ray actors (see the module doc)."""
    from rlserve.cluster import use_ray

    asked = bool(
        config.num_learners
        or config.num_gpus_per_learner > 0
        or config.custom_resources_per_learner
    )
    return asked and use_ray(config.env_runner_backend)


def make_learners(
    config: AlgorithmConfig, specs: dict[str, PolicySpec], algorithms: dict[str, str]
) -> dict[str, Learner]:
    """Each policy's fresh learner, by id: in this process, or an actor (see the module doc).

    Raises:
        ConfigError: Learner actors asked for on a cluster no node of which has the resources.
    """
    settings = {
        pid: config.policy_settings(algorithms[pid], {**spec.config, "seed": config.seed + index})
        for index, (pid, spec) in enumerate(specs.items())
    }
    if not learner_actors(config):
        return {
            pid: algorithm(algorithms[pid]).make_learner(
                spec.observation_space, spec.action_space, settings[pid]
            )
            for pid, spec in specs.items()
        }
    from rlserve.cluster.learner import learner_actor

    made: dict[str, Learner] = {}
    try:
        for pid, spec in specs.items():
            made[pid] = learner_actor(
                algorithms[pid],
                spec.observation_space,
                spec.action_space,
                settings[pid],
                num_cpus=config.num_cpus_per_learner,
                num_gpus=config.num_gpus_per_learner,
                resources=config.custom_resources_per_learner,
            )
    except BaseException:
        close_learners(made)
        raise
    return made


def close_learners(learners: dict[str, Learner]) -> None:
    """End the learner actors among ``learners`` (those in this process need nothing)."""
    if not any(type(learner).__name__ == "RemoteLearner" for learner in learners.values()):
        return  # never imports the cluster package without actors
    from rlserve.cluster.learner import RemoteLearner

    for learner in learners.values():
        if isinstance(learner, RemoteLearner):
            learner.close()


def learner_restarts(learners: dict[str, Learner]) -> int:
    """Dead learner actors replaced among ``learners`` since they were made (0 in process)."""
    return sum(int(getattr(learner, "restarts", 0)) for learner in learners.values())
