"""Torch networks whose acting part matches :class:`rlserve.policy.NumpyPolicy`.

:class:`ActorCritic` (PPO) publishes its actor; :class:`QNetwork` (DQN) publishes its Q-values,
a dueling head folded into one linear layer, so the numpy policy and the ONNX export run a plain
MLP either way. Given an image encoder (:mod:`rlserve.policy.image_encoder`) each reads its
observations through it first: one encoder, shared by PPO's actor and critic (as SB3's CNN
policies: one conv stack to train and to run, the critic's gradient shaping the features too).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rlserve.learners import masking
from rlserve.learners.image_models import EncodedInput
from rlserve.policy import ModelSpec
from rlserve.policy.action_mask import action_mask_slice
from rlserve.policy.image_encoder import ObservationEncoder
from rlserve.policy.space_distribution import (
    check_learnable,
    epsilon_greedy,
    normalized_box_actions,
)
from rlserve.protocol.spaces import flat_dim

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


class _Encoded(EncodedInput):
    """What both networks share: the observation without its mask, through the image encoder."""

    def _init_encoder(
        self,
        observation_space: gym.Space[Any],
        action_space: gym.Space[Any],
        image: ObservationEncoder | None,
    ) -> int:
        """Set the mask, the encoder and the widths; return the first linear layer's input."""
        self.obs_dim = flat_dim(observation_space)
        self.action_mask = action_mask_slice(observation_space, action_space)
        self.input_dim = self.obs_dim - (0 if self.action_mask is None else self.action_mask[1])
        return self._set_encoder(self.input_dim, image)

    def features(self, obs: torch.Tensor) -> torch.Tensor:
        """``[N, obs_dim]`` observations as the first linear layer reads them."""
        return super().features(masking.features(obs, self.action_mask))


def categorical_log_prob_entropy(
    logits: torch.Tensor, actions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.distributions.Categorical(logits=logits)``'s ``log_prob(actions)`` and entropy.

    The same arithmetic without building the distribution and checking its arguments (the
    learner checked the actions at ingest), which on a small network costs more than the maths.
    """
    log_probs = logits - logits.logsumexp(-1, keepdim=True)
    logp = log_probs.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
    # The clamp keeps a probability of 0 (a log of -inf) from making 0 * -inf = NaN.
    finite = log_probs.clamp(min=torch.finfo(log_probs.dtype).min)
    return logp, -(finite * log_probs.exp()).sum(-1)


class ActorCritic(_Encoded):
    """Separate actor and critic MLPs over the flattened observation (or its image's encoding).

    Args:
        observation_space: Any space ``gymnasium.spaces.flatten`` handles.
        action_space: Any space :func:`rlserve.policy.distributions.action_distribution`
            takes (Discrete, MultiDiscrete, MultiBinary, float Box, Dict/Tuple of those).
        hidden: Hidden layer sizes of both networks.
        activation: ``tanh`` or ``relu``.
        normalize_actions: Gaussian values of bounded Box actions in units of their bounds
            (:func:`~rlserve.policy.distributions.normalized_box_actions`): the actor's means
            and ``log_std`` are in ``[-1, 1]`` units, the action columns (fragments, the learner's
            input) in the space's units.
        image: The image encoders both MLPs read through (None: the flattened observation).

    The networks read observations as given: a learner that normalises them does so before.
    With a legal-move mask in the observation space (:mod:`rlserve.policy.action_mask`) every
    method takes the whole flattened observation: the networks read it without the mask, and
    the actor's logits of illegal choices are masked.
    """

    action_scale: torch.Tensor
    action_bias: torch.Tensor

    def __init__(
        self,
        observation_space: gym.Space[Any],
        action_space: gym.Space[Any],
        hidden: tuple[int, ...] = (64, 64),
        activation: str = "tanh",
        normalize_actions: bool = False,
        image: ObservationEncoder | None = None,
    ):
        super().__init__()
        self._raw_distribution = check_learnable(observation_space, action_space)
        self.action_distribution = self._raw_distribution
        self.register_buffer("action_scale", torch.ones(0), persistent=False)
        self.register_buffer("action_bias", torch.zeros(0), persistent=False)
        self.set_action_normalization(normalize_actions)
        width = self._heads_input(self._init_encoder(observation_space, action_space, image))
        self.activation = activation
        self.distribution = self.action_distribution.kind
        self.action_dim = self.action_distribution.param_dim
        sizes = [width, *hidden]
        self.actor = _mlp([*sizes, self.action_dim], activation, 0.01)
        self.critic = _mlp([*sizes, 1], activation, 1.0)
        # One per Gaussian value; categorical and gaussian policies keep the historical size
        # (action_dim) so that their checkpoints load unchanged.
        legacy = self.distribution in ("categorical", "gaussian")
        log_std_size = self.action_dim if legacy else self.action_distribution.gaussian_dim
        self.log_std = nn.Parameter(torch.zeros(log_std_size))

    def _heads_input(self, width: int) -> int:
        """The width the actor and critic read, given the encoder's: the same here.

        A recurrent subclass builds its LSTM here, between the encoder and the heads.
        """
        return width

    def set_action_normalization(self, enabled: bool) -> None:
        """Act in normalised Box units (see the class) or in the space's own units.

        The weights mean different actions either way: a checkpoint says which it was trained
        with, and a learner that loads one follows it.
        """
        distribution = self._raw_distribution
        if enabled:
            distribution = normalized_box_actions(distribution)
        self.action_distribution = distribution
        device = self.action_scale.device
        self.action_scale = torch.tensor(distribution.scale, dtype=torch.float32, device=device)
        self.action_bias = torch.tensor(distribution.bias, dtype=torch.float32, device=device)

    @property
    def normalizes_actions(self) -> bool:
        """True when a Gaussian value is scaled from normalised units to the Box's."""
        return self.action_distribution.scaled

    def normalized_actions(self, actions: torch.Tensor) -> torch.Tensor:
        """``[N, A]`` action columns in the actor's units, ``(a - bias) / scale``.

        Unscaled columns (discrete ones, unbounded values) come back as they are. Without
        normalised actions (or ``[N]`` choice indices) ``actions`` itself.
        """
        if not self.action_distribution.scaled or actions.ndim != 2:
            return actions
        return (actions - self.action_bias) / self.action_scale

    def spec(self) -> ModelSpec:
        """The actor's architecture for numpy inference."""
        names = tuple(
            f"actor.{i}" for i, layer in enumerate(self.actor) if isinstance(layer, nn.Linear)
        )
        return ModelSpec.for_distribution(
            self.obs_dim,
            names,
            self.activation,
            self.action_distribution,
            self.action_mask,
            self.image,
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
        if self.action_distribution.gaussian_dim:
            arrays["log_std"] = self.log_std.detach().float().cpu().numpy().copy()
        return arrays

    def value(self, obs: torch.Tensor, features: torch.Tensor | None = None) -> torch.Tensor:
        """State values, ``[N]``.

        ``features``: :meth:`features` of ``obs`` when the caller has them (one encoder pass
        for the actor and the critic of a minibatch).
        """
        return self.critic(self.features(obs) if features is None else features).squeeze(-1)

    def params(self, obs: torch.Tensor, features: torch.Tensor | None = None) -> torch.Tensor:
        """The actor's outputs at ``obs``, ``[N, action_dim]``, illegal choices masked."""
        out = self.actor(self.features(obs) if features is None else features)
        return masking.masked(out, obs, self.action_mask)

    def distribution_for(
        self, obs: torch.Tensor, features: torch.Tensor | None = None
    ) -> torch.distributions.Distribution:
        """The action distribution at ``obs`` (categorical and gaussian policies only)."""
        out = self.params(obs, features)
        if self.distribution == "categorical":
            return torch.distributions.Categorical(logits=out)
        if self.distribution == "gaussian":
            return torch.distributions.Normal(out, self.log_std.exp().expand_as(out))
        raise ValueError(f"a {self.distribution} policy has no single torch distribution")

    def log_prob_entropy(
        self, obs: torch.Tensor, actions: torch.Tensor, features: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probabilities of ``actions`` and the entropies, each ``[N]``.

        ``actions`` are in the layout of :mod:`rlserve.policy.distributions`: ``[N]`` choice
        indices for a categorical policy, ``[N, A]`` otherwise, Gaussian values in the space's
        units (mapped to the actor's normalised units here, when it has them: the
        log-probability and entropy are those of the normalised values, as the numpy policy's).
        ``features`` as in :meth:`value`.
        """
        actions = self.normalized_actions(actions)
        if self.distribution == "categorical":
            return categorical_log_prob_entropy(self.params(obs, features), actions)
        if self.distribution == "gaussian":
            dist = self.distribution_for(obs, features)
            return dist.log_prob(actions).sum(-1), dist.entropy().sum(-1)
        out = self.params(obs, features)
        logp = torch.zeros(out.shape[0], device=out.device)
        entropy = torch.zeros_like(logp)
        column = param = gauss = 0
        for part in self.action_distribution.parts:
            x = out[:, param : param + part.size]
            a = actions[:, column : column + part.action_width]
            if part.kind == "categorical":
                categorical = torch.distributions.Categorical(logits=x)
                logp = logp + categorical.log_prob(a[:, 0].long())
                entropy = entropy + categorical.entropy()
            elif part.kind == "bernoulli":
                bernoulli = torch.distributions.Bernoulli(logits=x)
                logp = logp + bernoulli.log_prob(a).sum(-1)
                entropy = entropy + bernoulli.entropy().sum(-1)
            else:
                std = self.log_std[gauss : gauss + part.size].exp().expand_as(x)
                normal = torch.distributions.Normal(x, std)
                logp = logp + normal.log_prob(a).sum(-1)
                entropy = entropy + normal.entropy().sum(-1)
                gauss += part.size
            column += part.action_width
            param += part.size
        return logp, entropy


class QNetwork(_Encoded):
    """Action values of a Discrete action space: an MLP trunk and a linear head.

    With ``dueling`` the head is two linear layers on the trunk, a state value ``V`` and
    advantages ``A``, combined as ``Q = V + A - mean(A)``. That is linear in the trunk's output,
    so :meth:`q_arrays` publishes it folded into one layer ``head`` (``W = W_A + W_V -
    mean_rows(W_A)``, ``b = b_A + b_V - mean(b_A)``): the numpy policy and the export see the
    same plain MLP as without dueling. With a legal-move mask in the observation space it
    reads the whole flattened observation and the trunk the observation without the mask;
    :meth:`forward` gives every choice's value, :meth:`legal_values` masks the illegal ones.

    Args:
        observation_space: Any space ``gymnasium.spaces.flatten`` handles.
        action_space: A Discrete space.
        hidden: Hidden layer sizes of the trunk.
        activation: ``tanh`` or ``relu``.
        dueling: Separate value and advantage heads.
        image: The image encoders the trunk reads through (None: the flattened observation).
    """

    def __init__(
        self,
        observation_space: gym.Space[Any],
        action_space: gym.Space[Any],
        hidden: tuple[int, ...] = (64, 64),
        activation: str = "relu",
        dueling: bool = False,
        image: ObservationEncoder | None = None,
    ):
        super().__init__()
        check_learnable(observation_space, action_space)
        self.action_distribution = epsilon_greedy(action_space)
        width = self._init_encoder(observation_space, action_space, image)
        self.action_dim = self.action_distribution.param_dim
        self.activation = activation
        self.dueling = dueling
        self.epsilon = 0.0
        """The exploration epsilon of a loaded checkpoint's schedule (set by the export)."""
        layers: list[nn.Module] = []
        for size in hidden:
            layers += [nn.Linear(width, size), _ACTIVATIONS[activation]()]
            width = size
        self.trunk = nn.Sequential(*layers)
        if dueling:
            self.value_head = nn.Linear(width, 1)
            self.advantage_head = nn.Linear(width, self.action_dim)
        else:
            self.head = nn.Linear(width, self.action_dim)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Q-values, ``[N, n]``, of every choice (legal or not)."""
        features = self.trunk(self.features(obs))
        if not self.dueling:
            out: torch.Tensor = self.head(features)
            return out
        advantages = self.advantage_head(features)
        value = self.value_head(features)
        return value + advantages - advantages.mean(dim=1, keepdim=True)

    def legal_values(self, obs: torch.Tensor, q_values: torch.Tensor) -> torch.Tensor:
        """``q_values`` at ``obs`` with illegal choices' set to ``MASKED_LOGIT`` (no mask: as is).

        Their ``argmax`` is the best legal choice, their ``max`` the best legal value.
        """
        return masking.masked(q_values, obs, self.action_mask)

    def layer_names(self) -> tuple[str, ...]:
        """The published linear layers in order: the trunk's, then ``head``."""
        trunk = tuple(
            f"trunk.{i}" for i, layer in enumerate(self.trunk) if isinstance(layer, nn.Linear)
        )
        return (*trunk, "head")

    def spec(self, epsilon: float) -> ModelSpec:
        """The Q-network's architecture for numpy inference, acting epsilon-greedily."""
        distribution = dataclasses.replace(self.action_distribution, epsilon=float(epsilon))
        return ModelSpec.for_distribution(
            self.obs_dim,
            self.layer_names(),
            self.activation,
            distribution,
            self.action_mask,
            self.image,
        )

    def head_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The head as one linear layer's ``(weight [n, h], bias [n])`` (dueling: folded)."""
        with torch.no_grad():
            if not self.dueling:
                return self.head.weight.detach().clone(), self.head.bias.detach().clone()
            wa, ba = self.advantage_head.weight, self.advantage_head.bias
            wv, bv = self.value_head.weight, self.value_head.bias
            weight = wa + wv - wa.mean(dim=0, keepdim=True)
            bias = ba + bv - ba.mean()
            return weight.detach().clone(), bias.detach().clone()

    def q_arrays(self) -> dict[str, np.ndarray]:
        """The published layers (and the encoder's) as named float32 numpy arrays."""
        arrays = self.encoder_arrays()
        arrays.update(
            {
                f"trunk.{name}": p.detach().float().cpu().numpy().copy()
                for name, p in self.trunk.named_parameters()
            }
        )
        weight, bias = self.head_weights()
        arrays["head.weight"] = weight.float().cpu().numpy()
        arrays["head.bias"] = bias.float().cpu().numpy()
        return arrays
