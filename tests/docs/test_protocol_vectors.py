"""rlserve's codec and numpy policy against docs/protocol-vectors/, in both directions."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "docs" / "protocol-vectors"
sys.path.insert(0, str(ROOT / "scripts"))

from protocol_vectors import from_tagged, to_tagged  # noqa: E402

from rlserve.policy.numpy_policy import ModelSpec, NumpyPolicy  # noqa: E402
from rlserve.protocol.codec import decode, encode, encode_json, to_jsonable  # noqa: E402

MESSAGES = json.loads((FOLDER / "messages.json").read_text())["vectors"]
POLICIES = {
    p["name"]: p for p in json.loads((FOLDER / "forward-pass.json").read_text())["policies"]
}


def same(a: Any, b: Any) -> bool:
    """Deep equality with arrays compared by dtype, shape and bytes (NaN equals NaN)."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (
            isinstance(a, np.ndarray)
            and isinstance(b, np.ndarray)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and a.tobytes() == b.tobytes()
        )
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


def test_every_message_type_and_dtype_has_a_vector():
    names = {v["name"] for v in MESSAGES}
    for kind in ("hello", "welcome", "start_episode", "episode_started", "get_action", "action",
                 "log_action", "log_returns", "end_episode", "ok", "ping", "pong", "error",
                 "get_weights", "weights", "report_samples", "samples_accepted",
                 "welcome_mapping", "get_action_agents", "action_agents", "action_agents_mixed",
                 "log_action_agents", "log_returns_agents", "end_episode_agents"):  # fmt: skip
        assert kind in names
    dtypes = {
        str(decode(bytes.fromhex(v["msgpack"]))["array"].dtype)
        for v in MESSAGES
        if v["name"].startswith("array_")
    }
    assert len(dtypes) == 12


@pytest.mark.parametrize("vector", MESSAGES, ids=[v["name"] for v in MESSAGES])
def test_codec_decodes_and_encodes_each_vector(vector):
    raw = bytes.fromhex(vector["msgpack"])
    value = from_tagged(vector["value"])
    assert same(decode(raw), value)
    assert encode(value) == raw
    assert to_tagged(decode(raw)) == vector["value"]


@pytest.mark.parametrize("vector", MESSAGES, ids=[v["name"] for v in MESSAGES])
def test_json_form_of_each_vector(vector):
    if vector["json"] is None:  # infinities: JSON cannot carry them
        return
    value = from_tagged(vector["value"])
    parsed = json.loads(vector["json"])
    assert same(parsed, to_jsonable(value))
    if "NaN" not in vector["json"]:
        assert encode_json(value).decode() == vector["json"]


def _policy(case: dict[str, Any]) -> tuple[NumpyPolicy, np.ndarray]:
    arrays = {k: from_tagged(v) for k, v in case["arrays"].items()}
    policy = NumpyPolicy(ModelSpec.from_wire(case["model"]), arrays, version=0)
    return policy, np.array([case["observation"]], np.float32)


def test_categorical_forward_pass_vector():
    case = POLICIES["tiny_categorical"]
    policy, obs = _policy(case)
    assert policy.forward(obs)[0].tolist() == case["logits"]
    n = case["model"]["action_dim"]
    logp = policy.log_prob(np.repeat(obs, n, 0), np.arange(n))
    assert logp.tolist() == case["log_probabilities"]
    assert np.allclose(np.exp(case["log_probabilities"]), case["probabilities"], atol=1e-6)
    assert math.isclose(sum(case["probabilities"]), 1.0, abs_tol=1e-9)
    assert case["sampled_log_probability"] == case["log_probabilities"][case["sampled_choice"]]
    greedy = policy.compute_actions(obs, explore=False)
    assert int(greedy.actions[0]) == case["greedy_choice"]
    assert int(policy.to_env_actions(greedy.actions)[0]) == case["greedy_action"]


def test_categorical_vector_by_hand():
    """The doc's arithmetic (section 14.4) in plain float64 reproduces the vector closely."""
    case = POLICIES["tiny_categorical"]
    arrays = {k: from_tagged(v).astype(np.float64) for k, v in case["arrays"].items()}
    x = np.array(case["observation"])
    h = np.tanh(arrays["actor.0.weight"] @ x + arrays["actor.0.bias"])
    y = arrays["actor.2.weight"] @ h + arrays["actor.2.bias"]
    assert np.allclose(h, case["hidden"], atol=1e-6)
    assert np.allclose(y, case["logits"], atol=1e-6)
    w = np.exp(y - y.max())
    u = case["uniform_draw"] * w.sum()
    assert int(np.argmax(np.cumsum(w) > u)) == case["sampled_choice"]


def test_gaussian_forward_pass_vector():
    case = POLICIES["tiny_gaussian"]
    policy, obs = _policy(case)
    assert policy.forward(obs)[0].tolist() == case["mean"]
    action = np.array([case["action"]], np.float32)
    assert float(policy.log_prob(obs, action)[0]) == case["action_log_probability"]
    assert policy.to_env_actions(action)[0].tolist() == case["clipped_action"]
    mean, log_std = np.array(case["mean"]), np.array(case["log_std"])
    e = (np.array(case["action"]) - mean) / np.exp(log_std)
    by_hand = -0.5 * (e**2).sum() - log_std.sum() - 0.5 * len(e) * math.log(2 * math.pi)
    assert math.isclose(by_hand, case["action_log_probability"], abs_tol=1e-5)


def test_normalized_gaussian_forward_pass_vector():
    case = POLICIES["tiny_gaussian_normalized"]
    policy, obs = _policy(case)
    model = case["model"]
    assert policy.spec.obs_mean == tuple(model["obs_mean"])
    assert policy.spec.action_scale == tuple(model["action_scale"])
    assert policy.normalize(obs)[0].tolist() == case["normalized_observation"]
    assert policy.forward(obs)[0].tolist() == case["mean"]
    greedy = policy.compute_actions(obs, explore=False).actions
    assert greedy[0].tolist() == case["greedy_action"]
    action = np.array([case["action"]], np.float32)
    assert float(policy.log_prob(obs, action)[0]) == case["action_log_probability"]
    assert policy.to_env_actions(action)[0].tolist() == case["clipped_action"]


def test_normalized_gaussian_vector_by_hand():
    """Section 14.4's normalisation, forward pass and scaled Gaussian in plain float64."""
    case = POLICIES["tiny_gaussian_normalized"]
    model = case["model"]
    arrays = {k: from_tagged(v).astype(np.float64) for k, v in case["arrays"].items()}
    o = np.array(case["observation"])
    clip = model["obs_clip"]
    x = np.clip((o - model["obs_mean"]) / np.array(model["obs_std"]), -clip, clip)
    assert x.tolist() == case["normalized_observation"] == [1.5, 1.0, -3.0]
    h = np.tanh(arrays["actor.0.weight"] @ x + arrays["actor.0.bias"])
    y = arrays["actor.2.weight"] @ h + arrays["actor.2.bias"]
    assert np.allclose(y, case["mean"], atol=1e-6)
    scale, bias = np.array(model["action_scale"]), np.array(model["action_bias"])
    assert np.allclose(bias + scale * y, case["greedy_action"], atol=1e-4)
    u = (np.array(case["action"]) - bias) / scale
    assert np.allclose(u, case["normalized_action"], atol=1e-12)
    log_std = np.array(case["log_std"])
    e = (u - y) / np.exp(log_std)
    by_hand = -0.5 * (e**2).sum() - log_std.sum() - 0.5 * len(e) * math.log(2 * math.pi)
    assert math.isclose(by_hand, case["action_log_probability"], abs_tol=1e-5)
    low, high = np.array(model["action_low"]), np.array(model["action_high"])
    assert np.clip(case["action"], low, high).tolist() == case["clipped_action"]


def test_multi_agent_vectors_have_their_forms():
    by_name = {v["name"]: from_tagged(v["value"]) for v in MESSAGES}
    assert by_name["welcome_mapping"]["mapping"] and by_name["welcome_mapping"]["multi_agent"]
    stacked = by_name["action_agents"]["actions"]
    assert isinstance(stacked, np.ndarray) and stacked.dtype == np.int64
    mixed = by_name["action_agents_mixed"]["actions"]
    assert isinstance(mixed, list) and isinstance(mixed[0], int)
    assert any(isinstance(a, np.ndarray) and a.dtype == np.float32 for a in mixed)
    assert by_name["log_returns_agents"]["terminated_agents"]
    for name in ("get_action_agents", "log_action_agents", "end_episode_agents"):
        assert by_name[name]["agent_ids"]


def test_a_corrupted_vector_is_caught():
    vector = next(v for v in MESSAGES if v["name"] == "get_action")
    raw = bytearray.fromhex(vector["msgpack"])
    raw[-1] ^= 0x01  # the last element's byte
    assert not same(decode(bytes(raw)), from_tagged(vector["value"]))
