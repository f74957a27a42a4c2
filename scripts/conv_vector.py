"""The conv forward-pass vector, ``docs/protocol-vectors/conv-forward-pass.json``.

A tiny image policy, small enough to check by hand (``docs/protocol.md`` section 7.9,
``encoder``): a 4x4 uint8 image of one channel (channels-last, ``(4, 4, 1)``), divided by 255,
one convolution of 2 filters 2x2 with stride 2 and ReLU, flattened in channel, row, column order
(8 values), then the categorical head (a linear layer of 3 logits). The weights are multiples of
1/8 and the pixels multiples of 51 (so each scaled pixel is a fifth); computed by
:class:`rlserve.policy.NumpyPolicy` and written with the format of ``forward-pass.json``.
No server needed: ``.venv/bin/python scripts/conv_vector.py`` rewrites the file.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from protocol_vectors import FOLDER, FORMAT, TOLERANCE, dump, to_tagged

from rlserve.policy.image_encoder import EncoderLayer, ImageEncoder, ObservationEncoder
from rlserve.policy.model_spec import ModelSpec
from rlserve.policy.numpy_policy import NumpyPolicy

PATH = FOLDER / "conv-forward-pass.json"

IMAGE = np.array([[0, 51, 102, 153], [204, 255, 0, 51], [102, 102, 255, 0], [51, 0, 153, 204]])
"""The observation: row by row, one channel."""

CONV_WEIGHT = np.array(
    [[[[0.5, -0.25], [0.125, 1.0]]], [[[-1.0, 0.75], [0.5, -0.375]]]], dtype=np.float32
)
"""``encoder.0.0.weight``, ``[filters, in_channels, kh, kw]`` = ``[2, 1, 2, 2]``."""

CONV_BIAS = np.array([0.125, 0.25], dtype=np.float32)

HEAD_WEIGHT = (np.arange(24, dtype=np.float32).reshape(3, 8) % 7 - 3) / 8
"""``actor.0.weight``, ``[3, 8]``: (i mod 7 - 3) / 8 in row-major order."""

HEAD_BIAS = np.array([0.0, 0.125, -0.125], dtype=np.float32)


def tiny_conv() -> dict[str, Any]:
    """The vector: model, arrays, observation and every intermediate result."""
    conv = EncoderLayer("encoder.0.0", "conv", 2, (2, 2), (2, 2))
    encoder = ObservationEncoder(16, (ImageEncoder((4, 4, 1), False, 255.0, (conv,)),))
    spec = ModelSpec(16, ("actor.0",), "tanh", "categorical", 3, encoder=encoder)
    arrays = {
        "encoder.0.0.weight": CONV_WEIGHT,
        "encoder.0.0.bias": CONV_BIAS,
        "actor.0.weight": HEAD_WEIGHT,
        "actor.0.bias": HEAD_BIAS,
    }
    policy = NumpyPolicy(spec, arrays, 0)
    obs = IMAGE.reshape(1, 16).astype(np.float32)
    features = policy._encoder(obs)[0]  # type: ignore[misc]
    logits = policy.forward(obs)[0]
    shifted = logits - logits.max()
    log_probs = shifted - np.log(np.exp(shifted).sum())
    return {
        "name": "tiny_conv",
        "model": spec.to_wire(),
        "arrays": {name: to_tagged(a) for name, a in arrays.items()},
        "observation": obs[0].tolist(),
        "scaled_image": (IMAGE.astype(np.float32) / np.float32(255.0)).tolist(),
        "feature_maps": features.reshape(2, 2, 2).tolist(),
        "features": features.tolist(),
        "logits": logits.tolist(),
        "log_probabilities": log_probs.tolist(),
        "greedy_choice": int(logits.argmax()),
        "greedy_action": int(logits.argmax()),
    }


def conv_vector_file() -> str:
    """The file's text."""
    return dump({"format": FORMAT, "tolerance": TOLERANCE, "policies": [tiny_conv()]})


if __name__ == "__main__":
    PATH.write_text(conv_vector_file())
    print(f"wrote {PATH}")
