"""ONNX export of a SAC run: the numpy policy's deterministic action and its Gaussian."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import numpy as np
import onnxruntime as ort
import pytest
import torch

from rlserve.algorithm.export import export_onnx
from rlserve.config.fields import to_table
from rlserve.learners.sac import SACLearner
from rlserve.learners.sac_config import SACSettings
from rlserve.policy import NumpyPolicy
from rlserve.protocol.spaces import describe
from rlserve.run.run_folder import RunFolder

pytestmark = pytest.mark.timeout(300)


def test_sac_run_exports_the_squashed_mode_and_its_gaussian(tmp_path: Path) -> None:
    obs_space = gym.spaces.Box(-2.0, 2.0, (4,), np.float32)
    act_space = gym.spaces.Box(
        np.array([-100.0, 0.0], np.float32), np.array([100.0, 0.5], np.float32)
    )
    config = SACSettings(hidden=(16, 16), device="cpu", seed=3)
    run = RunFolder.create(str(tmp_path), "run")
    run.save(
        {"server": {}, "sac": to_table(config), "algorithm": {"name": "sac"}},
        {"observation_space": describe(obs_space), "action_space": describe(act_space)},
    )
    learner = SACLearner(obs_space, act_space, config)
    with torch.no_grad():
        for p in learner.actor.parameters():
            p.normal_(0.0, 0.5)  # outputs that reach the tanh's curve and the log-std clamp
    (run.path / "checkpoints").mkdir()
    learner.save(run.path / "checkpoints" / "ckpt_0000000.pt", {"server": {}})
    package = learner.weights()
    policy = NumpyPolicy(package.spec, package.arrays, package.version)

    path = export_onnx(run.path)
    session = ort.InferenceSession(str(path))
    x = np.random.default_rng(0).uniform(-2, 2, (64, 4)).astype(np.float32)
    action, mean, log_std = session.run(["action", "mean", "log_std"], {"obs": x})
    greedy = policy.to_env_actions(policy.compute_actions(x, explore=False).actions)
    np.testing.assert_allclose(action, greedy, rtol=1e-5, atol=1e-4)
    params = policy.forward(x)
    np.testing.assert_allclose(mean, params[:, :2], atol=1e-5)
    np.testing.assert_allclose(log_std, np.clip(params[:, 2:], -20.0, 2.0), atol=1e-5)
    assert (action >= act_space.low).all() and (action <= act_space.high).all()
    description = json.loads(Path(f"{path}.json").read_text())
    assert set(description["outputs"]) == {"action", "mean", "log_std"}
    assert description["outputs"]["log_std"]["shape"] == ["N", 2]
    assert description["model"]["distribution"] == "squashed_gaussian"


def test_a_sac_actor_with_a_conv_encoder_exports_what_the_numpy_policy_computes(
    tmp_path: Path,
) -> None:
    obs_space = gym.spaces.Dict(
        {
            "camera": gym.spaces.Box(0, 255, (8, 9, 2), np.uint8),
            "speed": gym.spaces.Box(-2.0, 2.0, (3,), np.float32),
        }
    )
    act_space = gym.spaces.Box(-3.0, 3.0, (2,), np.float32)
    config = SACSettings(hidden=(16,), device="cpu", conv_filters=((4, 3, 2), (8, 2, 1)))
    run = RunFolder.create(str(tmp_path), "run")
    run.save(
        {"server": {}, "sac": to_table(config), "algorithm": {"name": "sac"}},
        {"observation_space": describe(obs_space), "action_space": describe(act_space)},
    )
    learner = SACLearner(obs_space, act_space, config)
    torch.manual_seed(0)
    with torch.no_grad():  # spread the weights so that the actions differ between images
        for p in learner.actor.parameters():
            p.normal_(0.0, 0.3)
    (run.path / "checkpoints").mkdir()
    learner.save(run.path / "checkpoints" / "ckpt_0000000.pt", {"server": {}})
    package = learner.weights()
    assert package.spec.encoder is not None
    policy = NumpyPolicy(package.spec, package.arrays, package.version)

    path = export_onnx(run.path)
    obs_space.seed(4)
    x = np.stack([gym.spaces.flatten(obs_space, obs_space.sample()) for _ in range(32)])
    x = x.astype(np.float32)
    action, mean, log_std = ort.InferenceSession(str(path)).run(
        ["action", "mean", "log_std"], {"obs": x}
    )
    params = policy.forward(x)
    np.testing.assert_allclose(mean, params[:, :2], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(log_std, np.clip(params[:, 2:], -20.0, 2.0), atol=1e-5)
    greedy = policy.to_env_actions(policy.compute_actions(x, explore=False).actions)
    np.testing.assert_allclose(action, greedy, rtol=1e-5, atol=1e-4)
    assert np.unique(np.round(action, 3), axis=0).shape[0] > 1
    description = json.loads(Path(f"{path}.json").read_text())
    assert description["model"]["encoder"]["images"][0]["shape"] == [8, 9, 2]
    assert description["inputs"]["obs"]["shape"] == ["N", 8 * 9 * 2 + 3]
