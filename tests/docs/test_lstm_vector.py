"""The LSTM forward-pass vector (docs/protocol-vectors/lstm-forward-pass.json), four ways."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

from lstm_vector import PATH, lstm_vector_file  # noqa: E402
from protocol_vectors import close, from_tagged  # noqa: E402

from rlserve.policy.model_spec import ModelSpec  # noqa: E402
from rlserve.policy.numpy_policy import NumpyPolicy  # noqa: E402

FILE = json.loads(PATH.read_text())
CASE = FILE["policies"][0]
ARRAYS = {name: from_tagged(a) for name, a in CASE["arrays"].items()}


def test_the_numpy_policy_reproduces_the_vector() -> None:
    spec = ModelSpec.from_wire(CASE["model"])
    assert spec.state_size == 4
    policy = NumpyPolicy(spec, ARRAYS, 0)
    state = policy.initial_state(1)
    for step in CASE["steps"]:
        assert close(state[0].tolist(), step["state_in"])
        obs = np.asarray(step["observation"], dtype=np.float32)[None, :]
        out = policy.compute_actions(obs, explore=False, state=state)
        assert int(out.actions[0]) == step["greedy_choice"]
        assert close(float(out.logp[0]), step["log_probabilities"][step["greedy_choice"]])
        logits, _ = policy.recurrent_forward(obs, state)
        assert close(logits[0].tolist(), step["logits"])
        assert out.state is not None and close(out.state[0].tolist(), step["state_out"])
        state = out.state


def test_the_vector_by_hand() -> None:
    """Section 14.4.3's arithmetic in plain float64 loops reproduces the vector."""
    assert CASE["model"]["memory"] == {"kind": "lstm", "cell_size": 2}
    w_ih, w_hh = ARRAYS["memory.weight_ih"].tolist(), ARRAYS["memory.weight_hh"].tolist()
    bias = ARRAYS["memory.bias"].tolist()
    head_w, head_b = ARRAYS["actor.0.weight"].tolist(), ARRAYS["actor.0.bias"].tolist()
    n = 2
    h, c = [0.0] * n, [0.0] * n
    for step in CASE["steps"]:
        assert close(h + c, step["state_in"])
        x = step["observation"]
        gates = [
            bias[r]
            + sum(w_ih[r][k] * x[k] for k in range(3))
            + sum(w_hh[r][k] * h[k] for k in range(n))
            for r in range(4 * n)
        ]
        assert close(gates, step["gates"])

        def sigmoid(z: float) -> float:
            return 1.0 / (1.0 + math.exp(-z))

        i = [sigmoid(v) for v in gates[0:n]]
        f = [sigmoid(v) for v in gates[n : 2 * n]]
        g = [math.tanh(v) for v in gates[2 * n : 3 * n]]
        o = [sigmoid(v) for v in gates[3 * n :]]
        for got, name in (
            (i, "input_gate"),
            (f, "forget_gate"),
            (g, "cell_input"),
            (o, "output_gate"),
        ):
            assert close(got, step[name])
        c = [f[k] * c[k] + i[k] * g[k] for k in range(n)]
        h = [o[k] * math.tanh(c[k]) for k in range(n)]
        assert close(h + c, step["state_out"])
        logits = [head_b[a] + sum(head_w[a][k] * h[k] for k in range(n)) for a in range(2)]
        assert close(logits, step["logits"])
        top = max(logits)
        total = sum(math.exp(v - top) for v in logits)
        assert close([v - top - math.log(total) for v in logits], step["log_probabilities"])
        assert logits.index(top) == step["greedy_choice"]
    assert all(v != 0 for v in h + c)  # the second step read a state with every value set


def test_torch_nn_lstm_reproduces_the_vector() -> None:
    lstm = nn.LSTM(3, 2, batch_first=True)
    head = nn.Linear(2, 2)
    with torch.no_grad():
        lstm.weight_ih_l0.copy_(torch.from_numpy(ARRAYS["memory.weight_ih"]))
        lstm.weight_hh_l0.copy_(torch.from_numpy(ARRAYS["memory.weight_hh"]))
        lstm.bias_ih_l0.copy_(torch.from_numpy(ARRAYS["memory.bias"]))
        lstm.bias_hh_l0.zero_()  # the wire's bias is bias_ih_l0 + bias_hh_l0
        head.weight.copy_(torch.from_numpy(ARRAYS["actor.0.weight"]))
        head.bias.copy_(torch.from_numpy(ARRAYS["actor.0.bias"]))
        obs = torch.tensor([[s["observation"] for s in CASE["steps"]]], dtype=torch.float32)
        out, (h, c) = lstm(obs)
        logits = head(out)[0]
    for t, step in enumerate(CASE["steps"]):
        assert close(logits[t].tolist(), step["logits"])
    assert close(h[0, 0].tolist() + c[0, 0].tolist(), CASE["steps"][-1]["state_out"])


def test_the_generator_writes_the_committed_vector() -> None:
    fresh = json.loads(lstm_vector_file())["policies"][0]
    assert fresh["model"] == CASE["model"]
    for got, want in zip(fresh["steps"], CASE["steps"], strict=True):
        assert close(got["state_out"], want["state_out"]) and close(got["logits"], want["logits"])


def test_the_protocol_docs_worked_example_is_the_vector() -> None:
    text = (ROOT / "docs" / "protocol.md").read_text()
    for step in CASE["steps"]:
        assert f"x = {step['observation']}" in text
        state = ", ".join(f"{v:.5f}" for v in step["state_out"])
        assert f"state = [{state}]" in text
        logits = ", ".join(f"{v:.5f}" for v in step["logits"])
        assert f"y = [{logits}]" in text
