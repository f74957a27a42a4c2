"""SAC's torch networks: a squashed-Gaussian actor that matches the numpy policy, twin critics.

The actor reads the flattened observation and outputs ``2A`` values: ``A`` means, then ``A``
log standard deviations (clamped to ``[SQUASHED_LOG_STD_MIN, SQUASHED_LOG_STD_MAX]``), the
layout of a ``squashed_gaussian`` part in :mod:`rlserve.policy.distributions`. The learner works
in the squashed units ``a = tanh(u)`` in ``[-1, 1]`` (so a Box of +-100 trains as one of +-1);
the scaling to the space's bounds happens only at the edges (the numpy policy, the fragments).

The critics are one batched module, ``n`` independent MLPs evaluated with one ``baddbmm`` per
layer: two Q-networks cost about one network's Python overhead.

Given an image encoder (:mod:`rlserve.policy.image_encoder`) each reads observations through it
first, as SB3's SAC: the actor through its own conv stacks, the critics through one set shared
by all ``n`` heads (the target critics through their own copy). No loss trains the other side's
encoder: the critics' loss reads the replay buffer's actions, not the actor's, and the actor's
loss reads the critics with their gradients off.
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rlserve.learners.image_models import EncodedInput
from rlserve.policy import ModelSpec
from rlserve.policy.distribution import ActionDistribution
from rlserve.policy.gaussian import LOG_2PI, SQUASH_EPS, SQUASHED_LOG_STD_MAX, SQUASHED_LOG_STD_MIN
from rlserve.policy.image_encoder import ObservationEncoder
from rlserve.policy.space_distribution import squashed_gaussian_distribution
from rlserve.protocol.spaces import flat_dim

_ACTIVATIONS: dict[str, type[nn.Module]] = {"tanh": nn.Tanh, "relu": nn.ReLU}


def squashed_log_prob(
    u: torch.Tensor, mean: torch.Tensor, log_std: torch.Tensor, squashed: torch.Tensor
) -> torch.Tensor:
    """Log-density of ``a = tanh(u)`` (in ``[-1, 1]`` units) with ``u ~ N(mean, exp(log_std))``.

    ``sum(log N(u)) - sum(log(1 - a^2 + SQUASH_EPS))``, ``[N]``; adding
    ``-sum(log((high - low) / 2))`` gives the density of the action in the space's units.
    """
    z = (u - mean) / log_std.exp()
    gauss = -0.5 * z.pow(2) - log_std - 0.5 * LOG_2PI
    return (gauss - torch.log(1.0 - squashed.pow(2) + SQUASH_EPS)).sum(-1)


class SquashedGaussianActor(EncodedInput):
    """An MLP whose output parameterises a tanh-squashed diagonal Gaussian.

    Args:
        observation_space: Any space ``gymnasium.spaces.flatten`` handles.
        action_space: A float Box with finite bounds.
        hidden: Hidden layer sizes.
        activation: ``tanh`` or ``relu``.
        image: The image encoders the MLP reads through (None: the flattened observation).

    Raises:
        UnsupportedSpaceError: The action space is not a bounded float Box.
    """

    def __init__(
        self,
        observation_space: gym.Space[Any],
        action_space: gym.Space[Any],
        hidden: tuple[int, ...] = (256, 256),
        activation: str = "relu",
        image: ObservationEncoder | None = None,
    ):
        super().__init__()
        self.action_distribution: ActionDistribution = squashed_gaussian_distribution(action_space)
        self.obs_dim = flat_dim(observation_space)
        self.action_dim = self.action_distribution.action_width
        self.activation = activation
        width = self._set_encoder(self.obs_dim, image)
        sizes = [width, *hidden, 2 * self.action_dim]
        layers: list[nn.Module] = []
        for i in range(len(sizes) - 1):
            layers.append(nn.Linear(sizes[i], sizes[i + 1]))
            if i < len(sizes) - 2:
                layers.append(_ACTIVATIONS[activation]())
        self.actor = nn.Sequential(*layers)
        low = np.asarray(self.action_distribution.low, dtype=np.float64)
        high = np.asarray(self.action_distribution.high, dtype=np.float64)
        # log of the Jacobian of the scaling from [-1, 1] to the space's units.
        self.log_scale = float(np.log((high - low) / 2.0).sum())

    def params(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Means and clamped log standard deviations, each ``[N, A]``."""
        out = self.actor(self.features(obs))
        mean, log_std = out[:, : self.action_dim], out[:, self.action_dim :]
        return mean, log_std.clamp(SQUASHED_LOG_STD_MIN, SQUASHED_LOG_STD_MAX)

    def sample(
        self, obs: torch.Tensor, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Reparameterised actions in ``[-1, 1]`` units, ``[N, A]``, and their log-densities.

        The log-density is that of the squashed action (no scaling term), ``[N]``. The noise is
        drawn on ``generator``'s device and moved to the networks' (torch refuses a generator
        of another device), so a CPU generator serves a learner on any device, and draws the
        same noise on each.
        """
        mean, log_std = self.params(obs)
        drawn_on = mean.device if generator is None else generator.device
        noise = torch.randn(mean.shape, generator=generator, device=drawn_on).to(mean.device)
        u = mean + log_std.exp() * noise
        squashed = torch.tanh(u)
        return squashed, squashed_log_prob(u, mean, log_std, squashed)

    def log_prob(self, obs: torch.Tensor, squashed: torch.Tensor) -> torch.Tensor:
        """Log-density of given actions in ``[-1, 1]`` units (clipped inside), ``[N]``."""
        mean, log_std = self.params(obs)
        squashed = squashed.clamp(-1.0 + SQUASH_EPS, 1.0 - SQUASH_EPS)
        return squashed_log_prob(torch.atanh(squashed), mean, log_std, squashed)

    def deterministic(self, obs: torch.Tensor) -> torch.Tensor:
        """The mode, ``tanh(mean)``, in ``[-1, 1]`` units."""
        mean, _ = self.params(obs)
        return torch.tanh(mean)

    def spec(self) -> ModelSpec:
        """The actor's architecture for numpy inference."""
        names = tuple(
            f"actor.{i}" for i, layer in enumerate(self.actor) if isinstance(layer, nn.Linear)
        )
        return ModelSpec.for_distribution(
            self.obs_dim, names, self.activation, self.action_distribution, encoder=self.image
        )

    def actor_arrays(self) -> dict[str, np.ndarray]:
        """The actor's parameters (and its encoder's) as named float32 numpy arrays."""
        arrays = self.encoder_arrays()
        arrays.update(
            {
                f"actor.{name}": p.detach().float().cpu().numpy().copy()
                for name, p in self.actor.named_parameters()
            }
        )
        return arrays


class EnsembleQ(EncodedInput):
    """``n`` independent Q-network MLPs over ``[obs, action]``, evaluated together.

    Layer ``i`` holds ``weight_i`` ``[n, in, out]`` and ``bias_i`` ``[n, 1, out]``, initialised
    as ``nn.Linear`` initialises its own (uniform within ``1 / sqrt(in)``).

    Args:
        obs_dim: Length of the flattened observation.
        action_dim: Number of action values.
        hidden: Hidden layer sizes.
        activation: ``tanh`` or ``relu``.
        n: Number of networks (2: SAC's twin critics).
        image: The image encoders all ``n`` networks read through, one set shared by them
            (None: the flattened observation).
    """

    def __init__(
        self,
        obs_dim: int,
        action_dim: int,
        hidden: tuple[int, ...],
        activation: str,
        n: int = 2,
        image: ObservationEncoder | None = None,
    ):
        super().__init__()
        self.n = n
        sizes = [self._set_encoder(obs_dim, image) + action_dim, *hidden, 1]
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for i in range(len(sizes) - 1):
            bound = 1.0 / math.sqrt(sizes[i])
            self.weights.append(nn.Parameter(torch.empty(n, sizes[i], sizes[i + 1])))
            self.biases.append(nn.Parameter(torch.empty(n, 1, sizes[i + 1])))
            nn.init.uniform_(self.weights[i], -bound, bound)
            nn.init.uniform_(self.biases[i], -bound, bound)
        self.act = _ACTIVATIONS[activation]()

    def forward(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """Q-values of each network, ``[n, N]``."""
        x = torch.cat([self.features(obs), actions], dim=-1).unsqueeze(0).expand(self.n, -1, -1)
        last = len(self.weights) - 1
        for i, (w, b) in enumerate(zip(self.weights, self.biases, strict=True)):
            x = torch.baddbmm(b, x, w)
            if i != last:
                x = self.act(x)
        return x.squeeze(-1)
