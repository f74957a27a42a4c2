"""The Algorithm API's settings, built by chaining: ``PPOConfig().environment(...).build()``.

It keeps RLlib's method and setting names where they fit, so an RLlib script needs only its
imports changed. Each method returns the config itself (chaining) and checks its arguments at
once, naming the fix. Importable without torch; :meth:`AlgorithmConfig.build` imports the
learner.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import TYPE_CHECKING, Any

from rlserve.algorithms.ppo_config import PPOSettings
from rlserve.errors import ConfigError

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
        """The PPO settings given (``training()``); :meth:`ppo_settings` adds the defaults."""
        self.seed = 0
        self.device = "auto"
        self.evaluation_duration = 10
        self.policies: dict[str, dict[str, Any]] | None = None
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
    ) -> AlgorithmConfig:
        """How experience is sampled.

        Args:
            num_env_runners: Env runners besides the one in this process. Only 0 (sample
                here) is built so far: for parallel stepping use ``remote_worker_envs``.
            num_envs_per_env_runner: Copies of the environment per runner, acted on in one
                forward pass.
            remote_worker_envs: Step the copies in sub-processes, in parallel (for slow
                environments); a copy that crashes or hangs is restarted.
            envs_per_process: Copies per sub-process when ``remote_worker_envs``.
            rollout_fragment_length: Steps of an episode per fragment.
            sample_timeout_s: Seconds a sub-process copy may take for one step before it is
                counted as hung and restarted.
        """
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
        if self.num_env_runners:
            requested, self.num_env_runners = self.num_env_runners, 0
            raise ConfigError(
                f"num_env_runners={requested}: separate env-runner processes are not built yet; "
                "sample in this process (num_env_runners=0) with num_envs_per_env_runner copies, "
                "and remote_worker_envs=True to step them in parallel sub-processes"
            )
        if remote_worker_envs is not None:
            self.remote_worker_envs = bool(remote_worker_envs)
        if sample_timeout_s is not None:
            if not sample_timeout_s > 0:
                raise ConfigError(f"sample_timeout_s must be positive, got {sample_timeout_s}")
            self.step_timeout_s = float(sample_timeout_s)
        return self

    def training(self, **settings: Any) -> AlgorithmConfig:
        """PPO settings (checked at once).

        Any :class:`~rlserve.algorithms.ppo_config.PPOSettings` field, RLlib's names for
        them (``lambda_``, ``num_sgd_iter``, ``sgd_minibatch_size``, ``clip_param``,
        ``vf_loss_coeff``, ``entropy_coeff``, ``grad_clip``, ``kl_target``),
        ``model={"fcnet_hiddens": [...], "fcnet_activation": "tanh"}`` and
        ``min_env_steps_per_iteration``.
        """
        known = {f.name for f in dataclasses.fields(PPOSettings)}
        for name, value in settings.items():
            if name == "model":
                self._model(value)
                continue
            if name == "min_env_steps_per_iteration":
                self.min_env_steps_per_iteration = int(value)
                continue
            field_name = RLLIB_TRAINING_NAMES.get(name, name)
            if field_name not in known:
                raise ConfigError(
                    f"training() has no setting '{name}'; the settings are "
                    f"{', '.join(sorted(known | set(RLLIB_TRAINING_NAMES)))}, model and "
                    "min_env_steps_per_iteration"
                )
            self.training_settings[field_name] = value
        self.ppo_settings()  # checks the values now, not at build()
        return self

    def _model(self, model: Any) -> None:
        if not isinstance(model, dict):
            raise ConfigError(f"model must be a dict, got {type(model).__name__}")
        for key, value in model.items():
            if key == "fcnet_hiddens":
                self.training_settings["hidden"] = tuple(int(v) for v in value)
            elif key == "fcnet_activation":
                self.training_settings["activation"] = str(value)
            else:
                raise ConfigError(
                    f"model setting '{key}' is not supported; use fcnet_hiddens and "
                    "fcnet_activation"
                )

    def multi_agent(
        self,
        *,
        policies: Any = None,
        policy_mapping_fn: Any = None,
        policy_mapping: Any = None,
    ) -> AlgorithmConfig:
        """Several policies: ``policies`` (ids, or id -> PPO overrides) and which agent uses which.

        A policy's value may also give its spaces, as RLlib's ``(None, observation_space,
        action_space, overrides)`` tuple or an rlserve ``PolicySpec``; an Algorithm without an
        environment needs them. ``policy_mapping_fn(agent_id, episode, **kwargs) ->
        policy_id`` (RLlib's form) or ``policy_mapping={agent id or pattern: policy id}``
        (rlserve's, the server's rules; a ``PolicyMapping`` is taken as its rules). Without
        either, every agent maps to the only policy.
        """
        if policies is not None:
            if isinstance(policies, dict):
                self.policies = {}
                self.policy_specs = {}
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
        """A policy's PPO overrides; its spaces, when given, go to :attr:`policy_specs`."""
        from rlserve.server.policies import PolicySpec

        if isinstance(value, PolicySpec):
            self.policy_specs[policy_id] = value
            return dict(value.ppo)
        if isinstance(value, tuple | list):
            if len(value) != 4:
                raise ConfigError(
                    f"policy '{policy_id}': a tuple must be (None, observation_space, "
                    f"action_space, overrides), RLlib's PolicySpec form; got {len(value)} items"
                )
            _, obs_space, act_space, overrides = value
            if obs_space is not None and act_space is not None:
                self.policy_specs[policy_id] = PolicySpec(
                    policy_id, obs_space, act_space, dict(overrides or {})
                )
            return dict(overrides or {})
        if value is not None and not isinstance(value, dict):
            raise ConfigError(
                f"policy '{policy_id}': give PPO overrides as a dict, a PolicySpec or "
                f"(None, observation_space, action_space, overrides); got {type(value).__name__}"
            )
        return dict(value or {})

    def debugging(self, *, seed: int | None = None) -> AlgorithmConfig:
        """The seed of environments, sampling and the learner."""
        if seed is not None:
            self.seed = int(seed)
        return self

    def resources(self, *, device: str | None = None) -> AlgorithmConfig:
        """The learner's torch device: ``auto`` (cuda when present), ``cpu`` or ``cuda[:N]``."""
        if device is not None:
            self.training_settings["device"] = device
            self.ppo_settings()
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

    def ppo_settings(self, overrides: dict[str, Any] | None = None) -> PPOSettings:
        """The PPO settings these calls give (plus a policy's ``overrides``).

        Hosted environments start from :data:`HOSTED_PPO_DEFAULTS` (synchronous sampling
        favours small batches); a network-only Algorithm from the server's PPO defaults.
        """
        defaults = HOSTED_PPO_DEFAULTS if self.env is not None else {}
        values = {**defaults, **self.training_settings, **(overrides or {})}
        values.setdefault("seed", self.seed)
        if isinstance(values.get("hidden"), list):
            values["hidden"] = tuple(values["hidden"])
        try:
            return PPOSettings(**values)
        except TypeError as exc:
            raise ConfigError(f"invalid training settings: {exc}") from exc

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
    """Proximal Policy Optimisation (the learner of :mod:`rlserve.algorithms.ppo`)."""

    algo_name = "ppo"
