"""ONNX export of conv policies: onnxruntime computes what the numpy policy computes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import onnxruntime as ort
import pytest
import torch

from rlserve.algorithm.export import export_onnx
from rlserve.config.fields import to_table
from rlserve.learners.dqn import DQNLearner
from rlserve.learners.dqn_config import DQNSettings
from rlserve.learners.ppo import PPOLearner, PPOSettings
from rlserve.policy import NumpyPolicy
from rlserve.protocol.spaces import describe
from rlserve.run.run_folder import RunFolder

pytestmark = pytest.mark.timeout(300)

ACT = gym.spaces.Discrete(3)


def _save(tmp_path: Path, obs: gym.Space[Any], tables: dict[str, Any], learner: Any) -> Path:
    run = RunFolder.create(str(tmp_path), "run")
    run.save(tables, {"observation_space": describe(obs), "action_space": describe(ACT)})
    torch.manual_seed(0)
    with torch.no_grad():  # spread the weights so that the choices differ between images
        for p in learner.model.parameters():
            p.normal_(0.0, 0.3)
    (run.path / "checkpoints").mkdir()
    learner.save(run.path / "checkpoints" / "ckpt_0000000.pt", {"server": {}})
    return run.path


def _images(space: gym.spaces.Box, rows: int) -> np.ndarray:
    rng = np.random.default_rng(2)
    return rng.integers(0, 256, (rows, *space.shape)).reshape(rows, -1).astype(np.float32)


@pytest.mark.parametrize("shape", [(8, 9, 3), (2, 8, 8)], ids=["channels_last", "channels_first"])
def test_a_conv_ppo_policy_exports_what_the_numpy_policy_computes(
    tmp_path: Path, shape: tuple[int, int, int]
) -> None:
    obs = gym.spaces.Box(0, 255, shape, np.uint8)
    config = PPOSettings(hidden=(16,), device="cpu", conv_filters=((4, 3, 2), (8, 2, 1)))
    learner = PPOLearner(obs, ACT, config)
    run = _save(tmp_path, obs, {"server": {}, "ppo": to_table(config)}, learner)
    package = learner.weights()
    policy = NumpyPolicy(package.spec, package.arrays, package.version)
    path = export_onnx(run)
    x = _images(obs, 50)
    action, logits = ort.InferenceSession(str(path)).run(None, {"obs": x})
    np.testing.assert_allclose(logits, policy.forward(x), rtol=1e-5, atol=1e-5)
    greedy = policy.to_env_actions(policy.compute_actions(x, explore=False).actions)
    np.testing.assert_array_equal(action, greedy)
    assert len(set(action.tolist())) > 1
    description = json.loads(Path(f"{path}.json").read_text())
    assert description["model"]["encoder"]["images"][0]["shape"] == list(shape)
    assert description["inputs"]["obs"]["shape"] == ["N", int(np.prod(shape))]


def test_a_dict_of_an_image_and_a_vector_exports_too(tmp_path: Path) -> None:
    obs = gym.spaces.Dict(
        {
            "camera": gym.spaces.Box(0, 255, (6, 6, 2), np.uint8),
            "speed": gym.spaces.Box(-2.0, 2.0, (3,), np.float32),
        }
    )
    config = PPOSettings(hidden=(16,), device="cpu")
    learner = PPOLearner(obs, ACT, config)
    run = _save(tmp_path, obs, {"server": {}, "ppo": to_table(config)}, learner)
    package = learner.weights()
    assert package.spec.encoder is not None and len(package.spec.encoder.images) == 1
    policy = NumpyPolicy(package.spec, package.arrays, package.version)
    path = export_onnx(run)
    obs.seed(0)
    x = np.stack([gym.spaces.flatten(obs, obs.sample()) for _ in range(30)]).astype(np.float32)
    action, logits = ort.InferenceSession(str(path)).run(None, {"obs": x})
    np.testing.assert_allclose(logits, policy.forward(x), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(action, logits.argmax(axis=1))


def test_a_conv_dqn_policy_exports_its_q_values(tmp_path: Path) -> None:
    obs = gym.spaces.Box(0, 255, (36, 36, 1), np.uint8)  # the Nature stack and its 512 layer
    config = DQNSettings(hidden=(), device="cpu", dueling=True)
    learner = DQNLearner(obs, ACT, config)
    run = _save(
        tmp_path,
        obs,
        {"server": {}, "algorithm": {"name": "dqn"}, "dqn": to_table(config)},
        learner,
    )
    package = learner.weights()
    policy = NumpyPolicy(package.spec, package.arrays, package.version)
    path = export_onnx(run)
    x = _images(obs, 20)
    action, q_values = ort.InferenceSession(str(path)).run(None, {"obs": x})
    # Outputs in the hundreds (spread weights through 512 units): float32 rounding of their size.
    scale = float(np.abs(q_values).max())
    np.testing.assert_allclose(q_values, policy.forward(x), rtol=1e-5, atol=1e-5 * scale)
    np.testing.assert_array_equal(action, q_values.argmax(axis=1))
