"""``AlgorithmConfig.env_runners(...)``: how experience is sampled from hosted environments.

A mixin of :class:`~rlserve.algorithm.config.AlgorithmConfig` (its own module because the
sampling settings are many, and each is checked at once). The runners these settings make are
:mod:`rlserve.algorithm.runner_group`'s.
"""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Callable
from typing import Any, TypeVar

from rlserve.algorithm.builder_arguments import builder
from rlserve.algorithm.placement import amount, resource_map
from rlserve.algorithm.training_settings import observation_filter as filter_setting
from rlserve.errors import ConfigError

_Config = TypeVar("_Config", bound="EnvRunnersConfig")


class EnvRunnersConfig:
    """The sampling part of :class:`~rlserve.algorithm.config.AlgorithmConfig`."""

    # Set and documented in AlgorithmConfig.__init__.
    num_env_runners: int
    num_envs_per_env_runner: int
    remote_worker_envs: bool
    envs_per_process: int
    step_timeout_s: float
    env_runner_backend: str | None
    num_cpus_per_env_runner: float
    custom_resources_per_env_runner: dict[str, float]
    num_cpus_per_remote_env: float
    custom_resources_per_remote_env: dict[str, float]
    rollout_fragment_length: int
    training_settings: dict[str, Any]

    algo_settings: Callable[..., Any]  # AlgorithmConfig's

    @builder
    def env_runners(
        self: _Config,
        *,
        num_env_runners: int | None = None,
        num_envs_per_env_runner: int | None = None,
        remote_worker_envs: bool | None = None,
        envs_per_process: int | None = None,
        rollout_fragment_length: int | None = None,
        sample_timeout_s: float | None = None,
        observation_filter: str | None = None,
        backend: str | None = None,
        num_cpus_per_env_runner: float | None = None,
        custom_resources_per_env_runner: dict[str, float] | None = None,
        num_cpus_per_remote_env: float | None = None,
        custom_resources_per_remote_env: dict[str, float] | None = None,
    ) -> _Config:
        """How experience is sampled.

        Args:
            num_env_runners: Env runners (processes, or Ray actors: ``backend``) that sample in
                parallel, each with its own copies of the environment and numpy policy copies
                (see :mod:`rlserve.algorithm.runner_group`). 0 (the default) samples in this
                process; with N >= 1 this process only learns, and each ``train()`` round
                each runner samples ``train_batch_size / N`` steps.
            num_envs_per_env_runner: Copies of the environment per runner, acted on in one
                forward pass.
            remote_worker_envs: Step the copies in sub-processes, in parallel (for slow
                environments; single-agent, multi-agent and PettingZoo envs); a copy that
                crashes or hangs is restarted.
            envs_per_process: Copies per sub-process when ``remote_worker_envs``.
            rollout_fragment_length: Steps of an episode per fragment.
            sample_timeout_s: Seconds a sub-process copy (or an env runner) may take for one
                step before it is counted as hung and restarted.
            observation_filter: RLlib's name for observation normalisation: ``"MeanStdFilter"``
                sets the algorithm's ``normalize_observations`` (running statistics kept by
                the learner and shipped with each weights version), ``"NoFilter"`` clears it;
                unset, the algorithm's default (PPO: on for unbounded Box observations).
            backend: Where the env runners run: ``"process"`` (forked processes on this
                machine), ``"ray"`` (Ray actors anywhere in the cluster ``ray.init``
                connected to; ``pip install -e '.[ray]'``) or ``"auto"`` (the default: Ray
                when this process has called ``ray.init``, else processes).
            num_cpus_per_env_runner: CPUs each Ray env-runner actor holds (default 1).
            custom_resources_per_env_runner: Custom resources each Ray env-runner actor holds,
                e.g. ``{"sim": 1}`` to run only on nodes started with ``--resources``.
            num_cpus_per_remote_env: With Ray and ``remote_worker_envs``: CPUs each
                sub-environment actor (``envs_per_process`` copies) holds (default 1).
            custom_resources_per_remote_env: Custom resources each sub-environment actor holds.
        """
        if observation_filter is not None:
            self._observation_filter(observation_filter)
        if backend is not None:
            if backend not in ("ray", "process", "auto"):
                raise ConfigError(f"backend must be 'ray', 'process' or 'auto', got {backend!r}")
            if backend == "ray":
                from rlserve.cluster import import_ray

                import_ray()
            self.env_runner_backend = None if backend == "auto" else backend
        if num_cpus_per_env_runner is not None:
            self.num_cpus_per_env_runner = amount(
                num_cpus_per_env_runner, "num_cpus_per_env_runner"
            )
        if custom_resources_per_env_runner is not None:
            self.custom_resources_per_env_runner = resource_map(
                custom_resources_per_env_runner,
                "custom_resources_per_env_runner",
                "num_cpus_per_env_runner",
            )
        if num_cpus_per_remote_env is not None:
            self.num_cpus_per_remote_env = amount(
                num_cpus_per_remote_env, "num_cpus_per_remote_env"
            )
        if custom_resources_per_remote_env is not None:
            self.custom_resources_per_remote_env = resource_map(
                custom_resources_per_remote_env,
                "custom_resources_per_remote_env",
                "num_cpus_per_remote_env",
            )
        for name, value in (
            ("num_env_runners", num_env_runners),
            ("num_envs_per_env_runner", num_envs_per_env_runner),
            ("envs_per_process", envs_per_process),
            ("rollout_fragment_length", rollout_fragment_length),
        ):
            if value is not None:
                minimum = 0 if name == "num_env_runners" else 1
                if not isinstance(value, int) or value < minimum:
                    raise ConfigError(f"{name} must be an int >= {minimum}, got {value!r}")
                setattr(self, name, value)
        if (
            self.num_env_runners
            and self.env_runner_backend != "ray"
            and "fork" not in mp.get_all_start_methods()
        ):
            requested, self.num_env_runners = self.num_env_runners, 0
            raise ConfigError(
                f"num_env_runners={requested}: env-runner processes need the 'fork' start "
                "method, which this platform lacks; sample in this process "
                "(num_env_runners=0) with remote_worker_envs=True instead"
            )
        if remote_worker_envs is not None:
            self.remote_worker_envs = bool(remote_worker_envs)
        if sample_timeout_s is not None:
            if isinstance(sample_timeout_s, bool) or not isinstance(sample_timeout_s, (int, float)):
                raise ConfigError(f"sample_timeout_s must be seconds, got {sample_timeout_s!r}")
            if not sample_timeout_s > 0:
                raise ConfigError(f"sample_timeout_s must be positive, got {sample_timeout_s}")
            self.step_timeout_s = float(sample_timeout_s)
        return self

    def _observation_filter(self, value: Any) -> None:
        self.training_settings["normalize_observations"] = filter_setting(value)
        self.algo_settings()
