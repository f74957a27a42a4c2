"""The torch side of :mod:`rlserve.policy.image_encoder`: the conv encoder as layers.

:func:`encoder_layers` builds the ``torch.nn.Sequential`` whose parameters are named as the
encoder's layers (``encoder.0``, ...); :func:`encode` runs it on flattened observations as
:class:`~rlserve.policy.conv_forward.ConvForward` does in numpy.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from rlserve.policy.image_encoder import ImageEncoder


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


def encode(layers: nn.Module, encoder: ImageEncoder, x: torch.Tensor) -> torch.Tensor:
    """``[N, input_dim]`` flattened images through ``layers``, ``[N, output_dim]``."""
    image = x.reshape(x.shape[0], *encoder.shape)
    if not encoder.channels_first:
        image = image.permute(0, 3, 1, 2)  # NHWC -> NCHW
    if encoder.divisor != 1.0:
        image = image / encoder.divisor
    out: torch.Tensor = layers(image)
    return out
