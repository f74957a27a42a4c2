"""The torch side of :mod:`rlserve.policy.image_encoder`: the conv encoders as layers.

:func:`encoder_modules` builds one ``torch.nn.Sequential`` per image, in a ``ModuleList`` whose
parameters are named as the encoders' layers (``encoder.0.0``, ...); :func:`encode` runs them on
the first layer's input as :class:`~rlserve.policy.conv_forward.ObservationForward` does in numpy.
:class:`EncodedInput` is the base of every network that reads observations through them.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from rlserve.policy.image_encoder import ImageEncoder, ObservationEncoder


def encoder_layers(encoder: ImageEncoder) -> nn.Sequential:
    """Conv + ReLU per convolution, a flattening, then Linear + ReLU per linear layer.

    Orthogonal weights of gain sqrt(2) and zero biases, as SB3's CNN policies.
    """
    layers: list[nn.Module] = []
    channels = encoder.hwc[2]
    flattened = False
    for layer in encoder.layers:
        module: nn.Conv2d | nn.Linear
        if layer.kind == "conv":
            module = nn.Conv2d(channels, layer.size, layer.kernel, layer.stride)
            channels = layer.size
        else:
            if not flattened:
                layers.append(nn.Flatten())
                flattened = True
                c, h, w = encoder.feature_maps()[-1]
                width = c * h * w
            module = nn.Linear(width, layer.size)
            width = layer.size
        nn.init.orthogonal_(module.weight, float(np.sqrt(2)))
        nn.init.zeros_(module.bias)  # type: ignore[arg-type]  # both kinds have one
        layers += [module, nn.ReLU()]
    if not flattened:
        layers.append(nn.Flatten())
    return nn.Sequential(*layers)


def encoder_modules(encoder: ObservationEncoder) -> nn.ModuleList:
    """One :func:`encoder_layers` per image of ``encoder``."""
    return nn.ModuleList(encoder_layers(image) for image in encoder.images)


def encode(modules: nn.ModuleList, encoder: ObservationEncoder, x: torch.Tensor) -> torch.Tensor:
    """``[N, input_dim]`` inputs, each image encoded and the rest as is, ``[N, output_dim]``."""
    pieces: list[torch.Tensor] = []
    position = 0
    for layers, image in zip(modules, encoder.images, strict=True):
        if image.start > position:
            pieces.append(x[:, position : image.start])
        position = image.start + image.input_dim
        pieces.append(encode_image(layers, image, x[:, image.start : position]))
    if position < x.shape[1]:
        pieces.append(x[:, position:])
    return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=1)


def encode_image(layers: nn.Module, encoder: ImageEncoder, x: torch.Tensor) -> torch.Tensor:
    """``[N, input_dim]`` flattened images through ``layers``, ``[N, output_dim]``."""
    image = x.reshape(x.shape[0], *encoder.shape)
    if not encoder.channels_first:
        image = image.permute(0, 3, 1, 2)  # NHWC -> NCHW
    if encoder.divisor != 1.0:
        image = image / encoder.divisor
    out: torch.Tensor = layers(image)
    return out


class EncodedInput(nn.Module):
    """A network that reads its input through an optional image encoder of its own.

    Without an encoder there is no ``encoder`` module, so an MLP network's parameters (and its
    checkpoints) are as they always were.
    """

    def _set_encoder(self, input_dim: int, image: ObservationEncoder | None) -> int:
        """Set the encoder of ``input_dim`` inputs; return the first linear layer's width."""
        self.image = image
        if image is None:
            return input_dim
        self.encoder = encoder_modules(image)
        return image.output_dim

    def features(self, obs: torch.Tensor) -> torch.Tensor:
        """``[N, input_dim]`` inputs as the first linear layer reads them."""
        return obs if self.image is None else encode(self.encoder, self.image, obs)

    def encoder_arrays(self) -> dict[str, np.ndarray]:
        """The encoder's parameters as named float32 numpy arrays (none without one)."""
        if self.image is None:
            return {}
        return {
            f"encoder.{name}": p.detach().float().cpu().numpy().copy()
            for name, p in self.encoder.named_parameters()
        }
