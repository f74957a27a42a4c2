"""ONNX export of policies with memory: the recurrent state as an explicit input and output."""

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
from rlserve.learners.ppo import PPOLearner, PPOSettings
from rlserve.policy import NumpyPolicy
from rlserve.protocol.spaces import describe
from rlserve.run.run_folder import RunFolder

pytestmark = pytest.mark.timeout(300)

MASKED = gym.spaces.Dict(
    {
        "action_mask": gym.spaces.MultiBinary(4),
        "observations": gym.spaces.Box(-2.0, 2.0, (3,), np.float32),
    }
)


def _run(tmp_path: Path, obs: gym.Space[Any], act: gym.Space[Any]) -> tuple[Path, NumpyPolicy]:
    config = PPOSettings(hidden=(16,), device="cpu", seed=5, use_lstm=True, lstm_cell_size=8)
    learner = PPOLearner(obs, act, config)
    with torch.no_grad():  # spread the weights so that the state matters to the actions
        for p in learner.model.parameters():
            p.normal_(0.0, 0.5)
    run = RunFolder.create(str(tmp_path), "run")
    run.save(
        {"server": {}, "ppo": to_table(config)},
        {"observation_space": describe(obs), "action_space": describe(act)},
    )
    (run.path / "checkpoints").mkdir()
    learner.save(run.path / "checkpoints" / "ckpt_0000000.pt", {"server": {}})
    package = learner.weights()
    return run.path, NumpyPolicy(package.spec, package.arrays, package.version)


def _episode(rows: int, steps: int, width: int, masked: bool) -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    frames = []
    for _ in range(steps):
        x = rng.uniform(-2, 2, (rows, width)).astype(np.float32)
        if masked:
            mask = (rng.random((rows, 4)) < 0.5).astype(np.float32)
            mask[np.arange(rows), rng.integers(0, 4, rows)] = 1.0
            x = np.concatenate([mask, x[:, : width - 4]], axis=1)
        frames.append(x)
    return frames


@pytest.mark.parametrize(
    ("obs", "act"),
    [
        (gym.spaces.Box(-2.0, 2.0, (3,), np.float32), gym.spaces.Discrete(4)),
        (gym.spaces.Box(-2.0, 2.0, (3,), np.float32), gym.spaces.Box(-1.0, 1.0, (2,))),
        (MASKED, gym.spaces.Discrete(4)),
    ],
    ids=["discrete", "box", "masked"],
)
def test_an_episode_through_onnx_matches_the_numpy_policy_step_by_step(
    tmp_path: Path, obs: gym.Space[Any], act: gym.Space[Any]
) -> None:
    run, policy = _run(tmp_path, obs, act)
    path = export_onnx(run)
    session = ort.InferenceSession(str(path))
    description = json.loads(Path(f"{path}.json").read_text())
    assert description["inputs"]["state_in"] == {"shape": ["N", 16], "dtype": "float32"}
    assert description["outputs"]["state_out"] == {"shape": ["N", 16], "dtype": "float32"}
    assert description["model"]["memory"] == {"kind": "lstm", "cell_size": 8}
    names = [o.name for o in session.get_outputs()]
    assert names[-1] == "state_out"
    width = int(gym.spaces.flatdim(obs))
    rows = 5
    onnx_state = numpy_state = policy.initial_state(rows)
    for x in _episode(rows, 6, width, obs is MASKED):
        run = session.run(None, {"obs": x, "state_in": onnx_state})
        outputs = dict(zip(names, run, strict=True))
        greedy = policy.compute_actions(x, explore=False, state=numpy_state)
        np.testing.assert_allclose(outputs["state_out"], greedy.state, atol=1e-5)
        params = outputs["logits" if "logits" in outputs else "mean"]
        head, _ = policy.recurrent_forward(x, numpy_state)
        legal = np.isfinite(params) & (params > -1e30)
        np.testing.assert_allclose(params[legal], head[legal], atol=1e-5)
        if isinstance(act, gym.spaces.Discrete):
            np.testing.assert_array_equal(outputs["action"], greedy.actions)
        onnx_state, numpy_state = outputs["state_out"], greedy.state
    assert np.abs(numpy_state).max() > 1e-3  # the state moved: the test exercised it
