"""PPO's actor-critic with memory (``use_lstm``): one LSTM shared by the actor and the critic.

:class:`RecurrentActorCritic` is :class:`~rlserve.learners.models.ActorCritic` with an
``nn.LSTM`` between what the first layer would read (the observation without its mask, or the
image encoder's output) and the two heads, which read its ``h``. The LSTM reads observations
only, so an episode's states depend on its observations alone (``docs/protocol.md``;
:mod:`rlserve.policy.memory` is the numpy step the client runs). The state is ``[2N]``,
``concat(h, c)``, zeros at the start of every episode.

The heads' methods (:meth:`~ActorCritic.value`, :meth:`~ActorCritic.log_prob_entropy`) take the
LSTM's outputs as their ``features``: :meth:`RecurrentActorCritic.unroll` gives them for
``[B, T]`` sequences from ``[B, 2N]`` states, :meth:`RecurrentActorCritic.step` for one step.
:func:`ppo_model` builds the model PPO's settings describe, with memory or without.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rlserve.learners.models import ActorCritic
from rlserve.learners.ppo_config import PPOSettings
from rlserve.policy import ModelSpec
from rlserve.policy.encoder_choice import settings_encoder
from rlserve.policy.image_encoder import ObservationEncoder
from rlserve.policy.memory import BIAS, WEIGHT_HH, WEIGHT_IH, LSTMMemory


class RecurrentActorCritic(ActorCritic):
    """:class:`ActorCritic` whose actor and critic read one LSTM's ``h`` (see the module doc).

    Args:
        observation_space, action_space, hidden, activation, normalize_actions, image: As
            :class:`ActorCritic`'s; ``hidden`` are the heads' layers after the LSTM.
        cell_size: The LSTM's ``N`` (``lstm_cell_size``).
    """

    memory: nn.LSTM

    def __init__(
        self,
        observation_space: gym.Space[Any],
        action_space: gym.Space[Any],
        hidden: tuple[int, ...] = (64, 64),
        activation: str = "tanh",
        normalize_actions: bool = False,
        image: ObservationEncoder | None = None,
        cell_size: int = 64,
    ):
        # Read by _heads_input during ActorCritic's construction; a plain int, so nn.Module
        # takes it before its own __init__.
        self.cell_size = cell_size
        super().__init__(
            observation_space, action_space, hidden, activation, normalize_actions, image
        )

    def _heads_input(self, width: int) -> int:
        """Build the LSTM over the ``width`` encoded values; the heads read its ``N`` outputs."""
        self.memory_input_dim = width
        self.memory = nn.LSTM(width, self.cell_size, batch_first=True)
        # Orthogonal weights and zero biases, as the heads (CleanRL's recurrent PPO does too).
        for name, parameter in self.memory.named_parameters():
            if name.startswith("weight"):
                nn.init.orthogonal_(parameter, 1.0)
            else:
                nn.init.zeros_(parameter)
        return self.cell_size

    @property
    def state_size(self) -> int:
        """The width of the recurrent state, ``2 * cell_size``."""
        return 2 * self.cell_size

    def initial_state(self, rows: int) -> torch.Tensor:
        """``[rows, 2N]`` zeros (an episode's start), on the model's device."""
        return torch.zeros(rows, self.state_size, device=self.log_std.device)

    def unroll(self, obs: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The LSTM over ``[B, T, obs_dim]`` observations from ``[B, 2N]`` states.

        Returns:
            ``(h, next_state)``: ``[B, T, N]`` outputs (what the heads read at each step) and
            the ``[B, 2N]`` state after the last step.
        """
        rows, steps = obs.shape[0], obs.shape[1]
        x = self.features(obs.reshape(rows * steps, -1)).reshape(rows, steps, -1)
        n = self.cell_size
        h0 = state[:, :n].unsqueeze(0).contiguous()
        c0 = state[:, n:].unsqueeze(0).contiguous()
        out, (h, c) = self.memory(x, (h0, c0))
        return out, torch.cat((h[0], c[0]), dim=1)

    def state_after(
        self, obs: torch.Tensor, state: torch.Tensor, steps: torch.Tensor
    ) -> torch.Tensor:
        """``[B, 2N]``: the state after each row's first ``steps[b]`` (1 to ``T``) observations.

        As :meth:`unroll` from ``state`` over ``[B, T, obs_dim]`` observations, stopping each
        row at its own length (what follows, padding, is not read).
        """
        rows, width = obs.shape[0], obs.shape[1]
        x = self.features(obs.reshape(rows * width, -1)).reshape(rows, width, -1)
        n = self.cell_size
        h0 = state[:, :n].unsqueeze(0).contiguous()
        c0 = state[:, n:].unsqueeze(0).contiguous()
        packed = nn.utils.rnn.pack_padded_sequence(
            x, steps.cpu(), batch_first=True, enforce_sorted=False
        )
        _, (h, c) = self.memory(packed, (h0, c0))
        return torch.cat((h[0], c[0]), dim=1)

    def step(self, obs: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One step: ``[B, obs_dim]`` observations and ``[B, 2N]`` states -> ``(h, next_state)``.

        ``h`` is ``[B, N]`` (the heads' input), ``next_state`` ``[B, 2N]``.
        """
        out, next_state = self.unroll(obs.unsqueeze(1), state)
        return out[:, 0], next_state

    def spec(self) -> ModelSpec:
        """The actor's architecture for numpy inference, with its memory."""
        memory = LSTMMemory(self.cell_size, self.memory_input_dim)
        return dataclasses.replace(super().spec(), memory=memory)

    def actor_arrays(self) -> dict[str, np.ndarray]:
        """The actor's arrays (:meth:`ActorCritic.actor_arrays`) and the LSTM's.

        ``memory.bias`` is torch's two biases summed (the gates only ever see their sum).
        """
        arrays = super().actor_arrays()
        lstm = dict(self.memory.named_parameters())
        with torch.no_grad():
            bias = lstm["bias_ih_l0"] + lstm["bias_hh_l0"]
            for name, tensor in (
                (WEIGHT_IH, lstm["weight_ih_l0"]),
                (WEIGHT_HH, lstm["weight_hh_l0"]),
                (BIAS, bias),
            ):
                arrays[name] = tensor.detach().float().cpu().numpy().copy()
        return arrays


def ppo_model(
    observation_space: gym.Space[Any], action_space: gym.Space[Any], settings: PPOSettings
) -> ActorCritic:
    """The actor-critic ``settings`` describe: :class:`RecurrentActorCritic` with ``use_lstm``.

    Image observations get the encoder the settings choose
    (:func:`~rlserve.policy.encoder_choice.settings_encoder`).
    """
    image = settings_encoder(settings, observation_space)
    if settings.use_lstm:
        return RecurrentActorCritic(
            observation_space,
            action_space,
            settings.hidden,
            settings.activation,
            normalize_actions=settings.normalize_actions,
            image=image,
            cell_size=settings.lstm_cell_size,
        )
    return ActorCritic(
        observation_space,
        action_space,
        settings.hidden,
        settings.activation,
        normalize_actions=settings.normalize_actions,
        image=image,
    )
