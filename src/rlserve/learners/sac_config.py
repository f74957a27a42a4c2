"""SAC's configuration, importable without torch (the serving process reads it, never trains)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from gymnasium import spaces

from rlserve.config.fields import option
from rlserve.errors import ConfigError, UnsupportedSpaceError
from rlserve.learners.replay import check_warm_up
from rlserve.learners.setting_checks import check_finite, check_network
from rlserve.policy.action_mask import MASK_KEY
from rlserve.policy.distribution import ActionDistribution
from rlserve.policy.encoder_choice import check_encoder_settings
from rlserve.policy.frame_stacking import check_frame_stack
from rlserve.policy.memory import PPO_ONLY
from rlserve.policy.space_distribution import check_observations, squashed_gaussian_distribution


@dataclass
class SACSettings:
    """Soft Actor-Critic hyper-parameters: SB3's defaults, but critics that learn at 1e-3.

    The faster critics (CleanRL's SAC has them too) were chosen on the learning suite
    (``bench/suite.py``; docs/learners.md, "SAC in detail").

    Training follows a schedule rather than consuming what arrived: after ``learning_starts``
    steps are in the replay buffer, each env step taken in owes ``updates_per_step`` gradient
    steps, paid in updates of at most ``train_every * updates_per_step`` gradient steps (one
    update per hand-off of ``train_every`` steps when sampling is synchronous).
    """

    REFUSED_OPTIONS = PPO_ONLY

    buffer_size: int = option(1_000_000, "Replay buffer capacity (transitions).")
    learning_starts: int = option(
        100, "Steps in the replay buffer before training starts (at most buffer_size)."
    )
    batch_size: int = option(256, "Transitions per gradient step.")
    updates_per_step: float = option(1.0, "Gradient steps per env step taken in.")
    train_every: int = option(
        64, "Env steps a synchronous sampler collects between two updates (a hand-off)."
    )
    lr: float = option(3e-4, "Adam learning rate of the actor and the temperature.")
    critic_lr: float = option(
        1e-3, "Adam learning rate of the critics (faster than the actor's, lr)."
    )
    gamma: float = option(0.99, "Discount factor.")
    tau: float = option(0.005, "Polyak rate of the target critics.")
    n_step: int = option(
        1,
        "Rewards summed per transition (n-step returns; fewer before an action logged with "
        "log_action).",
    )
    n_step_through_logged: bool = option(
        False,
        "Let n-step sums run through actions logged with log_action, as through the policy's: "
        "the targets then follow the logged controller (biased towards its values).",
    )
    initial_alpha: float = option(1.0, "Initial entropy temperature.")
    learn_alpha: bool = option(True, "Tune the temperature to reach target_entropy.")
    target_entropy: float | None = option(
        None, "Target entropy of the squashed actions (unset: minus the number of values)."
    )
    hidden: tuple[int, ...] = option((256, 256), "Hidden layer sizes of actor and critics.")
    activation: str = option("relu", "Activation: tanh or relu.")
    encoder: str = option(
        "auto",
        "Encoder of an image observation (a Box of rank 3): auto (a conv stack, Nature CNN for "
        "images of 36x36 and up, a small one below), nature, small, or mlp (flattened). The "
        "actor has its own; the twin critics share one.",
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
    checkpoint_replay: bool = option(
        False, "Save the replay buffer's contents in checkpoints, so a resumed run has them."
    )
    normalize_observations: bool = option(
        False,
        "Normalise observations by running mean and std (RLlib's MeanStdFilter), shipped with "
        "each weights version.",
    )
    obs_clip: float = option(10.0, "Normalised observations are clipped to +-this.")
    max_abs_input: float = option(
        1e9,
        "Exclude fragments holding an observation, reward or action of larger magnitude.",
    )
    device: str = option("auto", "Torch device: auto (cuda when present), cpu or cuda.")
    torch_threads: int = option(
        1, "Torch intra-op threads; 1 keeps the learner off the serving core."
    )
    seed: int = option(0, "Seed of torch's generator and of the replay sampling.")

    def __post_init__(self) -> None:
        positive = {
            "buffer_size": self.buffer_size,
            "batch_size": self.batch_size,
            "train_every": self.train_every,
            "n_step": self.n_step,
        }
        for name, value in positive.items():
            if value < 1:
                raise ConfigError(f"{name} must be at least 1, got {value}")
        if self.batch_size > self.buffer_size:
            raise ConfigError(
                f"batch_size {self.batch_size} is larger than buffer_size {self.buffer_size}; "
                "lower it"
            )
        if self.learning_starts < 0:
            raise ConfigError(f"learning_starts must be 0 or more, got {self.learning_starts}")
        check_warm_up(self.learning_starts, self.buffer_size)
        if not self.updates_per_step > 0:
            raise ConfigError(f"updates_per_step must be positive, got {self.updates_per_step}")
        for name, rate in (("lr", self.lr), ("critic_lr", self.critic_lr)):
            check_finite(name, rate, 0.0)  # 0: that part does not learn (as PPO's lr)
        if not 0.0 < self.tau <= 1.0:
            raise ConfigError(f"tau must be in (0, 1], got {self.tau}")
        if not 0.0 <= self.gamma <= 1.0:
            raise ConfigError(f"gamma must be in [0, 1], got {self.gamma}")
        if not self.initial_alpha > 0:
            raise ConfigError(f"initial_alpha must be positive, got {self.initial_alpha}")
        if not self.max_abs_input > 0:
            raise ConfigError(f"max_abs_input must be positive, got {self.max_abs_input}")
        if not (math.isfinite(self.obs_clip) and self.obs_clip > 0):
            raise ConfigError(f"obs_clip must be a finite positive number, got {self.obs_clip}")
        check_network(self)
        self.conv_filters = check_encoder_settings(self.encoder, self.conv_filters) or None
        check_frame_stack(self.frame_stack)

    @property
    def updates_per_hand_off(self) -> int:
        """Most gradient steps one update applies: ``train_every * updates_per_step``, >= 1."""
        return max(1, round(self.train_every * self.updates_per_step))


def check_sac_spaces(
    observation_space: spaces.Space[Any], action_space: spaces.Space[Any]
) -> ActionDistribution:
    """Refuse, naming the fix, spaces SAC cannot learn; return its squashed distribution.

    Raises:
        UnsupportedSpaceError: The observation space cannot be flattened, or the action space
            is not a float Box with finite bounds (the registry's check names the algorithms
            that learn it: PPO any action space, DQN Discrete ones).
    """
    check_observations(observation_space)
    if isinstance(observation_space, spaces.Dict) and MASK_KEY in observation_space.spaces:
        raise UnsupportedSpaceError(
            f"sac acts in continuous Box action spaces, which an '{MASK_KEY}' observation cannot "
            "mask; learn a masked Discrete or MultiDiscrete space with ppo (or dqn: Discrete)"
        )
    if not isinstance(action_space, spaces.Box) or action_space.dtype.kind != "f":
        raise UnsupportedSpaceError(f"sac learns float Box action spaces only, not {action_space}")
    return squashed_gaussian_distribution(action_space)
