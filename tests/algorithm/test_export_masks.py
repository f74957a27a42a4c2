"""ONNX export of masked policies: the best legal action, as the numpy policy takes it."""

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
from rlserve.policy.action_mask import MASKED_LOGIT
from rlserve.protocol.spaces import describe
from rlserve.run.run_folder import RunFolder

pytestmark = pytest.mark.timeout(300)

OBS = gym.spaces.Dict(
    {
        "action_mask": gym.spaces.MultiBinary(5),
        "observations": gym.spaces.Box(-np.inf, np.inf, (3,), np.float32),
    }
)


def _obs(rows: int, sizes: tuple[int, ...]) -> np.ndarray:
    rng = np.random.default_rng(0)
    mask = (rng.random((rows, 5)) < 0.4).astype(np.float32)
    begin = 0
    for size in sizes:  # one legal choice or more per sub-action
        mask[np.arange(rows), begin + rng.integers(0, size, rows)] = 1.0
        begin += size
    return np.concatenate([mask, rng.normal(0, 2, (rows, 3)).astype(np.float32)], axis=1)


def _save(tmp_path: Path, act: gym.Space[Any], tables: dict[str, Any], learner: Any) -> Path:
    run = RunFolder.create(str(tmp_path), "run")
    run.save(tables, {"observation_space": describe(OBS), "action_space": describe(act)})
    with torch.no_grad():  # spread the weights so that the mask changes some choices
        for p in learner.model.parameters():
            p.normal_(0.0, 0.6)
    (run.path / "checkpoints").mkdir()
    learner.save(run.path / "checkpoints" / "ckpt_0000000.pt", {"server": {}})
    return run.path


@pytest.mark.parametrize(
    ("act", "sizes"),
    [(gym.spaces.Discrete(5, start=1), (5,)), (gym.spaces.MultiDiscrete([2, 3]), (2, 3))],
    ids=["discrete", "multi_discrete"],
)
def test_a_masked_ppo_policy_exports_its_best_legal_action(
    tmp_path: Path, act: gym.Space[Any], sizes: tuple[int, ...]
) -> None:
    config = PPOSettings(hidden=(16,), device="cpu", seed=3, normalize_observations=True)
    learner = PPOLearner(OBS, act, config)
    run = _save(tmp_path, act, {"server": {}, "ppo": to_table(config)}, learner)
    package = learner.weights()
    policy = NumpyPolicy(package.spec, package.arrays, package.version)
    path = export_onnx(run)
    x = _obs(200, sizes)
    outputs = ort.InferenceSession(str(path)).run(None, {"obs": x})
    action, params = outputs[0], outputs[1]
    legal = x[:, :5] > 0.5
    np.testing.assert_allclose(params[legal], policy.forward(x)[legal], atol=1e-5)
    assert (params[~legal] == np.float32(MASKED_LOGIT)).all()
    greedy = policy.to_env_actions(policy.compute_actions(x, explore=False).actions)
    np.testing.assert_array_equal(action, greedy)
    description = json.loads(Path(f"{path}.json").read_text())
    assert description["model"]["action_mask"] == {"start": 0, "size": 5}
    assert len(description["model"]["obs_mean"]) == 3  # the observation without its mask


def test_a_masked_dqn_policy_exports_its_best_legal_action(tmp_path: Path) -> None:
    act = gym.spaces.Discrete(5)
    settings = DQNSettings(hidden=(16,), device="cpu", seed=3, exploration_steps=0)
    learner = DQNLearner(OBS, act, settings)
    tables = {"server": {}, "algorithm": {"name": "dqn"}, "dqn": to_table(settings)}
    run = _save(tmp_path, act, tables, learner)
    package = learner.weights()
    policy = NumpyPolicy(package.spec, package.arrays, package.version)
    x = _obs(200, (5,))
    action, q_values = ort.InferenceSession(str(export_onnx(run))).run(None, {"obs": x})
    legal = x[:, :5] > 0.5
    assert legal[np.arange(200), action].all()
    np.testing.assert_array_equal(action, policy.compute_actions(x, explore=False).actions)
    np.testing.assert_allclose(q_values[legal], policy.forward(x)[legal], atol=1e-4)
    assert (action != policy.forward(x).argmax(axis=1)).any()  # the mask changed some choices
