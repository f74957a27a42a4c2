"""The legal-move mask vectors (docs/protocol-vectors/masked-forward-pass.json), three ways."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

from mask_vector import PATH, mask_vector_file  # noqa: E402
from protocol_vectors import close, from_tagged  # noqa: E402

from rlserve.errors import SpaceError  # noqa: E402
from rlserve.policy.model_spec import ModelSpec  # noqa: E402
from rlserve.policy.numpy_policy import NumpyPolicy  # noqa: E402

FILE = json.loads(PATH.read_text())
POLICIES = {p["name"]: p for p in FILE["policies"]}
MASKED = -1.7014117e38
"""Section 14.4.2's masked output, as the protocol doc writes it."""


def _policy(case: dict[str, Any]) -> NumpyPolicy:
    arrays = {name: from_tagged(a) for name, a in case["arrays"].items()}
    return NumpyPolicy(ModelSpec.from_wire(case["model"]), arrays, 0)


def test_the_file_covers_both_maskable_kinds_and_the_cases_that_matter() -> None:
    assert set(POLICIES) == {"tiny_masked_categorical", "tiny_masked_epsilon_greedy"}
    for case in POLICIES.values():
        steps = case["steps"]
        assert any(all(s["legal"]) for s in steps)
        assert any(s["unmasked_greedy_choice"] != s["greedy_choice"] for s in steps)
        assert any(sum(s["legal"]) == 1 for s in steps)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_the_numpy_policy_reproduces_the_vector(name: str) -> None:
    case = POLICIES[name]
    policy = _policy(case)
    for step in case["steps"]:
        obs = np.asarray(step["observation"], dtype=np.float32)[None, :]
        assert close(policy.forward(obs)[0].tolist(), step["outputs"])
        greedy = policy.compute_actions(obs, explore=False).actions
        assert int(greedy[0]) == step["greedy_choice"]
        assert int(policy.to_env_actions(greedy)[0]) == step["greedy_action"]
        legal = [j for j, ok in enumerate(step["legal"]) if ok]
        logp = policy.log_prob(np.repeat(obs, len(legal), axis=0), np.array(legal))
        assert close(logp.tolist(), [step["log_probabilities"][j] for j in legal])
        for _ in range(20):  # sampling never takes an illegal choice
            assert step["legal"][int(policy.compute_actions(obs).actions[0])]
    refused = np.asarray(case["refused"]["observation"], dtype=np.float32)[None, :]
    with pytest.raises(SpaceError, match="no legal action"):
        policy.compute_actions(refused)


def _by_hand(case: dict[str, Any], step: dict[str, Any]) -> tuple[list[float], list[float]]:
    """Section 14.4.2 in plain float64 loops: the outputs and the masked outputs."""
    model = case["model"]
    start, size = model["action_mask"]["start"], model["action_mask"]["size"]
    o = step["observation"]
    mask = o[start : start + size]
    x = o[:start] + o[start + size :]
    assert x == step["features"]
    arrays = {name: from_tagged(a).tolist() for name, a in case["arrays"].items()}
    w, b = arrays["actor.0.weight"], arrays["actor.0.bias"]
    y = [b[j] + sum(w[j][i] * x[i] for i in range(len(x))) for j in range(size)]
    masked = [y[j] if mask[j] > 0.5 else MASKED for j in range(size)]
    assert [m > 0.5 for m in mask] == step["legal"]
    return y, masked


def test_the_categorical_vector_by_hand() -> None:
    case = POLICIES["tiny_masked_categorical"]
    for step in case["steps"]:
        y, masked = _by_hand(case, step)
        assert close(y, step["outputs"]) and close(masked, step["masked_outputs"])
        top = max(masked)
        weights = [math.exp(v - top) for v in masked]
        total = sum(weights)
        assert close([v / total for v in weights], step["probabilities"])
        want_logp = [
            v - top - math.log(total) if ok else None
            for v, ok in zip(masked, step["legal"], strict=True)
        ]
        assert [p is None for p in want_logp] == [p is None for p in step["log_probabilities"]]
        assert close(
            [p for p in want_logp if p is not None],
            [p for p in step["log_probabilities"] if p is not None],
        )
        assert masked.index(top) == step["greedy_choice"]
        assert step["greedy_action"] == step["greedy_choice"] + case["model"]["action_start"]
        u, running, sampled = step["uniform_draw"] * total, 0.0, len(weights) - 1
        for j, weight in enumerate(weights):
            running += weight
            if running > u:
                sampled = j
                break
        assert sampled == step["sampled_choice"] and step["legal"][sampled]
        assert close(want_logp[sampled], step["sampled_log_probability"])


def test_the_epsilon_greedy_vector_by_hand() -> None:
    case = POLICIES["tiny_masked_epsilon_greedy"]
    epsilon = case["model"]["epsilon"]
    for step in case["steps"]:
        y, masked = _by_hand(case, step)
        assert close(y, step["outputs"]) and close(masked, step["masked_outputs"])
        legal = [j for j, ok in enumerate(step["legal"]) if ok]
        n = len(legal)
        assert n == step["legal_count"]
        best = masked.index(max(masked))
        assert best == step["greedy_choice"]
        want = [
            None
            if j not in legal
            else math.log(1 - epsilon + epsilon / n)
            if j == best
            else math.log(epsilon / n)
            for j in range(len(masked))
        ]
        for got, value in zip(step["log_probabilities"], want, strict=True):
            assert (got is None and value is None) or close(got, value)
        for explored in step["exploring_steps"]:
            nth = min(int(explored["legal_draw"] * n), n - 1)
            choice = legal[nth] if explored["explore_draw"] < epsilon else best
            assert choice == explored["choice"]
            assert explored["action"] == choice + case["model"]["action_start"]
            assert close(want[choice], explored["log_probability"])


def test_the_generator_writes_the_committed_vector() -> None:
    fresh = json.loads(mask_vector_file())
    for got, want in zip(fresh["policies"], FILE["policies"], strict=True):
        assert got["model"] == want["model"] and got["refused"] == want["refused"]
        for a, b in zip(got["steps"], want["steps"], strict=True):
            assert close(a["masked_outputs"], b["masked_outputs"])
            assert a["greedy_choice"] == b["greedy_choice"]


def test_the_protocol_docs_worked_example_is_the_vectors() -> None:
    text = (ROOT / "docs" / "protocol.md").read_text()
    step = POLICIES["tiny_masked_categorical"]["steps"][1]
    mask, real = step["observation"][:3], step["observation"][3:]
    assert f"o = {[int(v) for v in mask] + real}" in text
    assert f"y = {step['outputs']}" in text
    softmax = ", ".join("0" if p == 0 else f"{p:.5f}" for p in step["probabilities"])
    assert f"softmax = [{softmax}]" in text
    logp = ", ".join("-" if p is None else f"{p:.5f}" for p in step["log_probabilities"])
    assert f"logp = [{logp}]" in text
