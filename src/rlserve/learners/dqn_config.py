"""DQN's configuration, importable without torch (the serving process reads it, never trains).

The training schedule is off-policy's: experience goes into a bounded replay buffer, and once
``learning_starts`` transitions are stored the learner makes ``updates_per_step`` gradient steps
per env step taken in, in rounds of at least ``train_every`` new env steps (one published weights
version per round). Exploration is epsilon-greedy, its epsilon annealed linearly over the env
steps taken in and shipped with each weights version, so whoever computes the action (the server,
or a local-mode client's numpy policy) explores with the schedule's current value. The learning
rate may fall linearly over the env steps taken in as well (``lr_end``), which keeps a policy
that has learned its task from unlearning it on the narrow data it then collects.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rlserve.config.fields import option
from rlserve.errors import ConfigError
from rlserve.learners.replay import check_warm_up
from rlserve.learners.setting_checks import check_finite, check_network
from rlserve.policy.encoder_choice import check_encoder_settings
from rlserve.policy.frame_stacking import check_frame_stack
from rlserve.policy.memory import PPO_ONLY

SOFT_TAU = 0.0075
"""The target network's share of the online weights per gradient step (``tau`` unset, copies
every gradient step): a soft copy."""


@dataclass
class DQNSettings:
    """DQN hyper-parameters (double-Q, n-step, optional dueling heads, Huber loss).

    The defaults (soft target updates every step, 5-step returns) were tuned on CartPole-v1
    through 4 remote clients; one gradient step per 4 env steps was chosen on the learning suite
    (``bench/suite.py``: the highest returns of its three DQN tasks, in less wall time than
    Stable-Baselines3's DQN, where one per env step took 2.5-3x its time). The CartPole demo
    adds one gradient step per env step, observation normalisation, a faster target and a
    falling learning rate (:data:`rlserve.cli.demo.TASKS`, docs/benchmarks.md).
    """

    REFUSED_OPTIONS = PPO_ONLY

    buffer_size: int = option(100_000, "Transitions the replay buffer holds (oldest dropped).")
    learning_starts: int = option(
        1000, "Transitions stored before the first update (the warm-up; at most buffer_size)."
    )
    batch_size: int = option(128, "Transitions per gradient step.")
    train_every: int = option(
        64, "New env steps per training round; each round publishes one weights version."
    )
    updates_per_step: float = option(
        0.25, "Gradient steps per env step taken in (a round makes new_steps * this)."
    )
    lr: float = option(1e-3, "Adam learning rate (at the start, with lr_end).")
    lr_end: float | None = option(
        None,
        "Learning rate reached after lr_decay_steps env steps, falling linearly from lr "
        "(None: lr throughout).",
    )
    lr_decay_steps: int = option(50_000, "Env steps over which the learning rate falls to lr_end.")
    gamma: float = option(0.99, "Discount factor.")
    n_step: int = option(
        5,
        "Rewards summed per target before bootstrapping (n-step returns; fewer before an action "
        "logged with log_action).",
    )
    n_step_through_logged: bool = option(
        False,
        "Let n-step sums run through actions logged with log_action, as through the policy's: "
        "the targets then follow the logged controller (biased towards its values; faster from "
        "one controller's data, where the sums are otherwise one-step).",
    )
    double_q: bool = option(True, "Double-Q: the online network picks the next action.")
    dueling: bool = option(False, "Dueling heads: Q = V + A - mean(A).")
    target_update_interval: int = option(
        1, "Gradient steps between copies of the online network into the target network."
    )
    tau: float | None = option(
        None,
        "Share of the online weights mixed into the target at each copy (1: a hard copy; "
        f"unset: {SOFT_TAU} when target_update_interval is 1, a hard copy when it is more, as "
        "RLlib's and SB3's target_update_interval mean).",
    )
    huber_delta: float = option(1.0, "Huber loss threshold between quadratic and linear.")
    clip_q_targets: bool = option(
        True,
        "Clamp bootstrap values to the returns the rewards seen so far allow "
        "(min(0, r_min) to max(0, r_max), over 1 - gamma): an over-estimate cannot feed itself.",
    )
    max_grad_norm: float = option(10.0, "Global gradient norm clip.")
    epsilon_start: float = option(1.0, "Exploration epsilon at the start.")
    epsilon_end: float = option(0.01, "Exploration epsilon after the schedule.")
    exploration_steps: int = option(
        5_000, "Env steps over which epsilon falls linearly from start to end."
    )
    checkpoint_replay: bool = option(
        False, "Save the replay buffer's contents in checkpoints, so a resumed run has them."
    )
    hidden: tuple[int, ...] = option((128, 128), "Hidden layer sizes of the Q-network.")
    activation: str = option("relu", "Activation: tanh or relu.")
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
    normalize_observations: bool = option(
        False,
        "Normalise observations by running mean and std (RLlib's MeanStdFilter), shipped with "
        "each weights version.",
    )
    obs_clip: float = option(10.0, "Normalised observations are clipped to +-this.")
    max_abs_input: float = option(
        1e9, "Exclude fragments holding an observation or reward of larger magnitude."
    )
    device: str = option("auto", "Torch device: auto (cuda when present), cpu or cuda.")
    torch_threads: int = option(
        1, "Torch intra-op threads; 1 keeps the learner off the serving core."
    )
    seed: int = option(0, "Seed of torch's generator and the replay sampling.")

    def __post_init__(self) -> None:
        for name in (
            "buffer_size",
            "batch_size",
            "train_every",
            "n_step",
            "target_update_interval",
        ):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if self.learning_starts < 0:
            raise ConfigError(f"learning_starts must be >= 0, got {self.learning_starts}")
        if self.batch_size > self.buffer_size:
            raise ConfigError(
                f"batch_size {self.batch_size} is larger than buffer_size {self.buffer_size}; "
                "lower it"
            )
        check_warm_up(self.learning_starts, self.buffer_size)
        for name in ("lr", "lr_end"):  # 0: no learning (a frozen policy; a decay to zero)
            if getattr(self, name) is not None:
                check_finite(name, getattr(self, name), 0.0)
        if self.lr_decay_steps <= 0:
            raise ConfigError(f"lr_decay_steps must be positive, got {self.lr_decay_steps}")
        if not self.updates_per_step > 0:
            raise ConfigError(f"updates_per_step must be positive, got {self.updates_per_step}")
        if not 0.0 <= self.gamma <= 1.0:
            raise ConfigError(f"gamma must be within [0, 1], got {self.gamma}")
        if self.tau is not None and not 0.0 < self.tau <= 1.0:
            raise ConfigError(f"tau must be within (0, 1], got {self.tau}")
        for name in ("epsilon_start", "epsilon_end"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"{name} must be within [0, 1], got {getattr(self, name)}")
        if self.exploration_steps < 0:
            raise ConfigError(f"exploration_steps must be >= 0, got {self.exploration_steps}")
        if not self.huber_delta > 0:
            raise ConfigError(f"huber_delta must be positive, got {self.huber_delta}")
        if not self.max_abs_input > 0:
            raise ConfigError(f"max_abs_input must be positive, got {self.max_abs_input}")
        if not (math.isfinite(self.obs_clip) and self.obs_clip > 0):
            raise ConfigError(f"obs_clip must be a finite positive number, got {self.obs_clip}")
        check_network(self)
        self.conv_filters = check_encoder_settings(self.encoder, self.conv_filters) or None
        check_frame_stack(self.frame_stack)

    @property
    def target_tau(self) -> float:
        """``tau`` resolved: :data:`SOFT_TAU` every gradient step, else a hard copy."""
        if self.tau is not None:
            return float(self.tau)
        return SOFT_TAU if self.target_update_interval == 1 else 1.0

    def learning_rate(self, env_steps: int) -> float:
        """The learning rate after ``env_steps`` env steps (linear to ``lr_end``, then constant)."""
        if self.lr_end is None:
            return float(self.lr)
        share = min(max(env_steps, 0) / self.lr_decay_steps, 1.0)
        return float(self.lr + share * (self.lr_end - self.lr))

    def epsilon(self, env_steps: int) -> float:
        """The exploration epsilon after ``env_steps`` env steps (linear, then constant)."""
        if self.exploration_steps == 0 or env_steps >= self.exploration_steps:
            return float(self.epsilon_end)
        share = max(env_steps, 0) / self.exploration_steps
        return float(self.epsilon_start + share * (self.epsilon_end - self.epsilon_start))
