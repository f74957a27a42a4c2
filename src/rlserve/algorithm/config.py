"""The Algorithm API's settings, built by chaining: ``PPOConfig().environment(...).build()``.

Each algorithm has its config class (``PPOConfig``, ``DQNConfig``, ``SACConfig``), which only
names the algorithm (:attr:`AlgorithmConfig.algo_name`); the settings ``training()`` takes are
that algorithm's settings dataclass in :mod:`rlserve.learners.registry`, plus RLlib's names
for them (:data:`RLLIB_NAMES`), and a hosted environment starts from :data:`HOSTED_DEFAULTS`.

It keeps RLlib's method and setting names where they fit, so an RLlib script needs only its
imports changed. Each method returns the config itself (chaining) and checks its arguments at
once, naming the fix. Importable without torch; :meth:`AlgorithmConfig.build` imports the
learner.
"""

from __future__ import annotations

import copy
import dataclasses
import multiprocessing as mp
from typing import TYPE_CHECKING, Any

from rlserve.errors import ConfigError
from rlserve.learners.registry import algorithm

if TYPE_CHECKING:
    from rlserve.algorithm.algorithm import Algorithm

RLLIB_TRAINING_NAMES = {
    "lambda_": "gae_lambda",
    "lambda": "gae_lambda",
    "sgd_minibatch_size": "minibatch_size",
    "num_sgd_iter": "num_epochs",
    "clip_param": "clip_coef",
    "vf_loss_coeff": "vf_coef",
    "entropy_coeff": "ent_coef",
    "grad_clip": "max_grad_norm",
    "kl_target": "target_kl",
}
"""RLlib's names for PPO settings -> rlserve's :class:`PPOSettings` fields."""

RLLIB_DQN_NAMES = {
    "train_batch_size": "batch_size",
    "num_steps_sampled_before_learning_starts": "learning_starts",
    "target_network_update_freq": "target_update_interval",
    "grad_clip": "max_grad_norm",
    "store_buffer_in_checkpoints": "checkpoint_replay",
}
"""RLlib's names for DQN settings -> rlserve's :class:`DQNSettings` fields (plus
``replay_buffer_config={"capacity": N}`` for ``buffer_size``)."""

RLLIB_SAC_NAMES = {
    "train_batch_size": "batch_size",
    "num_steps_sampled_before_learning_starts": "learning_starts",
    "store_buffer_in_checkpoints": "checkpoint_replay",
}
"""RLlib's names for SAC settings -> rlserve's :class:`SACSettings` fields (plus
``replay_buffer_config={"capacity": N}`` for ``buffer_size``; ``tau``, ``initial_alpha``,
``target_entropy`` (``"auto"``: unset), ``n_step``, ``gamma`` and ``lr`` have the same names;
``actor_lr``, ``critic_lr`` and ``alpha_lr`` all with one value are ``lr``, and ``twin_q=True``
is what rlserve does anyway)."""

RLLIB_SAC_REFUSED: dict[str, str] = {
    "training_intensity": (
        "is not supported; rlserve's SAC sets the gradient steps per env step, "
        "updates_per_step (RLlib's training_intensity / train_batch_size)"
    ),
    "target_network_update_freq": (
        "is not supported; rlserve's SAC moves its target critics by tau after every "
        "gradient step (set tau)"
    ),
    "grad_clip": "is not supported: rlserve's SAC does not clip gradients; drop it",
    "optimization_config": (
        "is not supported; rlserve's SAC has one learning rate for the actor, the critics and "
        "the temperature: lr"
    ),
    "q_model_config": (
        "is not supported; actor and critics share hidden and activation (or "
        'model={"fcnet_hiddens": [...], "fcnet_activation": ...})'
    ),
    "policy_model_config": (
        "is not supported; actor and critics share hidden and activation (or "
        'model={"fcnet_hiddens": [...], "fcnet_activation": ...})'
    ),
    "_deterministic_loss": "is not supported",
    "_use_beta_distribution": (
        "is not supported: rlserve's SAC acts with a tanh-squashed Gaussian"
    ),
}
"""RLlib's SAC settings that have no rlserve counterpart, with what to do instead."""

SAC_LEARNING_RATES = ("actor_lr", "critic_lr", "alpha_lr")
"""RLlib's three SAC learning rates; rlserve's SAC has one, ``lr``."""

OBSERVATION_FILTERS = {"MeanStdFilter": True, "NoFilter": False}
"""RLlib's ``observation_filter`` values -> the algorithm's ``normalize_observations``."""


def observation_filter(value: Any) -> bool:
    """RLlib's ``observation_filter`` as ``normalize_observations``.

    Raises:
        ConfigError: Not one of :data:`OBSERVATION_FILTERS`.
    """
    if value not in OBSERVATION_FILTERS:
        raise ConfigError(
            f"observation_filter must be one of {', '.join(OBSERVATION_FILTERS)}, got {value!r}"
        )
    return OBSERVATION_FILTERS[value]


RLLIB_NAMES: dict[str, dict[str, str]] = {
    "ppo": RLLIB_TRAINING_NAMES,
    "dqn": RLLIB_DQN_NAMES,
    "sac": RLLIB_SAC_NAMES,
}
"""Per algorithm, RLlib's names for its settings -> the settings dataclass's fields."""

HOSTED_PPO_DEFAULTS: dict[str, Any] = {
    "train_batch_size": 512,
    "minibatch_size": 128,
    "num_epochs": 10,
    "lr": 1e-3,
    "gamma": 0.98,
    "gae_lambda": 0.8,
    "clip_coef": 0.2,
    "max_policy_lag": 1,
}
"""PPO defaults for hosted environments: sampling is synchronous, so smaller batches pay off."""

HOSTED_DQN_DEFAULTS: dict[str, Any] = {}
"""DQN defaults for hosted environments (the settings' own defaults serve both)."""

HOSTED_SAC_DEFAULTS: dict[str, Any] = {}
"""SAC defaults for hosted environments (the settings' own defaults serve both)."""

HOSTED_DEFAULTS: dict[str, dict[str, Any]] = {
    "ppo": HOSTED_PPO_DEFAULTS,
    "dqn": HOSTED_DQN_DEFAULTS,
    "sac": HOSTED_SAC_DEFAULTS,
}
"""Per algorithm, the defaults a hosted environment starts from (over its settings' own)."""


def settings_fields(
    algo: str, settings: dict[str, Any], where: str, iteration: bool = False
) -> dict[str, Any]:
    """``settings`` as fields of ``algo``'s settings dataclass.

    A setting may be a field, RLlib's name for one (:data:`RLLIB_NAMES`; for SAC also the
    three learning rates with one value, ``twin_q=True`` and ``target_entropy="auto"``),
    ``model={"fcnet_hiddens": ..., "fcnet_activation": ...}``, for DQN and SAC
    ``replay_buffer_config={"capacity": N}`` and for DQN a two-point ``lr_schedule`` (or
    ``lr`` given as one).

    Args:
        algo: The algorithm's name.
        settings: The settings as given.
        where: Where they were given, for errors (``training()``, ``policy 'red'``).
        iteration: ``min_env_steps_per_iteration`` is a setting there (listed in errors).

    Raises:
        ConfigError: A name is not one of the algorithm's settings, or has no rlserve
            counterpart; the message lists the settings or names what to set instead.
    """
    entry = algorithm(algo)
    aliases = RLLIB_NAMES.get(entry.name, {})
    known = {f.name for f in dataclasses.fields(entry.settings)}
    fields: dict[str, Any] = {}
    rates = {k: settings[k] for k in SAC_LEARNING_RATES if k in settings}
    for name, value in settings.items():
        if name == "model":
            fields.update(_model(value))
            continue
        if name == "observation_filter":
            fields["normalize_observations"] = observation_filter(value)
            continue
        if name == "replay_buffer_config" and "buffer_size" in known:
            fields.update(_replay_buffer(value))
            continue
        if "lr_end" in known and (
            name == "lr_schedule" or (name == "lr" and isinstance(value, list | tuple))
        ):
            fields.update(_lr_schedule(name, value))
            continue
        if entry.name == "sac":
            refused = RLLIB_SAC_REFUSED.get(name)
            if refused is not None:
                raise ConfigError(f"{where}: sac setting '{name}' {refused}")
            if name in rates:
                continue
            if name == "twin_q":
                if value is not True:
                    raise ConfigError(
                        f"{where}: twin_q={value!r} is not supported: rlserve's SAC always "
                        "learns twin critics; drop twin_q"
                    )
                continue
            if name == "target_entropy" and value == "auto":
                fields["target_entropy"] = None  # unset: minus the number of action values
                continue
        field_name = aliases.get(name, name)
        if field_name not in known:
            extra = ", min_env_steps_per_iteration" if iteration else ""
            raise ConfigError(
                f"{where} of {entry.name} has no setting '{name}'; the settings are "
                f"{', '.join(sorted(known | set(aliases)))}, model{extra}"
            )
        fields[field_name] = value
    if rates:
        if len(rates) != len(SAC_LEARNING_RATES) or len(set(rates.values())) != 1:
            shown = ", ".join(f"{k}={v}" for k, v in rates.items())
            raise ConfigError(
                f"{where}: rlserve's SAC has one learning rate for the actor, the critics and "
                f"the temperature, lr (got {shown}); pass lr=..., or actor_lr, critic_lr and "
                "alpha_lr all with one value"
            )
        fields["lr"] = next(iter(rates.values()))
    return fields


def _replay_buffer(config: Any) -> dict[str, Any]:
    if not isinstance(config, dict):
        raise ConfigError(f"replay_buffer_config must be a dict, got {type(config).__name__}")
    fields: dict[str, Any] = {}
    for key, value in config.items():
        if key == "capacity":
            fields["buffer_size"] = int(value)
        elif key != "type":  # RLlib's buffer class: rlserve has one
            raise ConfigError(
                f"replay_buffer_config setting '{key}' is not supported; use capacity"
            )
    return fields


def _lr_schedule(name: str, schedule: Any) -> dict[str, Any]:
    """RLlib's two-point learning-rate schedule as ``lr``, ``lr_end`` and ``lr_decay_steps``.

    ``[[0, lr], [steps, lr_end]]``: a linear fall over env steps, then flat.
    """
    try:
        (start, first), (steps, last) = ((int(t), float(v)) for t, v in schedule)
    except (TypeError, ValueError):
        start, steps = -1, 0
    if start != 0 or steps <= 0:
        raise ConfigError(
            f"{name}={schedule!r}: rlserve's learning rate falls linearly from one value to "
            "another, [[0, lr], [env_steps, lr_end]]; or set lr, lr_end and lr_decay_steps"
        )
    return {"lr": first, "lr_end": last, "lr_decay_steps": steps}


def _model(model: Any) -> dict[str, Any]:
    if not isinstance(model, dict):
        raise ConfigError(f"model must be a dict, got {type(model).__name__}")
    fields: dict[str, Any] = {}
    for key, value in model.items():
        if key == "fcnet_hiddens":
            fields["hidden"] = tuple(int(v) for v in value)
        elif key == "fcnet_activation":
            fields["activation"] = str(value)
        else:
            raise ConfigError(
                f"model setting '{key}' is not supported; use fcnet_hiddens and fcnet_activation"
            )
    return fields


class AlgorithmConfig:
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
        self.rollout_fragment_length = 200
        self.min_env_steps_per_iteration = 4000
        self.training_settings: dict[str, Any] = {}
        """The algorithm's settings given (``training()``); :meth:`algo_settings` adds the
        defaults."""
        self.seed = 0
        self.device = "auto"
        self.evaluation_duration = 10
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
        self.serving_settings: dict[str, Any] | None = None
        self.run_dir: str | None = None
        self.run_name: str | None = None
        self.progress = False
        self.checkpoint_every: int | None = None
        self.keep_checkpoints = 3

    # -- builders ----------------------------------------------------------------------------

    def environment(
        self,
        env: Any = None,
        *,
        env_config: dict[str, Any] | None = None,
        observation_space: Any = None,
        action_space: Any = None,
    ) -> AlgorithmConfig:
        """The environment: a ``gymnasium.Env``, a registered id, a class or a creator.

        A class or creator is called with ``env_config`` (RLlib's convention). Multi-agent
        envs, PettingZoo envs, ``ExternalEnv`` subclasses and ``EnvSource`` subclasses are
        accepted too. Without an environment (``env=None``, as RLlib's policy-server example
        has it), give the policy's ``observation_space`` and ``action_space`` and attach a
        server with :meth:`serving`: its network clients are then the only source.
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

    def env_runners(
        self,
        *,
        num_env_runners: int | None = None,
        num_envs_per_env_runner: int | None = None,
        remote_worker_envs: bool | None = None,
        envs_per_process: int | None = None,
        rollout_fragment_length: int | None = None,
        sample_timeout_s: float | None = None,
        observation_filter: str | None = None,
    ) -> AlgorithmConfig:
        """How experience is sampled.

        Args:
            num_env_runners: Env-runner processes that sample in parallel (each with its own
                copies of the environment and numpy policy copies; see
                :mod:`rlserve.algorithm.runner_group`). 0 (the default) samples in this
                process; with N >= 1 this process only learns, and each ``train()`` round
                each runner samples ``train_batch_size / N`` steps.
            num_envs_per_env_runner: Copies of the environment per runner, acted on in one
                forward pass.
            remote_worker_envs: Step the copies in sub-processes, in parallel (for slow
                environments); a copy that crashes or hangs is restarted.
            envs_per_process: Copies per sub-process when ``remote_worker_envs``.
            rollout_fragment_length: Steps of an episode per fragment.
            sample_timeout_s: Seconds a sub-process copy (or an env-runner process) may take
                for one step before it is counted as hung and restarted.
            observation_filter: RLlib's name for observation normalisation: ``"MeanStdFilter"``
                sets the algorithm's ``normalize_observations`` (running statistics kept by
                the learner and shipped with each weights version), ``"NoFilter"`` clears it.
        """
        if observation_filter is not None:
            self._observation_filter(observation_filter)
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
        if self.num_env_runners and "fork" not in mp.get_all_start_methods():
            requested, self.num_env_runners = self.num_env_runners, 0
            raise ConfigError(
                f"num_env_runners={requested}: env-runner processes need the 'fork' start "
                "method, which this platform lacks; sample in this process "
                "(num_env_runners=0) with remote_worker_envs=True instead"
            )
        if remote_worker_envs is not None:
            self.remote_worker_envs = bool(remote_worker_envs)
        if sample_timeout_s is not None:
            if not sample_timeout_s > 0:
                raise ConfigError(f"sample_timeout_s must be positive, got {sample_timeout_s}")
            self.step_timeout_s = float(sample_timeout_s)
        return self

    def training(self, **settings: Any) -> AlgorithmConfig:
        """The algorithm's settings (checked at once).

        Any field of the algorithm's settings dataclass (:class:`~rlserve.learners.
        ppo_config.PPOSettings` for PPO, :class:`~rlserve.learners.dqn_config.DQNSettings`
        for DQN, :class:`~rlserve.learners.sac_config.SACSettings` for SAC), RLlib's names for
        them (:data:`RLLIB_NAMES`: for PPO ``lambda_``, ``num_sgd_iter``,
        ``sgd_minibatch_size``, ``clip_param``, ``vf_loss_coeff``, ``entropy_coeff``,
        ``grad_clip``, ``kl_target``; for SAC also ``actor_lr``/``critic_lr``/``alpha_lr``
        with one value, ``twin_q=True``, ``target_entropy="auto"``; RLlib settings rlserve has
        no counterpart for are refused naming what to set instead), ``model={"fcnet_hiddens":
        [...], "fcnet_activation": "tanh"}``, ``observation_filter`` (``"MeanStdFilter"`` or
        ``"NoFilter"``, as :meth:`env_runners` takes it) and ``min_env_steps_per_iteration``; for
        DQN and SAC also ``replay_buffer_config={"capacity": N}`` and
        ``store_buffer_in_checkpoints``.

        They are the settings of every policy that names no other algorithm (see
        :meth:`multi_agent`).
        """
        settings = dict(settings)
        if "min_env_steps_per_iteration" in settings:
            self.min_env_steps_per_iteration = int(settings.pop("min_env_steps_per_iteration"))
        self.training_settings.update(
            settings_fields(self.algo_name, settings, "training()", iteration=True)
        )
        self.algo_settings()  # checks the values now, not at build()
        return self

    def _observation_filter(self, value: Any) -> None:
        self.training_settings["normalize_observations"] = observation_filter(value)
        self.algo_settings()

    def multi_agent(
        self,
        *,
        policies: Any = None,
        policy_mapping_fn: Any = None,
        policy_mapping: Any = None,
        algorithm_settings: dict[str, dict[str, Any]] | None = None,
    ) -> AlgorithmConfig:
        """Several policies: ``policies`` (ids, or id -> settings overrides) and who uses which.

        A policy's value may also give its spaces, as RLlib's ``(None, observation_space,
        action_space, overrides)`` tuple or an rlserve ``PolicySpec``; an Algorithm without an
        environment needs them. ``policy_mapping_fn(agent_id, episode, **kwargs) ->
        policy_id`` (RLlib's form) or ``policy_mapping={agent id or pattern: policy id}``
        (rlserve's, the server's rules; a ``PolicyMapping`` is taken as its rules). Without
        either, every agent maps to the only policy.

        Policies may mix algorithms: ``"algo": "dqn"`` in a policy's overrides dict (plain, or
        the tuple's fourth item), or ``PolicySpec(..., algo="dqn")``, has DQN train it, with
        DQN's defaults (hosted or the server's), then ``algorithm_settings["dqn"]``, then the
        policy's own overrides; a policy that names no algorithm is this config's
        (:attr:`algo_name`), with the settings of :meth:`training`. Each trains on its own
        schedule (PPO's batches, DQN's and SAC's rounds of ``train_every`` steps).

        Args:
            policies: Ids, or id -> overrides / tuple / ``PolicySpec``.
            policy_mapping_fn: RLlib's mapping function (environments' agents only).
            policy_mapping: rlserve's mapping rules.
            algorithm_settings: Per algorithm name, the settings every policy of that
                algorithm starts from (RLlib's names work too), as the top ``[dqn]`` table of
                a config file does for ``rlserve serve``.
        """
        if algorithm_settings is not None:
            if not isinstance(algorithm_settings, dict):
                raise ConfigError(
                    "algorithm_settings must map an algorithm name to its settings, e.g. "
                    '{"dqn": {"lr": 5e-4}}'
                )
            for name, values in algorithm_settings.items():
                entry = algorithm(name)
                if not isinstance(values, dict):
                    raise ConfigError(
                        f"algorithm_settings['{name}'] must be a dict of {name} settings, got "
                        f"{type(values).__name__}"
                    )
                where = f"algorithm_settings['{entry.name}']"
                self.algorithm_settings[entry.name] = settings_fields(entry.name, values, where)
        if policies is not None:
            self.policy_specs = {}
            self.policy_algorithms = {}
            if isinstance(policies, dict):
                self.policies = {}
                for key, value in policies.items():
                    self.policies[str(key)] = self._policy_entry(str(key), value)
            else:
                self.policies = {str(p): {} for p in policies}
            if not self.policies:
                raise ConfigError("multi_agent(policies=...) names no policy")
        if policy_mapping_fn is not None:
            if not callable(policy_mapping_fn):
                raise ConfigError("policy_mapping_fn must be callable")
            self.policy_mapping_fn = policy_mapping_fn
        if policy_mapping is not None:
            rules = getattr(policy_mapping, "rules", None)
            pairs = rules if rules is not None else list(policy_mapping.items())
            self.policy_mapping = [(str(k), str(v)) for k, v in pairs]
        return self

    def _policy_entry(self, policy_id: str, value: Any) -> dict[str, Any]:
        """A policy's settings overrides.

        Its algorithm goes to :attr:`policy_algorithms`, its spaces, when given, to
        :attr:`policy_specs`.
        """
        from rlserve.server.policies import PolicySpec

        if isinstance(value, PolicySpec):
            overrides = self._policy_overrides(policy_id, dict(value.config), value.algo)
            self.policy_specs[policy_id] = value
            return overrides
        if isinstance(value, tuple | list):
            if len(value) != 4:
                raise ConfigError(
                    f"policy '{policy_id}': a tuple must be (None, observation_space, "
                    f"action_space, overrides), RLlib's PolicySpec form; got {len(value)} items"
                )
            _, obs_space, act_space, given = value
            overrides = self._policy_overrides(policy_id, dict(given or {}), None)
            if obs_space is not None and act_space is not None:
                self.policy_specs[policy_id] = PolicySpec(
                    policy_id,
                    obs_space,
                    act_space,
                    overrides,
                    algo=self.policy_algorithms.get(policy_id),
                )
            return overrides
        if value is not None and not isinstance(value, dict):
            raise ConfigError(
                f"policy '{policy_id}': give settings overrides as a dict, a PolicySpec or "
                f"(None, observation_space, action_space, overrides); got {type(value).__name__}"
            )
        return self._policy_overrides(policy_id, dict(value or {}), None)

    def _policy_overrides(
        self, policy_id: str, overrides: dict[str, Any], algo: str | None
    ) -> dict[str, Any]:
        """The overrides as settings fields of the policy's algorithm (``"algo"`` taken out)."""
        named = overrides.pop("algo", None)
        if named is not None and not isinstance(named, str):
            raise ConfigError(
                f"policy '{policy_id}': 'algo' must name an algorithm (a string), got {named!r}"
            )
        if named is not None and algo is not None and algorithm(named).name != algo:
            raise ConfigError(
                f"policy '{policy_id}': PolicySpec(algo='{algo}') and the override "
                f"'algo': '{named}' disagree; name the algorithm once"
            )
        chosen = algo or named
        if chosen is not None:
            self.policy_algorithms[policy_id] = algorithm(chosen).name
        name = self.policy_algorithms.get(policy_id, self.algo_name)
        fields: dict[str, Any] = settings_fields(name, overrides, f"policy '{policy_id}'")
        return fields

    def debugging(self, *, seed: int | None = None) -> AlgorithmConfig:
        """The seed of environments, sampling and the learner."""
        if seed is not None:
            self.seed = int(seed)
        return self

    def resources(self, *, device: str | None = None) -> AlgorithmConfig:
        """The learner's torch device: ``auto`` (cuda when present), ``cpu`` or ``cuda[:N]``."""
        if device is not None:
            self.training_settings["device"] = device
            self.algo_settings()
        return self

    def evaluation(self, *, evaluation_duration: int | None = None) -> AlgorithmConfig:
        """Episodes run by :meth:`Algorithm.evaluate` (exploration off, not trained on)."""
        if evaluation_duration is not None:
            if evaluation_duration < 1:
                raise ConfigError("evaluation_duration must be at least 1 episode")
            self.evaluation_duration = int(evaluation_duration)
        return self

    def serving(self, **settings: Any) -> AlgorithmConfig:
        """Attach a network server: external clients become one more source of experience.

        Takes host, port, http_port, token, tls_cert, tls_key and max_queued_steps_per_source
        (see :class:`rlserve.algorithm.serving.ServingSettings`).
        """
        from rlserve.algorithm.serving import ServingSettings

        try:
            ServingSettings(**settings)  # refuses a bad setting now, not at build()
        except TypeError as exc:
            raise ConfigError(f"serving(): {exc}") from exc
        self.serving_settings = dict(settings)
        return self

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
            self.checkpoint_every = int(checkpoint_every)
        if keep_checkpoints is not None:
            self.keep_checkpoints = max(1, int(keep_checkpoints))
        return self

    # -- results -----------------------------------------------------------------------------

    def algo_settings(self, overrides: dict[str, Any] | None = None) -> Any:
        """The algorithm's settings these calls give (plus a policy's ``overrides``).

        An instance of the settings dataclass :attr:`algo_name` registers (``PPOSettings``
        for PPO). Hosted environments start from :data:`HOSTED_DEFAULTS` (for PPO: synchronous
        sampling favours small batches); a network-only Algorithm from the server's defaults.
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

    def algorithm_of(self, policy_id: str) -> str:
        """The algorithm that trains ``policy_id`` (its own, else :attr:`algo_name`)."""
        return self.policy_algorithms.get(policy_id, self.algo_name)

    def used_algorithms(self) -> list[str]:
        """:attr:`algo_name` and every other algorithm a declared policy names, in order."""
        names = [self.algo_name]
        for name in self.policy_algorithms.values():
            if name not in names:
                names.append(name)
        return names

    def ppo_settings(self, overrides: dict[str, Any] | None = None) -> Any:
        """The old name of :meth:`algo_settings` (kept for callers of the PPO-only API)."""
        return self.algo_settings(overrides)

    def copy(self) -> AlgorithmConfig:
        """A deep copy (the environment itself is shared, not copied)."""
        env = self.env
        self.env = None
        try:
            twin = copy.deepcopy(self)
        finally:
            self.env = env
        twin.env = env
        return twin

    def build(self) -> Algorithm:
        """Make the Algorithm: environments, learner(s), and the server when attached."""
        from rlserve.algorithm.algorithm import Algorithm

        if self.env is None:
            if self.serving_settings is None:
                raise ConfigError(
                    "no environment: call .environment(env) (a gymnasium.Env, a registered id "
                    "such as 'CartPole-v1', or a class taking an env_config dict), or attach a "
                    "server with .serving(port=...) and give the spaces (.environment("
                    "observation_space=..., action_space=...)) to learn from network clients"
                )
            from rlserve.algorithm.network import NetworkAlgorithm

            return NetworkAlgorithm(self.copy())
        return Algorithm(self.copy())

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
