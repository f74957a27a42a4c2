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

from protocol_vectors import ATOL, RTOL, close, from_tagged, to_tagged  # noqa: E402

from rlserve.policy.model_spec import ModelSpec  # noqa: E402
from rlserve.policy.numpy_policy import NumpyPolicy  # noqa: E402
from rlserve.protocol.codec import decode, encode, encode_json, to_jsonable  # noqa: E402

MESSAGES = json.loads((FOLDER / "messages.json").read_text())["vectors"]
FORWARD = json.loads((FOLDER / "forward-pass.json").read_text())
POLICIES = {p["name"]: p for p in FORWARD["policies"]}
TOLERANCE = FORWARD["tolerance"]
"""What the file asks of an implementation's real results: ``|got - want| <= atol + rtol *
|want|`` (float32 results differ in their last digits between CPUs and BLAS kernels)."""


def near(got: Any, want: Any) -> bool:
    """Whether ``got`` is within the vector file's stated tolerance of ``want``."""
    return close(got, want, TOLERANCE["rtol"], TOLERANCE["atol"])


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
                 "log_action_agents", "log_returns_agents", "end_episode_agents",
                 "hello_map_agents", "welcome_map_agents", "map_agents",
                 "agents_mapped"):  # fmt: skip
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
    assert near(policy.forward(obs)[0], case["logits"])
    n = case["model"]["action_dim"]
    logp = policy.log_prob(np.repeat(obs, n, 0), np.arange(n))
    assert near(logp, case["log_probabilities"])
    assert near(np.exp(case["log_probabilities"]), case["probabilities"])
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
    assert near(h, case["hidden"])
    assert near(y, case["logits"])
    w = np.exp(y - y.max())
    u = case["uniform_draw"] * w.sum()
    assert int(np.argmax(np.cumsum(w) > u)) == case["sampled_choice"]


def test_gaussian_forward_pass_vector():
    case = POLICIES["tiny_gaussian"]
    policy, obs = _policy(case)
    assert near(policy.forward(obs)[0], case["mean"])
    action = np.array([case["action"]], np.float32)
    assert near(policy.log_prob(obs, action)[0], case["action_log_probability"])
    # Clipping the given action only copies numbers: exact.
    assert policy.to_env_actions(action)[0].tolist() == case["clipped_action"]
    mean, log_std = np.array(case["mean"]), np.array(case["log_std"])
    e = (np.array(case["action"]) - mean) / np.exp(log_std)
    by_hand = -0.5 * (e**2).sum() - log_std.sum() - 0.5 * len(e) * math.log(2 * math.pi)
    assert near(by_hand, case["action_log_probability"])


def test_normalized_gaussian_forward_pass_vector():
    case = POLICIES["tiny_gaussian_normalized"]
    policy, obs = _policy(case)
    model = case["model"]
    assert policy.spec.obs_mean == tuple(model["obs_mean"])
    assert policy.spec.action_scale == tuple(model["action_scale"])
    # Exact: one subtraction and one division per element, of numbers chosen to give exact
    # results (1.5, 1.0 and -4, clipped to -3).
    assert policy.normalize(obs)[0].tolist() == case["normalized_observation"]
    assert near(policy.forward(obs)[0], case["mean"])
    greedy = policy.compute_actions(obs, explore=False).actions
    assert near(greedy[0], case["greedy_action"])
    action = np.array([case["action"]], np.float32)
    assert near(policy.log_prob(obs, action)[0], case["action_log_probability"])
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
    assert near(h, case["hidden"])
    assert near(y, case["mean"])
    scale, bias = np.array(model["action_scale"]), np.array(model["action_bias"])
    assert near(bias + scale * y, case["greedy_action"])
    u = (np.array(case["action"]) - bias) / scale
    assert np.allclose(u, case["normalized_action"], atol=1e-12)
    log_std = np.array(case["log_std"])
    e = (u - y) / np.exp(log_std)
    by_hand = -0.5 * (e**2).sum() - log_std.sum() - 0.5 * len(e) * math.log(2 * math.pi)
    assert near(by_hand, case["action_log_probability"])
    low, high = np.array(model["action_low"]), np.array(model["action_high"])
    assert np.clip(case["action"], low, high).tolist() == case["clipped_action"]


def test_every_shipped_distribution_kind_has_a_vector():
    kinds = {case["model"]["distribution"] for case in POLICIES.values()}
    assert {"categorical", "gaussian", "epsilon_greedy", "squashed_gaussian"} <= kinds


class _Draws:
    """Given draws in place of the policy's generator (the vectors' fixed random numbers)."""

    def __init__(self, uniform=(), integers=(), normal=()):
        self.uniform, self.integers_, self.normal = list(uniform), list(integers), normal

    def random(self):
        return self.uniform.pop(0)

    def integers(self, low, high):
        return self.integers_.pop(0)

    def standard_normal(self, shape):
        return np.array(self.normal, dtype=np.float64).reshape(shape)


def test_epsilon_greedy_forward_pass_vector():
    case = POLICIES["tiny_epsilon_greedy"]
    policy, obs = _policy(case)
    assert policy.spec.epsilon == case["model"]["epsilon"] == 0.25
    assert policy.normalize(obs)[0].tolist() == case["normalized_observation"]
    # Exact by design, unlike the other vectors: every product and sum of this forward pass is
    # exact in float32 (short multiples of powers of 2), so any order of summation, in any
    # precision, gives these numbers and the tie between choices 0 and 3.
    assert policy.forward(obs)[0].tolist() == case["q_values"]
    greedy = policy.compute_actions(obs, explore=False)
    assert int(greedy.actions[0]) == case["greedy_choice"]
    assert int(policy.to_env_actions(greedy.actions)[0]) == case["greedy_action"]
    n = case["model"]["action_dim"]
    assert near(policy.log_prob(np.repeat(obs, n, 0), np.arange(n)), case["log_probabilities"])
    for step in case["exploring_steps"]:
        policy._rng = _Draws([step["explore_draw"]], [step["uniform_choice"]])
        out = policy.compute_actions(obs)
        assert int(out.actions[0]) == step["choice"]
        assert int(policy.to_env_actions(out.actions)[0]) == step["action"]
        assert near(out.logp[0], step["log_probability"])


def test_epsilon_greedy_vector_by_hand():
    """Section 14.4's epsilon-greedy rule in plain float64, tie and both branches included."""
    case = POLICIES["tiny_epsilon_greedy"]
    model = case["model"]
    arrays = {k: from_tagged(v).astype(np.float64) for k, v in case["arrays"].items()}
    o = np.array(case["observation"])
    clip = model["obs_clip"]
    x = np.clip((o - model["obs_mean"]) / np.array(model["obs_std"]), -clip, clip)
    assert x.tolist() == case["normalized_observation"]
    h = np.maximum(arrays["trunk.0.weight"] @ x + arrays["trunk.0.bias"], 0.0)  # relu
    q = arrays["head.weight"] @ h + arrays["head.bias"]
    assert h.tolist() == case["hidden"] and q.tolist() == case["q_values"]  # exact, as above
    # Choices 0 and 3 tie for the best value: the greedy choice is the first of them.
    best = [j for j in range(len(q)) if q[j] == q.max()]
    assert best == [0, 3] and case["greedy_choice"] == best[0]
    assert case["greedy_action"] == best[0] + model["action_start"]
    eps, n = model["epsilon"], model["action_dim"]
    greedy_logp, other_logp = math.log(1 - eps + eps / n), math.log(eps / n)
    expected = [greedy_logp if j == best[0] else other_logp for j in range(n)]
    assert near(expected, case["log_probabilities"])
    for step in case["exploring_steps"]:
        choice = step["uniform_choice"] if step["explore_draw"] < eps else best[0]
        assert step["choice"] == choice
        assert step["action"] == choice + model["action_start"]
        logp = greedy_logp if choice == best[0] else other_logp
        assert near(step["log_probability"], logp)
    # One step of each kind: the greedy branch, a random other choice, a random greedy choice.
    assert {(s["explore_draw"] < eps, s["choice"] == best[0]) for s in case["exploring_steps"]} == {
        (False, True),
        (True, False),
        (True, True),
    }


def test_squashed_gaussian_forward_pass_vector():
    case = POLICIES["tiny_squashed_gaussian"]
    policy, obs = _policy(case)
    assert "log_std" not in case["arrays"]  # state-dependent: the network's second half
    assert near(policy.forward(obs)[0], case["output"])
    policy._rng = _Draws(normal=case["noise"])
    out = policy.compute_actions(obs)
    assert near(out.actions[0], case["action"])
    assert near(out.logp[0], case["action_log_probability"])
    greedy = policy.compute_actions(obs, explore=False)
    assert near(greedy.actions[0], case["greedy_action"])
    assert near(greedy.logp[0], case["greedy_log_probability"])
    # The action is inside the Box: what is sent is what is reported, bit for bit.
    assert policy.to_env_actions(out.actions)[0].tolist() == out.actions[0].tolist()
    # Reading the reported (float32) action back gives its log-density again, closely.
    back = float(policy.log_prob(obs, out.actions)[0])
    assert math.isclose(back, case["action_log_probability"], abs_tol=2e-3)


def test_squashed_gaussian_vector_by_hand():
    """Section 14.4's squashed Gaussian in plain float64: clamp, tanh, scaling, log-density."""
    case = POLICIES["tiny_squashed_gaussian"]
    model = case["model"]
    assert model["action_parts"] == [{"kind": "squashed_gaussian", "size": 2}]
    a_dim = model["action_parts"][0]["size"]
    assert model["action_dim"] == 2 * a_dim
    arrays = {k: from_tagged(v).astype(np.float64) for k, v in case["arrays"].items()}
    x = np.array(case["observation"])
    h = np.tanh(arrays["actor.0.weight"] @ x + arrays["actor.0.bias"])
    y = arrays["actor.2.weight"] @ h + arrays["actor.2.bias"]
    assert near(h, case["hidden"])
    assert near(y, case["output"])
    mean = y[:a_dim]
    log_std = np.clip(y[a_dim:], -20.0, 2.0)
    assert y[a_dim + 1] > 2.0 and log_std[1] == 2.0  # the second one is clamped
    assert near(log_std, case["clamped_log_std"])
    e = np.array(case["noise"])
    u = mean + np.exp(log_std) * e
    t = np.tanh(u)
    assert near(u, case["u"])
    assert near(t, case["tanh_u"])
    low, high = np.array(model["action_low"]), np.array(model["action_high"])
    half = (high - low) / 2
    action = low + (t + 1) * half
    assert near(action, case["action"])
    gauss = -0.5 * (e**2).sum() - log_std.sum() - 0.5 * a_dim * math.log(2 * math.pi)
    logp = gauss - np.log(1 - t**2 + 1e-6).sum() - np.log(half).sum()
    assert near(logp, case["action_log_probability"])
    # The exact tanh correction, 2 * (log 2 - u - softplus(-2u)), leaves out SQUASH_EPS: near a
    # bound (the second value) it gives a visibly different number. Use the form above.
    exact = 2 * (math.log(2) - u - np.logaddexp(0.0, -2 * u))
    assert np.allclose(exact, np.log(1 - t**2), atol=1e-9)
    exact_logp = gauss - exact.sum() - np.log(half).sum()
    assert abs(exact_logp - case["action_log_probability"]) > 4e-3
    greedy = low + (np.tanh(mean) + 1) * half
    assert near(greedy, case["greedy_action"])
    greedy_logp = (
        -log_std.sum()
        - 0.5 * a_dim * math.log(2 * math.pi)
        - np.log(1 - np.tanh(mean) ** 2 + 1e-6).sum()
        - np.log(half).sum()
    )
    assert near(greedy_logp, case["greedy_log_probability"])


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


def test_the_forward_pass_file_states_its_tolerance():
    assert TOLERANCE == {"rtol": RTOL, "atol": ATOL} == {"rtol": 1e-5, "atol": 1e-6}
    # The difference the issue saw between two CPUs (one float32 ulp) is inside it...
    assert near(0.30429205298423767, 0.3042920231819153)
    # ...and so is a value near 0 that moved in its 7th significant digit.
    assert near(0.0001813415583455935, 0.0001813415001379326)
    assert not near(0.30429205298423767 + 1e-5, 0.3042920231819153)


OUTPUTS = {"categorical": "logits", "gaussian": "mean", "squashed_gaussian": "output"}


@pytest.mark.parametrize("name", [n for n, c in POLICIES.items() if "hidden" in c])
def test_vectors_hold_for_another_summation_order(name):
    """float32 with every sum taken backwards (another BLAS kernel's order) stays within it."""
    case = POLICIES[name]
    model = case["model"]
    arrays = {k: from_tagged(v) for k, v in case["arrays"].items()}
    x = np.array(case["normalized_observation"] if "obs_mean" in model else case["observation"])
    x = x.astype(np.float32)
    for k, layer in enumerate(model["actor_layers"]):
        w, b = arrays[layer + ".weight"], arrays[layer + ".bias"]
        z = np.zeros(len(b), np.float32)
        for j in range(len(b)):
            total = np.float32(0.0)
            for i in reversed(range(len(x))):
                total = np.float32(total + w[j, i] * x[i])
            z[j] = total + b[j]
        if k == 0:
            x = np.tanh(z) if model["activation"] == "tanh" else np.maximum(z, np.float32(0))
            assert near(x, case["hidden"])
        else:
            x = z
    output = OUTPUTS.get(model["distribution"], "q_values")
    assert near(x, case[output])


def test_the_tolerance_catches_a_float32_squashed_log_density():
    """Section 14.4 asks for double precision from the network's output on: float32 fails."""
    case = POLICIES["tiny_squashed_gaussian"]
    f = np.float32
    y = np.array(case["output"], f)
    log_std = np.clip(y[2:], f(-20), f(2))
    e = np.array(case["noise"], f)
    t = np.tanh(y[:2] + np.exp(log_std) * e)
    half = np.array([2.0, 5.0], f)
    logp = (
        f(-0.5) * (e**2).sum()
        - log_std.sum()
        - f(math.log(2 * math.pi))
        - np.log(f(1) - t * t + f(1e-6)).sum()
        - np.log(half).sum()
    )
    assert not near(logp, case["action_log_probability"])
