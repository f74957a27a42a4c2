"""ONNX export of a DQN run: the greedy choice and Q-values of the numpy policy."""

from __future__ import annotations

import json
from pathlib import Path

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
from rlserve.policy import NumpyPolicy
from rlserve.protocol.spaces import describe
from rlserve.run.run_folder import RunFolder

pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize("dueling", [False, True])
def test_a_dqn_run_exports_greedy_actions_and_q_values(tmp_path: Path, dueling: bool) -> None:
    obs_space = gym.spaces.Box(-2.0, 2.0, (5,), np.float32)
    act_space = gym.spaces.Discrete(3, start=10)
    settings = DQNSettings(
        hidden=(16, 16), dueling=dueling, device="cpu", seed=3, exploration_steps=0
    )
    run = RunFolder.create(str(tmp_path), "run")
    run.save(
        {"server": {}, "algorithm": {"name": "dqn"}, "dqn": to_table(settings)},
        {"observation_space": describe(obs_space), "action_space": describe(act_space)},
    )
    learner = DQNLearner(obs_space, act_space, settings)
    with torch.no_grad():  # spread the weights so that a mismatch in any layer shows
        for p in learner.model.parameters():
            p.normal_(0.0, 0.5)
    (run.path / "checkpoints").mkdir()
    learner.save(run.path / "checkpoints" / "ckpt_0000000.pt", {})
    package = learner.weights()
    policy = NumpyPolicy(package.spec, package.arrays, package.version)
    path = export_onnx(run.path)
    session = ort.InferenceSession(str(path))
    x = np.random.default_rng(0).uniform(-2, 2, (64, 5)).astype(np.float32)
    action, q_values = session.run(["action", "q_values"], {"obs": x})
    np.testing.assert_allclose(q_values, policy.forward(x), atol=1e-4)
    greedy = policy.to_env_actions(policy.compute_actions(x, explore=False).actions)
    assert_same_choices(action - 10, greedy - 10, q_values, tol=2e-4)  # q_values agree to 1e-4
    assert len(set(action.tolist())) > 1
    description = json.loads(Path(f"{path}.json").read_text())
    assert set(description["outputs"]) == {"action", "q_values"}
    assert description["model"]["distribution"] == "epsilon_greedy"
    assert description["model"]["epsilon"] == pytest.approx(DQNSettings().epsilon_end)
