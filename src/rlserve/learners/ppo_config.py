"""PPO's configuration, importable without torch (the serving process reads it, never trains)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from rlserve.config.fields import option
from rlserve.errors import ConfigError
from rlserve.learners.setting_checks import (
    check_at_least,
    check_finite,
    check_network,
    check_rate,
    check_within,
)
from rlserve.policy.encoder_choice import check_encoder_settings
from rlserve.policy.frame_stacking import check_frame_stack

LOGGED_STEPS = ("exclude", "value", "bc", "on_policy")
"""The treatments of logged steps (``PPOSettings.logged_steps``)."""

ONLY_LOGGED_WARNING = (
    "rlserve learner: PPO trained on none of these steps: they came from log_action, and "
    "logged_steps = exclude (the default) leaves those out; to learn from them set "
    "logged_steps = bc, value or on_policy (rlserve serve --ppo-logged-steps; docs/learners.md), "
    "or train an off-policy algorithm (--algo dqn or sac)"
)
"""What a PPO learner says of updates whose every step was a left-out logged step."""


@dataclass
class PPOSettings:
    """PPO hyper-parameters.

    The defaults are one set for every task, hosted or from external clients: Stable-Baselines3's
    schedule (2048 / 64 / 10 epochs, lr 3e-4, gamma 0.99, lambda 0.95, clip 0.2), chosen on the
    learning suite (``bench/suite.py``) over a schedule tuned on CartPole, plus observation
    normalisation where the observation space is unbounded (``normalize_observations`` unset).
    """

    train_batch_size: int = option(2048, "Env steps collected per update.")
    minibatch_size: int = option(
        64,
        "Steps per gradient step at most: each epoch splits the batch into the fewest equal "
        "minibatches of no more steps.",
    )
    num_epochs: int = option(10, "Passes over each batch.")
    lr: float = option(3e-4, "Adam learning rate.")
    gamma: float = option(0.99, "Discount factor.")
    gae_lambda: float = option(0.95, "GAE lambda.")
    clip_coef: float = option(
        0.2, "PPO ratio clip (around the policy at the start of each update)."
    )
    vf_coef: float = option(0.5, "Weight of the value loss.")
    ent_coef: float = option(0.0, "Weight of the entropy bonus.")
    max_grad_norm: float = option(0.5, "Global gradient norm clip.")
    norm_advantages: bool = option(True, "Normalise advantages per minibatch.")
    target_kl: float | None = option(
        None, "Stop an update's epochs early past this KL (off if unset)."
    )
    hidden: tuple[int, ...] = option((64, 64), "Hidden layer sizes of actor and critic.")
    activation: str = option("tanh", "Activation: tanh or relu.")
    encoder: str = option(
        "auto",
        "Encoder of an image observation (a Box of rank 3): auto (a conv stack, Nature CNN for "
        "images of 36x36 and up, a small one below), nature, small, or mlp (flattened).",
    )
    conv_filters: tuple[tuple[int, ...], ...] | None = option(
        None,
        "The image encoder's convolutions, RLlib's [[filters, kernel, stride], ...] (unset: the "
        "encoder's stack); the hidden MLP follows them.",
    )
    frame_stack: int = option(
        1,
        "Frames per observation (1: off): the policy sees the last N frames of each episode, "
        "stacked along an image's channels (a vector's new first axis) as rlserve.env.FrameStack "
        "does; clients send single frames and the server (remote) or the client (local) stacks.",
    )
    use_lstm: bool = option(
        False,
        "Give the policy memory: one LSTM, shared by actor and critic, between the observation "
        "(or its image encoding) and the hidden layers; trained on sequences of max_seq_len steps.",
    )
    max_seq_len: int = option(
        20,
        "use_lstm: steps per training sequence (each fragment is cut into chunks of this many, "
        "the last one padded); a minibatch holds minibatch_size // max_seq_len chunks (1 or more).",
    )
    lstm_cell_size: int = option(
        64,
        "use_lstm: the LSTM's cell size N (its state is 2N floats); every acting step costs about "
        "4N(input + N) multiply-adds, in the client's numpy policy in local mode.",
    )
    max_policy_lag: int = option(
        1, "Drop steps collected by weights older than this many versions."
    )
    max_steps_per_update: int | None = option(
        None,
        "Train on at most this many buffered steps per update, the newest; the older ones are "
        "dropped and counted in learner/steps_dropped_cap (unset: 2 x train_batch_size).",
    )
    importance_weight_cap: float = option(
        1.0,
        "Truncate each step's importance weight pi_prox / pi_behaviour at this (V-trace's "
        "rho-bar); pi_prox is the policy at the start of the update.",
    )
    truncated_traces: bool = option(
        False,
        "Cut GAE's lambda trace at each step by min(1, pi_prox / pi_behaviour) (Retrace's c); "
        "off: plain GAE over the behaviour policy's steps.",
    )
    logged_steps: str = option(
        "exclude",
        "Steps logged with log_action (not chosen by the policy): exclude (left out, the lambda "
        "trace cut at them), value (also value targets: biased towards the logged actions' "
        "returns), bc (also a behaviour-cloning term, bc_coef) or on_policy (trained as if the "
        "policy had sampled them).",
    )
    bc_coef: float = option(
        1.0, "Weight of the behaviour-cloning term on logged steps (logged_steps = bc)."
    )
    normalize_observations: bool | None = option(
        None,
        "Normalise observations by running mean and std (RLlib's MeanStdFilter), shipped with "
        "each weights version (unset: auto, on when a Box part of the observation space has an "
        "infinite bound, or the policy has memory, and it flattens to at most 65,536 values).",
    )
    obs_clip: float = option(10.0, "Normalised observations are clipped to +-this.")
    normalize_rewards: bool | None = option(
        None,
        "Divide rewards by the running std of the discounted return (SB3 VecNormalize; unset: "
        "auto, on when the policy has memory).",
    )
    reward_clip: float = option(10.0, "Normalised rewards are clipped to +-this.")
    normalize_actions: bool = option(
        True,
        "Act in [-1, 1] units of a bounded Box's bounds (the Gaussian's mean and std), scaled "
        "to the bounds when sent (RLlib's normalize_actions).",
    )
    max_abs_input: float = option(
        1e9,
        "Exclude fragments holding an observation, reward or Box action of larger magnitude.",
    )
    device: str = option("auto", "Torch device: auto (cuda when present), cpu or cuda.")
    torch_threads: int = option(
        1, "Torch intra-op threads; 1 keeps the learner off the serving core."
    )
    seed: int = option(0, "Seed of torch's generator.")

    @property
    def step_cap(self) -> int:
        """The most steps one update trains on (``max_steps_per_update`` resolved)."""
        if self.max_steps_per_update is None:
            return 2 * self.train_batch_size
        return self.max_steps_per_update

    def __post_init__(self) -> None:
        if self.minibatch_size <= 0 or self.train_batch_size <= 0:
            raise ConfigError("train_batch_size and minibatch_size must be positive")
        if self.minibatch_size > self.train_batch_size:
            raise ConfigError(
                f"minibatch_size {self.minibatch_size} is larger than train_batch_size "
                f"{self.train_batch_size}; lower it"
            )
        if not self.max_abs_input > 0:
            raise ConfigError(f"max_abs_input must be positive, got {self.max_abs_input}")
        for name in ("obs_clip", "reward_clip"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ConfigError(f"{name} must be a finite positive number, got {value}")
        if self.max_steps_per_update is not None and (
            self.max_steps_per_update < self.train_batch_size
        ):
            raise ConfigError(
                f"max_steps_per_update {self.max_steps_per_update} is below train_batch_size "
                f"{self.train_batch_size}; raise it or leave it unset"
            )
        if not self.importance_weight_cap > 0:
            raise ConfigError(
                f"importance_weight_cap must be positive, got {self.importance_weight_cap}"
            )
        if self.logged_steps not in LOGGED_STEPS:
            raise ConfigError(
                f"logged_steps must be one of {', '.join(LOGGED_STEPS)}, got '{self.logged_steps}'"
            )
        if not self.bc_coef >= 0:
            raise ConfigError(f"bc_coef must be 0 or more, got {self.bc_coef}")
        self._check_update()
        check_network(self)
        self.conv_filters = check_encoder_settings(self.encoder, self.conv_filters) or None
        check_frame_stack(self.frame_stack)
        self._check_memory()

    def _check_update(self) -> None:
        """The ranges of the update's settings (a value out of them fails every update)."""
        check_at_least("num_epochs", self.num_epochs, 1)
        check_at_least("max_policy_lag", self.max_policy_lag, 0)
        check_finite("lr", self.lr, 0.0)  # 0: a policy that does not learn (RLlib's way)
        check_rate("clip_coef", self.clip_coef)
        if not (isinstance(self.max_grad_norm, (int, float)) and self.max_grad_norm > 0):
            raise ConfigError(
                f"max_grad_norm must be positive (inf: no clipping), got {self.max_grad_norm!r}"
            )
        if self.target_kl is not None:
            check_rate("target_kl", self.target_kl)
        for name in ("gamma", "gae_lambda"):
            check_within(name, getattr(self, name), 0.0, 1.0)
        check_finite("vf_coef", self.vf_coef, 0.0)
        check_finite("ent_coef", self.ent_coef)

    def _check_memory(self) -> None:
        for name in ("max_seq_len", "lstm_cell_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a whole number of 1 or more, got {value!r}")
        if not isinstance(self.use_lstm, bool):
            raise ConfigError(f"use_lstm must be true or false, got {self.use_lstm!r}")
