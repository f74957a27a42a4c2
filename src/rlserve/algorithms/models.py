"""Torch actor-critic networks whose actor matches :class:`rlserve.policy.NumpyPolicy`."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rlserve.errors import UnsupportedSpaceError
from rlserve.policy import ModelSpec
from rlserve.spaces import flat_dim

_ACTIVATIONS: dict[str, type[nn.Module]] = {"tanh": nn.Tanh, "relu": nn.ReLU}


def _mlp(sizes: list[int], activation: str, last_gain: float) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        linear = nn.Linear(sizes[i], sizes[i + 1])
        last = i == len(sizes) - 2
        # Orthogonal init as in CleanRL / SB3: sqrt(2) for hidden layers, a small gain for the
        # policy head so early actions are near uniform.
        nn.init.orthogonal_(linear.weight, last_gain if last else float(np.sqrt(2)))
        nn.init.zeros_(linear.bias)
        layers.append(linear)
        if not last:
            layers.append(_ACTIVATIONS[activation]())
    return nn.Sequential(*layers)


class ActorCritic(nn.Module):
    """Separate actor and critic MLPs over the flattened observation.

    Args:
        observation_space: Any space ``gymnasium.spaces.flatten`` handles.
        action_space: ``Discrete`` (categorical) or ``Box`` (diagonal gaussian).
        hidden: Hidden layer sizes of both networks.
        activation: ``tanh`` or ``relu``.
    """

    def __init__(
        self,
        observation_space: gym.Space[Any],
        action_space: gym.Space[Any],
        hidden: tuple[int, ...] = (64, 64),
        activation: str = "tanh",
    ):
        super().__init__()
        self.obs_dim = flat_dim(observation_space)
        self.activation = activation
        if isinstance(action_space, gym.spaces.Discrete):
            self.distribution = "categorical"
            self.action_dim = int(action_space.n)
            self.action_low: tuple[float, ...] = ()
            self.action_high: tuple[float, ...] = ()
            self.action_start = int(action_space.start)
        elif isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1:
            self.distribution = "gaussian"
            self.action_dim = int(action_space.shape[0])
            self.action_low = tuple(float(v) for v in action_space.low)
            self.action_high = tuple(float(v) for v in action_space.high)
            self.action_start = 0
        else:
            raise UnsupportedSpaceError(
                f"PPO supports Discrete and 1-D Box action spaces, got {action_space}"
            )
        sizes = [self.obs_dim, *hidden]
        self.actor = _mlp([*sizes, self.action_dim], activation, 0.01)
        self.critic = _mlp([*sizes, 1], activation, 1.0)
        self.log_std = nn.Parameter(torch.zeros(self.action_dim))

    def spec(self) -> ModelSpec:
        """The actor's architecture for numpy inference."""
        names = tuple(
            f"actor.{i}" for i, layer in enumerate(self.actor) if isinstance(layer, nn.Linear)
        )
        return ModelSpec(
            obs_dim=self.obs_dim,
            actor_layers=names,
            activation=self.activation,
            distribution=self.distribution,
            action_dim=self.action_dim,
            action_low=self.action_low,
            action_high=self.action_high,
            action_start=self.action_start,
        )

    def actor_arrays(self) -> dict[str, np.ndarray]:
        """The actor's parameters as named float32 numpy arrays."""
        arrays = {
            f"actor.{name}": p.detach().float().cpu().numpy().copy()
            for name, p in self.actor.named_parameters()
        }
        if self.distribution == "gaussian":
            arrays["log_std"] = self.log_std.detach().float().cpu().numpy().copy()
        return arrays

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """State values, ``[N]``."""
        return self.critic(obs).squeeze(-1)

    def distribution_for(self, obs: torch.Tensor) -> torch.distributions.Distribution:
        """The action distribution at ``obs``."""
        out = self.actor(obs)
        if self.distribution == "categorical":
            return torch.distributions.Categorical(logits=out)
        return torch.distributions.Normal(out, self.log_std.exp().expand_as(out))

    def log_prob_entropy(
        self, obs: torch.Tensor, actions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probabilities of ``actions`` and the entropies, each ``[N]``."""
        dist = self.distribution_for(obs)
        if self.distribution == "categorical":
            return dist.log_prob(actions.long()), dist.entropy()
        return dist.log_prob(actions).sum(-1), dist.entropy().sum(-1)
