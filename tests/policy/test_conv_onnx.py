"""The conv encoder in onnxruntime: the numpy pass's features, the switch and the fallback."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from rlserve.errors import ConfigError
from rlserve.policy import ModelSpec, NumpyPolicy
from rlserve.policy.conv_forward import ObservationForward
from rlserve.policy.conv_onnx import BACKEND_ENV, OnnxObservationForward, observation_forward
from rlserve.policy.encoder_choice import choose_encoder
from rlserve.policy.image_encoder import ObservationEncoder

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

SRC = Path(__file__).resolve().parents[2] / "src"


def _weights(encoder: ObservationEncoder, seed: int = 0) -> dict[str, np.ndarray]:
    """Random weights of every layer, scaled so the features are neither all zero nor huge."""
    rng = np.random.default_rng(seed)
    weights: dict[str, np.ndarray] = {}
    for image in encoder.images:
        c, h, w = image.feature_maps()[-1]
        channels, width = image.hwc[2], c * h * w
        for layer in image.layers:
            if layer.kind == "conv":
                fan_in = channels * layer.kernel[0] * layer.kernel[1]
                shape: tuple[int, ...] = (layer.size, channels, *layer.kernel)
                channels = layer.size
            else:
                fan_in, shape, width = width, (layer.size, width), layer.size
            weights[f"{layer.name}.weight"] = rng.normal(0, fan_in**-0.5, shape).astype(np.float32)
            weights[f"{layer.name}.bias"] = rng.normal(0, 0.1, layer.size).astype(np.float32)
    return weights


def _observations(space: gym.spaces.Space, rows: int) -> np.ndarray:
    space.seed(1)
    return np.stack([np.asarray(gym.spaces.flatten(space, space.sample())) for _ in range(rows)])


def _same_features(space: gym.spaces.Space, rows: int = 5) -> ObservationEncoder:
    encoder = choose_encoder(space)
    assert encoder is not None
    weights = _weights(encoder)
    fast, slow = OnnxObservationForward(encoder, weights), ObservationForward(encoder, weights)
    for batch in (1, rows):
        x = _observations(space, batch)
        got, want = fast(x), slow(x)
        assert got.dtype == np.float32 and got.shape == (batch, encoder.output_dim)
        assert np.abs(want).max() > 0.1  # the ReLUs left something to compare
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    return encoder


def test_nature_stack_on_84x84x4_uint8_frames_matches_numpy() -> None:
    encoder = _same_features(gym.spaces.Box(0, 255, (84, 84, 4), np.uint8), rows=3)
    assert encoder.images[0].divisor == 255.0 and not encoder.images[0].channels_first


def test_small_stack_on_channels_first_floats_matches_numpy() -> None:
    encoder = _same_features(gym.spaces.Box(0.0, 1.0, (3, 7, 7), np.float32))
    assert encoder.images[0].channels_first and encoder.images[0].divisor == 1.0


def test_a_dict_of_an_image_between_vectors_matches_numpy() -> None:
    space = gym.spaces.Dict(
        {
            "a_speed": gym.spaces.Box(-1, 1, (2,), np.float32),
            "camera": gym.spaces.Box(0, 255, (7, 7, 3), np.uint8),
            "z_goal": gym.spaces.Box(-5, 5, (3,), np.float32),
        }
    )
    encoder = _same_features(space)
    assert encoder.images[0].start == 2 and encoder.input_dim == 2 + 147 + 3


def test_the_policy_takes_onnxruntime_unless_numpy_is_forced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    encoder = choose_encoder(gym.spaces.Box(0, 255, (7, 7, 3), np.uint8))
    assert encoder is not None
    weights = _weights(encoder)
    weights.update(
        {
            "actor.0.weight": np.full((3, encoder.output_dim), 0.01, np.float32),
            "actor.0.bias": np.zeros(3, np.float32),
        }
    )
    spec = ModelSpec(encoder.input_dim, ("actor.0",), "relu", "categorical", 3, encoder=encoder)
    obs = _observations(gym.spaces.Box(0, 255, (7, 7, 3), np.uint8), 4)
    monkeypatch.delenv(BACKEND_ENV, raising=False)
    assert isinstance(observation_forward(encoder, weights), OnnxObservationForward)
    fast = NumpyPolicy(spec, weights, version=1).forward(obs)
    monkeypatch.setenv(BACKEND_ENV, "numpy")
    assert type(observation_forward(encoder, weights)) is ObservationForward
    slow = NumpyPolicy(spec, weights, version=1).forward(obs)
    np.testing.assert_allclose(fast, slow, rtol=1e-4, atol=1e-4)
    monkeypatch.setenv(BACKEND_ENV, "torch")
    with pytest.raises(ConfigError, match="auto, numpy, onnxruntime"):
        observation_forward(encoder, weights)


def test_missing_weights_are_the_numpy_pass_error() -> None:
    encoder = choose_encoder(gym.spaces.Box(0, 255, (7, 7, 3), np.uint8))
    assert encoder is not None
    weights = _weights(encoder)
    del weights["encoder.0.2.bias"]
    with pytest.raises(ConfigError, match=r"encoder\.0\.2\.bias"):
        observation_forward(encoder, weights)


_WITHOUT_ONNXRUNTIME = textwrap.dedent(
    """
    import logging, os, sys
    sys.modules["onnxruntime"] = None  # as if it were not installed
    import gymnasium as gym
    import numpy as np
    from rlserve.errors import ConfigError
    from rlserve.policy.conv_forward import ObservationForward
    from rlserve.policy.conv_onnx import observation_forward
    from rlserve.policy.encoder_choice import choose_encoder

    logging.basicConfig(level=logging.INFO, format="LOG %(levelname)s %(message)s")
    encoder = choose_encoder(gym.spaces.Box(0, 255, (7, 7, 3), np.uint8))
    weights = {}
    for layer, shape in zip(encoder.images[0].layers, [(16, 3), (32, 16), (64, 32)]):
        weights[layer.name + ".weight"] = np.ones((*shape, *layer.kernel), np.float32)
        weights[layer.name + ".bias"] = np.zeros(shape[0], np.float32)
    for _ in range(2):
        print(type(observation_forward(encoder, weights)).__name__)
    os.environ["RLSERVE_CONV_BACKEND"] = "onnxruntime"
    try:
        observation_forward(encoder, weights)
    except ConfigError as exc:
        print("REFUSED", exc)
    """
)


def test_without_onnxruntime_the_numpy_pass_runs_and_says_why_once() -> None:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    env.pop(BACKEND_ENV, None)
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_ONNXRUNTIME],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    lines = (done.stdout + done.stderr).splitlines()
    assert lines.count("ObservationForward") == 2
    logged = [line for line in lines if line.startswith("LOG")]
    assert len(logged) == 1, lines
    assert "runs in numpy" in logged[0] and "'.[images]'" in logged[0]
    (refused,) = [line for line in lines if line.startswith("REFUSED")]
    assert "pip install -e '.[images]'" in refused and "unset RLSERVE_CONV_BACKEND" in refused
