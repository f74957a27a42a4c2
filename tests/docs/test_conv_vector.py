"""The conv forward-pass vector (docs/protocol-vectors/conv-forward-pass.json), three ways."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

from conv_vector import PATH, conv_vector_file  # noqa: E402
from protocol_vectors import close, from_tagged  # noqa: E402

from rlserve.policy.model_spec import ModelSpec  # noqa: E402
from rlserve.policy.numpy_policy import NumpyPolicy  # noqa: E402

FILE = json.loads(PATH.read_text())
CASE = FILE["policies"][0]


def test_the_numpy_policy_reproduces_the_vector() -> None:
    spec = ModelSpec.from_wire(CASE["model"])
    arrays = {name: from_tagged(a) for name, a in CASE["arrays"].items()}
    policy = NumpyPolicy(spec, arrays, 0)
    obs = np.asarray(CASE["observation"], dtype=np.float32)[None, :]
    assert close(policy.forward(obs)[0].tolist(), CASE["logits"])
    greedy = policy.compute_actions(obs, explore=False).actions
    assert int(greedy[0]) == CASE["greedy_choice"]


def test_the_vector_by_hand() -> None:
    """Section 7.9's encoder arithmetic in plain float64 loops reproduces the vector."""
    model = CASE["model"]
    assert model["encoder"]["input_dim"] == 16
    (encoder,) = model["encoder"]["images"]
    assert encoder["start"] == 0 and encoder["shape"] == [4, 4, 1] and not encoder["channels_first"]
    (conv,) = encoder["layers"]
    arrays = {name: from_tagged(a).tolist() for name, a in CASE["arrays"].items()}
    weight, bias = arrays["encoder.0.0.weight"], arrays["encoder.0.0.bias"]
    image = [
        [CASE["observation"][r * 4 + c] / encoder["divisor"] for c in range(4)] for r in range(4)
    ]
    (kh, kw), (sh, sw) = conv["kernel"], conv["stride"]
    maps = []
    for f in range(conv["size"]):
        rows = []
        for i in range(2):
            row = []
            for j in range(2):
                total = bias[f] + sum(
                    image[i * sh + u][j * sw + v] * weight[f][0][u][v]
                    for u in range(kh)
                    for v in range(kw)
                )
                row.append(max(total, 0.0))
            rows.append(row)
        maps.append(rows)
    assert close(maps, CASE["feature_maps"])
    features = [x for f in maps for row in f for x in row]  # channel, row, column
    head_w, head_b = arrays["actor.0.weight"], arrays["actor.0.bias"]
    logits = [
        head_b[k] + sum(w * x for w, x in zip(head_w[k], features, strict=True)) for k in range(3)
    ]
    assert close(logits, CASE["logits"])
    top = max(logits)
    total = sum(math.exp(v - top) for v in logits)
    assert close([v - top - math.log(total) for v in logits], CASE["log_probabilities"])
    assert logits.index(top) == CASE["greedy_choice"]


def test_the_generator_writes_the_committed_vector() -> None:
    fresh = json.loads(conv_vector_file())
    assert fresh["policies"][0]["model"] == CASE["model"]
    assert close(fresh["policies"][0]["logits"], CASE["logits"])
