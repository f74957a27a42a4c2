"""The Algorithm API's settings, built by chaining: ``PPOConfig().environment(...).build()``.

Each algorithm has its config class (``PPOConfig``, ``DQNConfig``, ``SACConfig``), which only
names the algorithm (:attr:`AlgorithmConfig.algo_name`); the settings ``training()`` takes are
that algorithm's settings dataclass in :mod:`rlserve.learners.registry`, plus RLlib's names
for them; :mod:`~rlserve.algorithm.training_settings` translates those and holds the defaults a
hosted environment starts from (:data:`HOSTED_DEFAULTS`), and
:mod:`~rlserve.algorithm.policy_entries` holds ``multi_agent()`` and reads a policy's entry.

It keeps RLlib's method and setting names where they fit, so an RLlib script needs only its
imports changed. Each method returns the config itself (chaining) and checks its arguments at
once, naming the fix. Importable without torch; :meth:`AlgorithmConfig.build` imports the
learner.

This module never imports the Algorithm it builds (every part of the Algorithm reads its
config, so that would be a circle): the package's ``__init__`` installs the function that
makes one (:func:`install_assembler`), and :meth:`AlgorithmConfig.build` calls it.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlserve.algorithm.builder_arguments import builder
from rlserve.algorithm.callbacks import CallbacksConfig
from rlserve.algorithm.env_runners_config import EnvRunnersConfig
from rlserve.algorithm.placement import LearnersConfig
from rlserve.algorithm.policy_entries import MultiAgentConfig
from rlserve.algorithm.rllib_compat import RLlibCompatConfig
from rlserve.algorithm.training_settings import (
    HOSTED_DEFAULTS,
    settings_fields,
)
from rlserve.errors import ConfigError
from rlserve.learners.registry import algorithm
from rlserve.learners.setting_checks import whole_number

if TYPE_CHECKING:
    from rlserve.algorithm.algorithm import Algorithm

Assembler = Callable[["AlgorithmConfig", "Path | None"], "Algorithm"]
"""Makes the Algorithm of a config, resuming a run folder when given one."""

_assembler: Assembler | None = None


def install_assembler(assembler: Assembler) -> None:
    """Name the function :meth:`AlgorithmConfig.build` makes its Algorithm with.

    ``rlserve.algorithm``'s ``__init__`` installs it, and Python runs that before any module
    of the package, so a config is never without one.
    """
    global _assembler
    _assembler = assembler


def assemble(config: AlgorithmConfig, resume: Path | None = None) -> Algorithm:
    """The Algorithm of ``config`` (used as it is: copy it first), resuming ``resume``."""
    if _assembler is None:  # only if this module was loaded outside its package
        raise RuntimeError("import rlserve.algorithm before building an Algorithm")
    return _assembler(config, resume)


def _whole(value: Any, least: int) -> bool:
    """Whether ``value`` is a whole number (a numpy int, 4000.0; not a bool) of ``least`` up."""
    number = whole_number(value)
    return number is not None and number >= least


class AlgorithmConfig(
    EnvRunnersConfig, MultiAgentConfig, CallbacksConfig, LearnersConfig, RLlibCompatConfig
):
    """Settings of an :class:`~rlserve.algorithm.Algorithm`, built by chained method calls."""

    algo_name = "ppo"

    def __init__(self) -> None:
        self.env: Any = None
        self.env_config: dict[str, Any] = {}
        self.observation_space: Any = None
        self.action_space: Any = None
        self.num_env_runners = 0
        self.num_envs_per_env_runner = 1
        self.remote_worker_envs = False
        self.envs_per_process = 1
        self.step_timeout_s = 60.0
        self.env_runner_backend: str | None = None
        """``"ray"``, ``"process"``, or None: Ray when ``ray.is_initialized()``, else processes."""
        self.num_cpus_per_env_runner: float = 1.0
        self.custom_resources_per_env_runner: dict[str, float] = {}
        self.num_cpus_per_remote_env: float = 1.0
        self.custom_resources_per_remote_env: dict[str, float] = {}
        self.num_learners = 0
        self.num_cpus_per_learner: float = 1.0
        self.num_gpus_per_learner: float = 0.0
        self.custom_resources_per_learner: dict[str, float] = {}
        self.rollout_fragment_length = 200
        self.min_env_steps_per_iteration = 4000
        self.training_settings: dict[str, Any] = {}
        """The algorithm's settings given (``training()``); :meth:`algo_settings` adds the
        defaults."""
        self.seed = 0
        self.device = "auto"
        self.evaluation_duration = 10
        self.evaluation_interval: int | None = None
        """Iterations between evaluations that ``train()`` runs itself (None: only
        :meth:`Algorithm.evaluate`)."""
        self.policies: dict[str, dict[str, Any]] | None = None
        """Each policy's settings overrides (of its algorithm's settings), by id."""
        self.policy_algorithms: dict[str, str] = {}
        """The policies that name their own algorithm (``"algo"``): id -> algorithm name."""
        self.algorithm_settings: dict[str, dict[str, Any]] = {}
        """The settings of every policy of another algorithm than :attr:`algo_name` (the top
        ``[dqn]`` table of a config file), by algorithm name."""
        self.policy_specs: dict[str, Any] = {}
        """Policies declared with their spaces (``PolicySpec`` or RLlib's 4-tuples), by id."""
        self.policy_mapping: list[tuple[str, str]] = []
        self.policy_mapping_fn: Any = None
        self.policies_to_train: frozenset[str] | None = None
        """The policies that learn (None: all); the others are frozen."""
        self.serving_settings: dict[str, Any] | None = None
        self.run_dir: str | None = None
        self.run_name: str | None = None
        self.progress = False
        self.checkpoint_every: int | None = None
        self.keep_checkpoints = 3
        self.callbacks_class: list[Any] = []
        self.callbacks_fail_fast = False

    # -- builders ----------------------------------------------------------------------------

    @builder
    def environment(
        self,
        env: Any = None,
        *,
        env_config: dict[str, Any] | None = None,
        observation_space: Any = None,
        action_space: Any = None,
        disable_env_checking: bool | None = None,
    ) -> AlgorithmConfig:
        """The environment: a ``gymnasium.Env``, a registered id, a class or a creator.

        A class or creator is called with ``env_config`` (RLlib's convention). Multi-agent
        envs, PettingZoo envs, ``ExternalEnv`` subclasses and ``EnvSource`` subclasses are
        accepted too. Without an environment (``env=None``, as RLlib's policy-server example
        has it), give the policy's ``observation_space`` and ``action_space`` and attach a
        server with :meth:`serving`: its network clients are then the only source.

        ``disable_env_checking`` is RLlib's: rlserve does not check an environment when it
        builds (``rlserve check-env`` does, on demand), so it has no effect.
        """
        if env is not None:
            self.env = env
        for name, space in (
            ("observation_space", observation_space),
            ("action_space", action_space),
        ):
            if space is not None:
                if not hasattr(space, "contains") or not hasattr(space, "shape"):
                    raise ConfigError(
                        f"{name} must be a gymnasium space (e.g. gymnasium.spaces.Box), got "
                        f"{type(space).__name__}"
                    )
                setattr(self, name, space)
        if env_config is not None:
            if not isinstance(env_config, dict):
                raise ConfigError(f"env_config must be a dict, got {type(env_config).__name__}")
            self.env_config = dict(env_config)
        return self

    @builder
    def training(self, **settings: Any) -> AlgorithmConfig:
        """The algorithm's settings (checked at once).

        Any field of the algorithm's settings dataclass (:class:`~rlserve.learners.
        ppo_config.PPOSettings` for PPO, :class:`~rlserve.learners.dqn_config.DQNSettings`
        for DQN, :class:`~rlserve.learners.sac_config.SACSettings` for SAC), RLlib's names for
        them (:data:`~rlserve.algorithm.training_settings.RLLIB_NAMES`: for PPO ``lambda_``,
        ``num_sgd_iter``, ``sgd_minibatch_size``, ``clip_param``, ``vf_loss_coeff``,
        ``entropy_coeff``, ``grad_clip``, ``kl_target``; for SAC also ``actor_lr`` and
        ``alpha_lr`` with one value (``lr``), ``critic_lr``, ``twin_q=True``,
        ``target_entropy="auto"``; RLlib settings rlserve has no counterpart for are refused
        naming what to set instead), ``model={"fcnet_hiddens": [...], "fcnet_activation":
        "tanh", "conv_filters": [[16, 2, 1], ...]}``, ``observation_filter``
        (``"MeanStdFilter"`` or ``"NoFilter"``, as
        :meth:`env_runners` takes it) and ``min_env_steps_per_iteration``; for DQN and SAC
        also ``replay_buffer_config={"capacity": N}`` and ``store_buffer_in_checkpoints``.

        They are the settings of every policy that names no other algorithm (see
        :meth:`multi_agent`).
        """
        settings = dict(settings)
        if "min_env_steps_per_iteration" in settings:
            steps = settings.pop("min_env_steps_per_iteration")
            if not _whole(steps, 1):
                raise ConfigError(
                    f"min_env_steps_per_iteration must be a whole number of env steps, 1 or more, "
                    f"got {steps!r}"
                )
            self.min_env_steps_per_iteration = int(steps)
        self.training_settings.update(
            settings_fields(self.algo_name, settings, "training()", iteration=True)
        )
        self.algo_settings()  # checks the values now, not at build()
        return self

    @builder
    def debugging(self, *, seed: int | None = None) -> AlgorithmConfig:
        """The seed of environments, sampling and the learner."""
        if seed is not None:
            if not _whole(seed, 0):
                raise ConfigError(
                    f"debugging(): seed must be a whole number, 0 or more, got {seed!r}"
                )
            self.seed = int(seed)
        return self

    @builder
    def resources(
        self, *, device: str | None = None, num_gpus: float | None = None
    ) -> AlgorithmConfig:
        """The learner's torch device: ``auto`` (cuda when present), ``cpu`` or ``cuda[:N]``.

        ``num_gpus`` is RLlib's form: 0 is ``cpu``, more is ``cuda`` (one learner uses one
        device; several learners on Ray: :meth:`learners`).
        """
        if num_gpus is not None:
            if device is not None:
                raise ConfigError("resources(): pass device or num_gpus, not both")
            if isinstance(num_gpus, bool) or not isinstance(num_gpus, (int, float)) or num_gpus < 0:
                raise ConfigError(f"resources(): num_gpus must be 0 or more, got {num_gpus!r}")
            device = "cuda" if num_gpus > 0 else "cpu"
        if device is not None:
            self.training_settings["device"] = device
            self.algo_settings()
        return self

    @builder
    def evaluation(
        self,
        *,
        evaluation_duration: int | None = None,
        evaluation_interval: int | None = None,
        evaluation_duration_unit: str | None = None,
        evaluation_num_env_runners: int | None = None,
    ) -> AlgorithmConfig:
        """Greedy episodes (exploration off, not trained on) that measure the policy.

        Args:
            evaluation_duration: Episodes per evaluation (default 10).
            evaluation_interval: ``train()`` evaluates every this many iterations and puts
                the figures under its result's ``evaluation`` key, as RLlib does (None, the
                default: only when :meth:`Algorithm.evaluate` is called).
            evaluation_duration_unit: RLlib's unit of the duration; only ``"episodes"``.
            evaluation_num_env_runners: RLlib's evaluation workers; rlserve evaluates in this
                process on its own copy of the environment, whatever the number.
        """
        if evaluation_duration is not None:
            if not _whole(evaluation_duration, 1):
                raise ConfigError(
                    f"evaluation_duration must be a whole number of episodes, 1 or more, got "
                    f"{evaluation_duration!r}"
                )
            self.evaluation_duration = int(evaluation_duration)
        if evaluation_interval is not None:
            if not _whole(evaluation_interval, 0):
                raise ConfigError(
                    f"evaluation_interval must be a whole number of iterations (0 or None: no "
                    f"evaluation in train()), got {evaluation_interval!r}"
                )
            self.evaluation_interval = int(evaluation_interval) or None
        if evaluation_duration_unit not in (None, "episodes"):
            raise ConfigError(
                f"evaluation_duration_unit '{evaluation_duration_unit}': rlserve evaluates whole "
                "episodes; pass 'episodes' (or leave it out)"
            )
        if evaluation_num_env_runners is not None and not _whole(evaluation_num_env_runners, 0):
            raise ConfigError(
                f"evaluation_num_env_runners must be 0 or more, got {evaluation_num_env_runners!r}"
            )
        return self

    @builder
    def serving(self, **settings: Any) -> AlgorithmConfig:
        """Attach a network server: external clients become one more source of experience.

        Takes the fields of :class:`rlserve.algorithm.serving_settings.ServingSettings`: host,
        port, http_port, token, tls_cert, tls_key, max_queued_steps_per_source, idle_timeout,
        sync_reports, metrics_interval, ray_address, ray_node_ip, replicas, and ``server``
        (any other ``rlserve serve`` setting, by its name in ``[server]``).
        """
        from rlserve.algorithm.serving_settings import ServingSettings
        from rlserve.config.fields import build

        settings = {
            k: os.fspath(v) if isinstance(v, os.PathLike) else v for k, v in settings.items()
        }
        try:
            build(ServingSettings, settings, None)  # names, types and ranges: now, not at build()
        except ConfigError as exc:
            raise ConfigError(f"serving(): {exc}") from None
        self.serving_settings = dict(settings)
        return self

    @builder
    def reporting(
        self,
        *,
        run_dir: str | None = None,
        name: str | None = None,
        progress: bool | None = None,
        checkpoint_every: int | None = None,
        keep_checkpoints: int | None = None,
    ) -> AlgorithmConfig:
        """Where the run's TensorBoard metrics and checkpoints go, and the progress line.

        Without ``run_dir`` nothing is written unless :meth:`Algorithm.save` is called.
        ``checkpoint_every``: with environments, iterations between checkpoints (default 0: only
        on save and stop); network-only, learner updates between checkpoints (default 20).
        """
        if run_dir is not None:
            self.run_dir = str(run_dir)
        if name is not None:
            self.run_name = name
        if progress is not None:
            self.progress = bool(progress)
        if checkpoint_every is not None:
            if not _whole(checkpoint_every, 0):
                raise ConfigError(
                    f"reporting(): checkpoint_every must be a whole number, 0 (only on save and "
                    f"stop) or more, got {checkpoint_every!r}"
                )
            self.checkpoint_every = int(checkpoint_every)
        if keep_checkpoints is not None:
            if not _whole(keep_checkpoints, 1):
                raise ConfigError(
                    f"reporting(): keep_checkpoints must be a whole number, 1 or more, got "
                    f"{keep_checkpoints!r}"
                )
            self.keep_checkpoints = int(keep_checkpoints)
        return self

    # -- results -----------------------------------------------------------------------------

    def algo_settings(self, overrides: dict[str, Any] | None = None) -> Any:
        """The algorithm's settings these calls give (plus a policy's ``overrides``).

        An instance of the settings dataclass :attr:`algo_name` registers (``PPOSettings``
        for PPO). Hosted environments start from :data:`HOSTED_DEFAULTS` (empty for each: one
        set serves both); a network-only Algorithm from the server's defaults.
        """
        return self.policy_settings(None, overrides)

    def policy_settings(self, algo: str | None, overrides: dict[str, Any] | None = None) -> Any:
        """The settings of a policy trained by ``algo`` (None: :attr:`algo_name`).

        That algorithm's defaults (:data:`HOSTED_DEFAULTS` over its own with an environment),
        then :meth:`training`'s settings for :attr:`algo_name` or ``algorithm_settings`` of
        :meth:`multi_agent` for another algorithm (and the device of :meth:`resources`), then
        ``overrides`` (settings fields); the seed is :meth:`debugging`'s unless set.

        Raises:
            ConfigError: An unknown algorithm, or a setting's value is refused.
        """
        entry = algorithm(algo or self.algo_name)
        defaults = HOSTED_DEFAULTS.get(entry.name, {}) if self.env is not None else {}
        if entry.name == self.algo_name:
            shared = self.training_settings
        else:
            shared = dict(self.algorithm_settings.get(entry.name, {}))
            if "device" in self.training_settings:
                shared.setdefault("device", self.training_settings["device"])
        values = {**defaults, **shared, **(overrides or {})}
        values.setdefault("seed", self.seed)
        if isinstance(values.get("hidden"), list):
            values["hidden"] = tuple(values["hidden"])
        try:
            return entry.settings(**values)
        except TypeError as exc:
            raise ConfigError(f"invalid {entry.name} settings: {exc}") from exc

    def ppo_settings(self, overrides: dict[str, Any] | None = None) -> Any:
        """The old name of :meth:`algo_settings` (kept for callers of the PPO-only API)."""
        return self.algo_settings(overrides)

    def copy(self) -> AlgorithmConfig:
        """A deep copy; the environment, mapping function and callbacks objects are shared."""
        env, mapping_fn, callbacks = self.env, self.policy_mapping_fn, self.callbacks_class
        self.env = self.policy_mapping_fn = None
        self.callbacks_class = []
        try:
            twin = copy.deepcopy(self)
        finally:
            self.env, self.policy_mapping_fn, self.callbacks_class = env, mapping_fn, callbacks
        twin.env, twin.policy_mapping_fn, twin.callbacks_class = env, mapping_fn, list(callbacks)
        return twin

    def build(self) -> Algorithm:
        """Make the Algorithm: environments, learner(s), and the server when attached.

        Without an environment (spaces and ``serving(...)`` given) it is the network-only
        Algorithm of ``rlserve serve``, whose learner runs in its own process.
        """
        if self.env is None and self.serving_settings is None:
            raise ConfigError(
                "no environment: call .environment(env) (a gymnasium.Env, a registered id "
                "such as 'CartPole-v1', or a class taking an env_config dict), or attach a "
                "server with .serving(port=...) and give the spaces (.environment("
                "observation_space=..., action_space=...)) to learn from network clients"
            )
        return assemble(self.copy())

    build_algo = build


class PPOConfig(AlgorithmConfig):
    """Proximal Policy Optimisation (the learner of :mod:`rlserve.learners.ppo`)."""

    algo_name = "ppo"


class DQNConfig(AlgorithmConfig):
    """Deep Q-learning for Discrete actions (the learner of :mod:`rlserve.learners.dqn`).

    Settings: :class:`~rlserve.learners.dqn_config.DQNSettings` through :meth:`training`.
    An iteration of :meth:`Algorithm.train` samples at least 1000 env steps by default.
    """

    algo_name = "dqn"

    def __init__(self) -> None:
        super().__init__()
        self.min_env_steps_per_iteration = 1000


class SACConfig(AlgorithmConfig):
    """Soft Actor-Critic for bounded Box actions (the learner of :mod:`rlserve.learners.sac`).

    Settings: :class:`~rlserve.learners.sac_config.SACSettings` through :meth:`training`.
    An iteration of :meth:`Algorithm.train` samples at least 1000 env steps by default.
    """

    algo_name = "sac"

    def __init__(self) -> None:
        super().__init__()
        self.min_env_steps_per_iteration = 1000


CONFIG_CLASSES: dict[str, type[AlgorithmConfig]] = {
    "ppo": PPOConfig,
    "dqn": DQNConfig,
    "sac": SACConfig,
}
"""Per algorithm name, its config class (a saved config is loaded into it)."""


def config_for(name: str | None) -> AlgorithmConfig:
    """A fresh config of the algorithm called ``name`` (None: PPO, as runs before ``algo``).

    Raises:
        ConfigError: No algorithm has that name.
    """
    entry = algorithm(name)
    cls = CONFIG_CLASSES.get(entry.name)
    if cls is not None:
        return cls()
    config = AlgorithmConfig()
    config.algo_name = entry.name
    return config
