"""ONNX export of policies that normalise observations (and, PPO, act in normalised Box units).

The exported model takes the raw observation and must give what the numpy policy (server
inference, local clients) computes from the same weights version's model spec.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import onnxruntime as ort
import pytest
import torch

from float_paths import assert_same_choices
from rlserve.algorithm.export import export_onnx
from rlserve.config.fields import to_table
from rlserve.learners.dqn import DQNLearner
from rlserve.learners.dqn_config import DQNSettings
from rlserve.learners.ppo import PPOLearner
from rlserve.learners.ppo_config import PPOSettings
from rlserve.learners.sac import SACLearner
from rlserve.learners.sac_config import SACSettings
from rlserve.policy import NumpyPolicy
from rlserve.protocol.spaces import describe
from rlserve.run.run_folder import RunFolder

pytestmark = pytest.mark.timeout(300)

OBS = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
BOX_100 = gym.spaces.Box(
    np.array([-100.0, 0.0], np.float32), np.array([100.0, 10.0], np.float32), dtype=np.float32
)
SCALE = np.array([100.0, 1.0, 0.01, 5.0], np.float32)
OFFSET = np.array([1000.0, -5.0, 3.0, 0.0], np.float32)


def _observations(n: int, seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).normal(0, 1, (n, 4)) * SCALE + OFFSET).astype(np.float32)


def _run(tmp_path: Path, algo: str, settings: Any, learner: Any, act: gym.Space[Any]) -> Path:
    """Save ``learner`` as the checkpoint of a run; its statistics frozen from some data."""
    assert learner.obs_normalization is not None
    learner.obs_normalization.observe(_observations(500, seed=1))
    learner.obs_normalization.freeze()
    with torch.no_grad():  # spread the weights so that a mismatch in any layer shows
        for p in learner.model.parameters() if algo != "sac" else learner.actor.parameters():
            p.normal_(0.0, 0.5)
    run = RunFolder.create(str(tmp_path), "run")
    run.save(
        {"server": {}, "algorithm": {"name": algo}, algo: to_table(settings)},
        {"observation_space": describe(OBS), "action_space": describe(act)},
    )
    (run.path / "checkpoints").mkdir()
    learner.save(run.path / "checkpoints" / "ckpt_0000000.pt", {})
    return run.path


def _numpy_policy(learner: Any) -> NumpyPolicy:
    package = learner.weights()
    assert package.spec.obs_mean and package.spec.obs_mean[0] == pytest.approx(1000, abs=20)
    return NumpyPolicy(package.spec, package.arrays, package.version)


def _outputs(path: Path, x: np.ndarray) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    description = json.loads(Path(f"{path}.json").read_text())
    session = ort.InferenceSession(str(path))
    values = session.run(None, {"obs": x})
    return dict(zip(description["outputs"], values, strict=True)), description


def test_ppo_export_normalises_observations_and_scales_the_box(tmp_path: Path) -> None:
    settings = PPOSettings(hidden=(16, 16), device="cpu", seed=3, normalize_observations=True)
    learner = PPOLearner(OBS, BOX_100, settings)
    path = export_onnx(_run(tmp_path, "ppo", settings, learner, BOX_100))
    policy = _numpy_policy(learner)
    assert policy.spec.action_scale == (100.0, 5.0)
    x = _observations(64, seed=2)
    x[:4] += 1e5  # beyond the clip of the normalised observation
    outputs, description = _outputs(path, x)
    greedy = policy.compute_actions(x, explore=False).actions
    np.testing.assert_allclose(outputs["action"], policy.to_env_actions(greedy), atol=1e-4)
    np.testing.assert_allclose(outputs["mean"], greedy, rtol=1e-5, atol=1e-4)
    log_std = learner.model.log_std.detach().numpy()
    np.testing.assert_allclose(outputs["log_std"], log_std + np.log([100.0, 5.0]), atol=1e-6)
    assert len({round(float(v), 3) for v in outputs["action"][:, 0]}) > 10  # not saturated
    model = description["model"]
    assert model["obs_mean"] == list(policy.spec.obs_mean) and model["obs_clip"] == 10.0
    assert model["action_scale"] == [100.0, 5.0]


def test_dqn_export_normalises_observations(tmp_path: Path) -> None:
    act = gym.spaces.Discrete(3, start=1)
    settings = DQNSettings(hidden=(16,), device="cpu", seed=3, normalize_observations=True)
    learner = DQNLearner(OBS, act, settings)
    path = export_onnx(_run(tmp_path, "dqn", settings, learner, act))
    policy = _numpy_policy(learner)
    x = _observations(64, seed=2)
    outputs, _ = _outputs(path, x)
    np.testing.assert_allclose(outputs["q_values"], policy.forward(x), atol=1e-4)
    greedy = policy.to_env_actions(policy.compute_actions(x, explore=False).actions)
    assert_same_choices(outputs["action"] - 1, greedy - 1, outputs["q_values"], tol=2e-4)
    assert len(set(greedy.tolist())) > 1


def test_sac_export_normalises_observations(tmp_path: Path) -> None:
    settings = SACSettings(hidden=(16,), device="cpu", seed=3, normalize_observations=True)
    learner = SACLearner(OBS, BOX_100, settings)
    path = export_onnx(_run(tmp_path, "sac", settings, learner, BOX_100))
    policy = _numpy_policy(learner)
    x = _observations(64, seed=2)
    outputs, _ = _outputs(path, x)
    greedy = policy.to_env_actions(policy.compute_actions(x, explore=False).actions)
    np.testing.assert_allclose(outputs["action"], greedy, rtol=1e-5, atol=1e-4)
    params = policy.forward(x)
    np.testing.assert_allclose(outputs["mean"], params[:, :2], atol=1e-5)
