"""ONNX export runs to the same actions as the server's numpy policy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import onnx
import onnxruntime as ort
import pytest

from float_paths import assert_same_choices
from rlserve.algorithm.export import export_onnx
from rlserve.config.fields import build, to_table
from rlserve.errors import ConfigError
from rlserve.learners.ppo import PPOLearner, PPOSettings
from rlserve.policy import NumpyPolicy
from rlserve.protocol.spaces import check_batch, describe
from rlserve.run.run_folder import RunFolder

pytestmark = pytest.mark.timeout(300)

DISCRETE_2 = gym.spaces.Discrete(2)


def make_run(
    tmp_path: Path, obs: gym.Space[Any], act: gym.Space[Any], **settings: Any
) -> tuple[Path, NumpyPolicy]:
    config = PPOSettings(hidden=(16, 16), device="cpu", seed=3, **settings)
    run = RunFolder.create(str(tmp_path), "run")
    run.save(
        {"server": {}, "ppo": to_table(config)},
        {"observation_space": describe(obs), "action_space": describe(act)},
    )
    learner = PPOLearner(obs, act, config)
    (run.path / "checkpoints").mkdir()
    learner.save(run.path / "checkpoints" / "ckpt_0000000.pt", {"server": {}})
    package = learner.weights()
    return run.path, NumpyPolicy(package.spec, package.arrays, package.version)


def test_discrete_policy_exports_to_the_same_actions(tmp_path: Path) -> None:
    obs_space = gym.spaces.Box(-2.0, 2.0, (5,), np.float32)
    run, policy = make_run(tmp_path, obs_space, gym.spaces.Discrete(3, start=10))
    path = export_onnx(run)
    session = ort.InferenceSession(str(path))
    x = np.random.default_rng(0).uniform(-2, 2, (64, 5)).astype(np.float32)
    action, logits = session.run(["action", "logits"], {"obs": x})
    np.testing.assert_allclose(logits, policy.forward(x), atol=1e-5)
    greedy = policy.to_env_actions(policy.compute_actions(x, explore=False).actions)
    # ONNX Runtime's logits are numpy's to 1e-5, not bit for bit: a near-tie may go either way.
    assert_same_choices(action - 10, greedy - 10, logits, tol=2e-5)
    assert set(action.tolist()) <= {10, 11, 12}
    description = json.loads(Path(f"{path}.json").read_text())
    assert description["inputs"]["obs"] == {
        "shape": ["N", 5],
        "dtype": "float32",
        "columns": [
            {"key": "", "start": 0, "stop": 5, "type": "Box", "encoding": "values", "shape": [5]}
        ],
    }
    assert set(description["outputs"]) == {"action", "logits"}


def env_params(policy: NumpyPolicy, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The actor's outputs with Gaussian means in the space's units, and their log-stds."""
    out = policy.forward(x).astype(np.float64)
    dist = policy.distribution
    log_std: list[float] = []
    param = column = gauss = 0
    for part in dist.parts:
        if part.kind == "gaussian":
            cols = slice(column, column + part.size)
            scale = np.asarray(dist.scale[cols] or (1.0,) * part.size)
            bias = np.asarray(dist.bias[cols] or (0.0,) * part.size)
            out[:, param : param + part.size] = out[:, param : param + part.size] * scale + bias
            log_std.extend(np.log(scale) + policy._log_std[gauss : gauss + part.size])
            gauss += part.size
        param += part.size
        column += part.action_width
    return out, np.asarray(log_std)


@pytest.mark.parametrize("normalize_actions", [True, False])
def test_box_policy_exports_mean_clipped_action_and_log_std(
    tmp_path: Path, normalize_actions: bool
) -> None:
    """The mean and log-std are in the space's units, with normalised actions or without."""
    act_space = gym.spaces.Box(-0.01, 0.01, (2,), np.float32)
    run, policy = make_run(
        tmp_path,
        gym.spaces.Box(-1.0, 1.0, (3,), np.float32),
        act_space,
        normalize_actions=normalize_actions,
    )
    scale = np.float32(0.01) if normalize_actions else np.float32(1.0)
    assert policy.distribution.scaled is normalize_actions
    path = export_onnx(run, output=tmp_path / "p.onnx")
    session = ort.InferenceSession(str(path))
    x = np.random.default_rng(1).uniform(-1, 1, (32, 3)).astype(np.float32)
    action, mean, log_std = session.run(["action", "mean", "log_std"], {"obs": x})
    np.testing.assert_allclose(mean, policy.forward(x) * scale, atol=1e-6)
    greedy = policy.to_env_actions(policy.compute_actions(x, explore=False).actions)
    np.testing.assert_allclose(action, greedy, atol=1e-7)
    np.testing.assert_allclose(action, np.clip(policy.forward(x) * scale, -0.01, 0.01), atol=1e-7)
    np.testing.assert_allclose(log_std, np.full(2, np.log(scale)), atol=1e-6)
    description = json.loads(Path(f"{path}.json").read_text())
    assert ("action_scale" in description["model"]) is normalize_actions


def test_export_needs_a_checkpoint(tmp_path: Path) -> None:
    run = RunFolder.create(str(tmp_path), "empty")
    run.save(
        {"server": {}, "ppo": {}},
        {
            "observation_space": describe(gym.spaces.Box(-1, 1, (2,))),
            "action_space": describe(gym.spaces.Discrete(2)),
        },
    )
    with pytest.raises(ConfigError, match="no checkpoint"):
        export_onnx(run.path)
    with pytest.raises(ConfigError, match="not a run folder"):
        export_onnx(tmp_path / "missing")


def test_a_missing_or_foreign_checkpoint_is_named_with_the_fix(tmp_path: Path) -> None:
    run, _ = make_run(tmp_path, gym.spaces.Box(-1.0, 1.0, (3,), np.float32), DISCRETE_2)
    with pytest.raises(ConfigError, match=r"no such file.*newest: ckpt_0000000\.pt"):
        export_onnx(run, checkpoint=tmp_path / "missing.pt")
    other, _ = make_run(tmp_path / "other", gym.spaces.Box(-1.0, 1.0, (5,), np.float32), DISCRETE_2)
    foreign = other / "checkpoints" / "ckpt_0000000.pt"
    with pytest.raises(ConfigError, match=r"is not a checkpoint of policy 'default'.*size"):
        export_onnx(run, checkpoint=foreign)
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a checkpoint")
    with pytest.raises(ConfigError, match="is not a checkpoint of policy 'default'"):
        export_onnx(run, checkpoint=garbage)


def test_the_onnx_file_is_self_contained(tmp_path: Path) -> None:
    run, policy = make_run(tmp_path, gym.spaces.Box(-1.0, 1.0, (3,), np.float32), DISCRETE_2)
    path = export_onnx(run, output=tmp_path / "out" / "policy.onnx")
    assert sorted(p.name for p in path.parent.iterdir()) == ["policy.onnx", "policy.onnx.json"]
    alone = tmp_path / "engine" / "policy.onnx"
    alone.parent.mkdir()
    alone.write_bytes(path.read_bytes())  # copied alone, as into a game's assets
    onnx.checker.check_model(onnx.load(str(alone)))
    x = np.random.default_rng(2).uniform(-1, 1, (8, 3)).astype(np.float32)
    (logits,) = ort.InferenceSession(str(alone)).run(["logits"], {"obs": x})
    np.testing.assert_allclose(logits, policy.forward(x), atol=1e-5)


STRUCTURED: dict[str, gym.Space[Any]] = {
    "multi_discrete": gym.spaces.MultiDiscrete([3, 4], start=[1, -2]),
    "multi_binary": gym.spaces.MultiBinary(3),
    "box_2d": gym.spaces.Box(-0.02, 0.02, (2, 2), np.float32),
    "dict": gym.spaces.Dict(
        {"gear": gym.spaces.Discrete(3, start=5), "steer": gym.spaces.Box(-0.01, 0.01, (1,))}
    ),
    "tuple": gym.spaces.Tuple((gym.spaces.MultiBinary(2), gym.spaces.MultiDiscrete([2, 2]))),
}


@pytest.mark.parametrize("name", list(STRUCTURED))
def test_every_action_space_exports_to_the_numpy_greedy_action(tmp_path: Path, name: str) -> None:
    act_space = STRUCTURED[name]
    obs_space = gym.spaces.Box(-3.0, 3.0, (4,), np.float32)
    run, policy = make_run(tmp_path, obs_space, act_space)
    path = export_onnx(run)
    description = json.loads(Path(f"{path}.json").read_text())
    session = ort.InferenceSession(str(path))
    assert [o.name for o in session.get_outputs()] == list(description["outputs"])
    x = np.random.default_rng(3).uniform(-3, 3, (32, 4)).astype(np.float32)
    outputs = dict(zip(description["outputs"], session.run(None, {"obs": x}), strict=True))
    params = outputs.get("params", outputs.get("mean"))
    expected_params, expected_log_std = env_params(policy, x)
    np.testing.assert_allclose(params, expected_params, atol=1e-5)
    greedy = policy.to_env_actions(policy.compute_actions(x, explore=False).actions)
    action = outputs["action"]
    assert str(action.dtype) == description["outputs"]["action"]["dtype"]
    np.testing.assert_allclose(action.reshape(len(x), -1), greedy.reshape(len(x), -1), atol=1e-6)
    if "log_std" in outputs:
        np.testing.assert_allclose(outputs["log_std"], expected_log_std, atol=1e-6)
    # The Box values act in units of their bounds (normalize_actions' default).
    assert policy.distribution.scaled is (name in ("box_2d", "dict"))


def test_export_picks_one_policy_of_a_run_with_several(tmp_path: Path) -> None:
    """``--policy ID``: the policy's own spaces, PPO overrides and checkpoints."""
    from rlserve.server.policies import PolicySpec, policy_paths, run_folder_form

    wide = PolicySpec(
        "wide", gym.spaces.Box(-1.0, 1.0, (3,), np.float32), DISCRETE_2, config={"hidden": [32]}
    )
    narrow = PolicySpec("narrow", gym.spaces.Box(-1.0, 1.0, (5,), np.float32), DISCRETE_2)
    top = to_table(PPOSettings(hidden=(16, 16), device="cpu"))
    run = RunFolder.create(str(tmp_path), "two")
    extra, spaces = run_folder_form({"wide": wide, "narrow": narrow}, None)
    run.save({"server": {}, "ppo": top, **extra}, spaces)
    learners = {}
    for spec in (wide, narrow):
        config = build(PPOSettings, spec.ppo_table(top), None)
        learner = PPOLearner(spec.observation_space, spec.action_space, config)
        folder = policy_paths(run.path, spec.policy_id, flat=False).checkpoints
        folder.mkdir(parents=True)
        learner.save(folder / "ckpt_0000000.pt", {})
        learners[spec.policy_id] = learner
    path = export_onnx(run.path, policy_id="narrow")
    assert path == run.path / "policy-narrow.onnx"
    x = np.random.default_rng(4).uniform(-1, 1, (8, 5)).astype(np.float32)
    package = learners["narrow"].weights()
    policy = NumpyPolicy(package.spec, package.arrays, package.version)
    (logits,) = ort.InferenceSession(str(path)).run(["logits"], {"obs": x})
    np.testing.assert_allclose(logits, policy.forward(x), atol=1e-5)
    description = json.loads(Path(f"{path}.json").read_text())
    assert description["checkpoint"].endswith("policies/narrow/checkpoints/ckpt_0000000.pt")
    assert description["inputs"]["obs"]["shape"] == ["N", 5]
    wide_path = export_onnx(run.path, policy_id="wide")
    assert json.loads(Path(f"{wide_path}.json").read_text())["inputs"]["obs"]["shape"] == ["N", 3]
    with pytest.raises(ConfigError, match=r"no policy 'default'.*wide, narrow"):
        export_onnx(run.path)


def test_a_dict_observations_columns_are_in_the_json(tmp_path: Path) -> None:
    """An engine fills ``obs`` key by key: the JSON says where each key's values go."""
    obs_space = gym.spaces.Dict(
        {"speed": gym.spaces.Box(-1.0, 1.0, (2,), np.float32), "lane": gym.spaces.Discrete(3)}
    )
    run, policy = make_run(tmp_path, obs_space, DISCRETE_2)
    path = export_onnx(run)
    obs = json.loads(Path(f"{path}.json").read_text())["inputs"]["obs"]
    lane, speed = obs["columns"]
    assert lane == {
        "key": "lane", "start": 0, "stop": 3, "type": "Discrete", "encoding": "one_hot", "n": 3,
        "value_start": 0,
    }  # fmt: skip
    assert (speed["key"], speed["start"], speed["stop"]) == ("speed", 3, 5)
    # Filled from the layout, the columns give the server's actions.
    x = np.zeros((1, obs["shape"][1]), np.float32)
    x[0, lane["start"] + 2] = 1.0
    x[0, speed["start"] : speed["stop"]] = [0.5, -0.25]
    value = {"lane": 2, "speed": np.array([0.5, -0.25], np.float32)}
    served = policy.forward(check_batch(obs_space, [value], 1, "obs"))  # the server's flattening
    (logits,) = ort.InferenceSession(str(path)).run(["logits"], {"obs": x})
    np.testing.assert_allclose(logits, served, atol=1e-5)
