"""PPO's configuration, importable without torch (the serving process reads it, never trains)."""

from __future__ import annotations

from dataclasses import dataclass

from rlserve.config import option
from rlserve.errors import ConfigError


@dataclass
class PPOSettings:
    """PPO hyper-parameters; the defaults solve CartPole-v1 from 4 external clients quickly."""

    train_batch_size: int = option(1024, "Env steps collected per update.")
    minibatch_size: int = option(256, "Steps per gradient step.")
    num_epochs: int = option(10, "Passes over each batch.")
    lr: float = option(1e-3, "Adam learning rate.")
    gamma: float = option(0.98, "Discount factor.")
    gae_lambda: float = option(0.8, "GAE lambda.")
    clip_coef: float = option(0.2, "PPO ratio clip.")
    vf_coef: float = option(0.5, "Weight of the value loss.")
    ent_coef: float = option(0.0, "Weight of the entropy bonus.")
    max_grad_norm: float = option(0.5, "Global gradient norm clip.")
    norm_advantages: bool = option(True, "Normalise advantages per minibatch.")
    target_kl: float | None = option(
        None, "Stop an update's epochs early past this KL (off if unset)."
    )
    hidden: tuple[int, ...] = option((64, 64), "Hidden layer sizes of actor and critic.")
    activation: str = option("tanh", "Activation: tanh or relu.")
    max_policy_lag: int = option(
        1, "Drop steps collected by weights older than this many versions."
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
        if self.activation not in ("tanh", "relu"):
            raise ConfigError(f"activation must be tanh or relu, got '{self.activation}'")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ConfigError(f"device must be auto, cpu or cuda[:N], got '{self.device}'")
