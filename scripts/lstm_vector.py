"""The memory (LSTM) forward-pass vector, ``docs/protocol-vectors/lstm-forward-pass.json``.

A tiny recurrent policy, small enough to check by hand (``docs/protocol.md`` section 7.9,
``memory``, and section 14.4.3): 3 observation values read by an LSTM of 2 cells
(``memory.weight_ih`` ``[8, 3]``, ``memory.weight_hh`` ``[8, 2]``, ``memory.bias`` ``[8]``,
PyTorch's gate order input, forget, cell, output), then the categorical head (a linear layer of 2
logits over ``h``). Two steps of one episode from the zero state, so the second step shows the
state carried. The weights are multiples of 1/8 and the observations of 1/4; computed by
:class:`rlserve.policy.NumpyPolicy` and written with the format of ``forward-pass.json``.
No server needed: ``.venv/bin/python scripts/lstm_vector.py`` rewrites the file.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from protocol_vectors import FOLDER, FORMAT, TOLERANCE, dump, to_tagged

from rlserve.policy.memory import LSTMMemory
from rlserve.policy.model_spec import ModelSpec
from rlserve.policy.numpy_policy import NumpyPolicy

PATH = FOLDER / "lstm-forward-pass.json"

WEIGHT_IH = (np.arange(24, dtype=np.float32).reshape(8, 3) % 5 - 2) / 8
"""``memory.weight_ih``, ``[4N, F]`` = ``[8, 3]``: (i mod 5 - 2) / 8 in row-major order."""

WEIGHT_HH = (np.arange(16, dtype=np.float32).reshape(8, 2) % 3 - 1) / 4
"""``memory.weight_hh``, ``[4N, N]`` = ``[8, 2]``: (i mod 3 - 1) / 4 in row-major order."""

BIAS = np.array([0.25, 0.0, 0.5, 0.125, -0.25, 0.125, 0.0, 0.375], dtype=np.float32)
"""``memory.bias`` (torch's ``bias_ih_l0 + bias_hh_l0``), ``[8]``."""

HEAD_WEIGHT = np.array([[1.0, -0.5], [-0.75, 1.25]], dtype=np.float32)
HEAD_BIAS = np.array([0.0, 0.125], dtype=np.float32)

OBSERVATIONS = np.array([[0.5, -1.0, 0.25], [1.0, 0.75, -0.5]], dtype=np.float32)
"""The episode's first two observations."""


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return (1.0 / (1.0 + np.exp(-z.astype(np.float64)))).astype(np.float32)


def tiny_lstm() -> dict[str, Any]:
    """The vector: model, arrays, and per step the observation and every intermediate result."""
    spec = ModelSpec(3, ("actor.0",), "tanh", "categorical", 2, memory=LSTMMemory(2, 3))
    arrays = {
        "memory.weight_ih": WEIGHT_IH,
        "memory.weight_hh": WEIGHT_HH,
        "memory.bias": BIAS,
        "actor.0.weight": HEAD_WEIGHT,
        "actor.0.bias": HEAD_BIAS,
    }
    policy = NumpyPolicy(spec, arrays, 0)
    state = policy.initial_state(1)
    steps = []
    for obs in OBSERVATIONS:
        x = obs[None, :]
        gates = x @ WEIGHT_IH.T + state[:, :2] @ WEIGHT_HH.T + BIAS
        logits, next_state = policy.recurrent_forward(x, state)
        shifted = logits[0] - logits[0].max()
        log_probs = shifted - np.log(np.exp(shifted).sum())
        steps.append(
            {
                "observation": obs.tolist(),
                "state_in": state[0].tolist(),
                "gates": gates[0].tolist(),
                "input_gate": _sigmoid(gates[0, 0:2]).tolist(),
                "forget_gate": _sigmoid(gates[0, 2:4]).tolist(),
                "cell_input": np.tanh(gates[0, 4:6]).tolist(),
                "output_gate": _sigmoid(gates[0, 6:8]).tolist(),
                "state_out": next_state[0].tolist(),
                "logits": logits[0].tolist(),
                "log_probabilities": log_probs.tolist(),
                "greedy_choice": int(logits[0].argmax()),
                "greedy_action": int(logits[0].argmax()),
            }
        )
        state = next_state
    return {
        "name": "tiny_lstm",
        "model": spec.to_wire(),
        "arrays": {name: to_tagged(a) for name, a in arrays.items()},
        "steps": steps,
    }


def lstm_vector_file() -> str:
    """The file's text."""
    return dump({"format": FORMAT, "tolerance": TOLERANCE, "policies": [tiny_lstm()]})


if __name__ == "__main__":
    PATH.write_text(lstm_vector_file())
    print(f"wrote {PATH}")
