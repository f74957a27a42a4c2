"""Memory (LSTM) in the numpy policy: by hand, against torch's nn.LSTM, on the wire, and misuse."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from rlserve.errors import ConfigError, SpaceError
from rlserve.policy import ModelSpec, NumpyPolicy
from rlserve.policy.acting import compute_actions
from rlserve.policy.image_encoder import EncoderLayer, ImageEncoder, ObservationEncoder
from rlserve.policy.memory import MAX_CELL_SIZE, LSTMForward, LSTMMemory

N, F = 2, 3


def _tiny_arrays() -> dict[str, np.ndarray]:
    """A 2-cell LSTM over 3 inputs, weights multiples of 1/8."""
    w_ih = (np.arange(24, dtype=np.float32).reshape(8, 3) % 5 - 2) / 8
    w_hh = (np.arange(16, dtype=np.float32).reshape(8, 2) % 3 - 1) / 4
    bias = np.linspace(-0.5, 0.5, 8, dtype=np.float32)
    return {"memory.weight_ih": w_ih, "memory.weight_hh": w_hh, "memory.bias": bias}


def _by_hand(arrays: dict[str, np.ndarray], x: list[float], state: list[float]) -> list[float]:
    """LSTM.md's equations in plain float64 loops."""
    w_ih, w_hh, b = (
        arrays[k].tolist() for k in ("memory.weight_ih", "memory.weight_hh", "memory.bias")
    )
    h, c = state[:N], state[N:]
    gates = [
        b[r] + sum(w_ih[r][k] * x[k] for k in range(F)) + sum(w_hh[r][k] * h[k] for k in range(N))
        for r in range(4 * N)
    ]

    def sigmoid(z: float) -> float:
        return 1.0 / (1.0 + math.exp(-z))

    i, f, g, o = (gates[j * N : (j + 1) * N] for j in range(4))
    c2 = [sigmoid(f[k]) * c[k] + sigmoid(i[k]) * math.tanh(g[k]) for k in range(N)]
    h2 = [sigmoid(o[k]) * math.tanh(c2[k]) for k in range(N)]
    return h2 + c2


def test_one_step_matches_the_hand_computation_and_carries_the_state() -> None:
    arrays = _tiny_arrays()
    step = LSTMForward(LSTMMemory(N, F), arrays)
    xs = [[0.5, -1.0, 0.25], [1.0, 0.75, -0.5]]
    state = np.zeros((1, 2 * N), dtype=np.float32)
    want = [0.0] * (2 * N)
    for x in xs:
        before = state.copy()
        state_next = step(np.asarray([x], dtype=np.float32), state)
        assert np.array_equal(state, before)  # the input state is never changed
        want = _by_hand(arrays, x, want)
        np.testing.assert_allclose(state_next[0], want, rtol=1e-6, atol=1e-7)
        assert state_next.dtype == np.float32
        state = state_next
    assert np.abs(state).min() > 0  # the second step really read the first one's state


def _torch_policy(
    seed: int, obs_dim: int, cell: int, hidden: int, actions: int
) -> tuple[nn.LSTM, nn.Sequential, ModelSpec, dict[str, np.ndarray]]:
    torch.manual_seed(seed)
    lstm = nn.LSTM(obs_dim, cell, batch_first=True)
    head = nn.Sequential(nn.Linear(cell, hidden), nn.Tanh(), nn.Linear(hidden, actions))
    spec = ModelSpec(
        obs_dim, ("actor.0", "actor.2"), "tanh", "categorical", actions,
        memory=LSTMMemory(cell, obs_dim),
    )  # fmt: skip
    arrays = {f"actor.{k}": v.detach().numpy() for k, v in head.state_dict().items()}
    arrays["memory.weight_ih"] = lstm.weight_ih_l0.detach().numpy()
    arrays["memory.weight_hh"] = lstm.weight_hh_l0.detach().numpy()
    arrays["memory.bias"] = (lstm.bias_ih_l0 + lstm.bias_hh_l0).detach().numpy()
    return lstm, head, spec, arrays


def test_a_sequence_matches_torch_nn_lstm() -> None:
    lstm, head, spec, arrays = _torch_policy(0, 5, 8, 16, 4)
    policy = NumpyPolicy(spec, arrays, 0)
    rng = np.random.default_rng(0)
    obs = rng.standard_normal((3, 6, 5)).astype(np.float32)  # 3 episodes of 6 steps
    with torch.no_grad():
        out, _ = lstm(torch.from_numpy(obs))
        logits = head(out).numpy()
    state = policy.initial_state(3)
    assert state.shape == (3, 16) and not state.any() and policy.state_size == 16
    for t in range(6):
        got, state = policy.recurrent_forward(obs[:, t], state)
        np.testing.assert_allclose(state[:, :8], out[:, t].numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got, logits[:, t], rtol=1e-5, atol=1e-6)
        result = policy.compute_actions(obs[:, t], explore=False, state=state)
        assert result.state is not None and result.state.shape == (3, 16)


def test_log_prob_with_state_matches_compute_actions() -> None:
    _, _, spec, arrays = _torch_policy(1, 4, 6, 8, 3)
    policy = NumpyPolicy(spec, arrays, 0, seed=3)
    obs = np.random.default_rng(1).standard_normal((5, 4)).astype(np.float32)
    state = np.random.default_rng(2).standard_normal((5, 12)).astype(np.float32)
    out = policy.compute_actions(obs, state=state)
    np.testing.assert_allclose(policy.log_prob(obs, out.actions, state), out.logp, rtol=1e-5)
    with pytest.raises(SpaceError, match="initial_state"):
        policy.log_prob(obs, out.actions)


def test_a_missing_or_misshapen_state_is_one_line_naming_the_fix() -> None:
    _, _, spec, arrays = _torch_policy(0, 3, 2, 4, 2)
    policy = NumpyPolicy(spec, arrays, 0)
    obs = np.zeros((2, 3), dtype=np.float32)
    with pytest.raises(SpaceError, match=r"pass state=, \[2, 4\].*initial_state") as info:
        policy.compute_actions(obs)
    assert "\n" not in str(info.value)
    with pytest.raises(SpaceError, match=r"shape \[2, 3\]; expected \[2, 4\]"):
        policy.compute_actions(obs, state=np.zeros((2, 3), dtype=np.float32))
    with pytest.raises(SpaceError, match=r"shape \[4\]"):
        policy.compute_actions(obs, state=np.zeros(4, dtype=np.float32))
    with pytest.raises(ConfigError, match="recurrent_forward"):
        policy.forward(obs)


def test_without_memory_nothing_changes() -> None:
    spec = ModelSpec(3, ("actor.0",), "tanh", "categorical", 2)
    arrays = {
        "actor.0.weight": np.eye(2, 3, dtype=np.float32),
        "actor.0.bias": np.zeros(2, np.float32),
    }
    policy = NumpyPolicy(spec, arrays, 0)
    assert policy.state_size == 0 and spec.state_size == 0 and "memory" not in spec.to_wire()
    assert policy.initial_state(3).shape == (3, 0)
    out = policy.compute_actions(np.ones((3, 3), dtype=np.float32), state=policy.initial_state(3))
    assert out.state is None


def test_the_memory_round_trips_on_the_wire() -> None:
    _, _, spec, _ = _torch_policy(0, 3, 5, 4, 2)
    wire = spec.to_wire()
    assert wire["memory"] == {"kind": "lstm", "cell_size": 5}
    back = ModelSpec.from_wire(wire)
    assert back == spec and back.memory == LSTMMemory(5, 3) and back.state_size == 10


@pytest.mark.parametrize(
    ("memory", "match"),
    [
        ({"kind": "gru", "cell_size": 4}, "unknown memory kind 'gru'"),
        ({"cell_size": 4}, "unknown memory kind None"),
        ({"kind": "lstm", "cell_size": 0}, "cell_size must be a whole number from 1"),
        ({"kind": "lstm", "cell_size": -3}, "cell_size must be a whole number from 1"),
        ({"kind": "lstm", "cell_size": 2.5}, "cell_size must be a whole number from 1"),
        ({"kind": "lstm", "cell_size": True}, "cell_size must be a whole number from 1"),
        ({"kind": "lstm", "cell_size": "8"}, "cell_size must be a whole number from 1"),
        ({"kind": "lstm", "cell_size": MAX_CELL_SIZE + 1}, "lstm_cell_size"),
        ({"kind": "lstm"}, "cell_size must be a whole number"),
        ([4], "memory must be a map"),
    ],
)
def test_a_malformed_memory_is_refused(memory: object, match: str) -> None:
    _, _, spec, _ = _torch_policy(0, 3, 5, 4, 2)
    wire = spec.to_wire()
    wire["memory"] = memory
    with pytest.raises(ConfigError, match=match):
        ModelSpec.from_wire(wire)


def test_arrays_of_the_wrong_shape_or_missing_are_refused() -> None:
    _, _, spec, arrays = _torch_policy(0, 3, 5, 4, 2)
    with pytest.raises(
        ConfigError, match=r"'memory.weight_hh' has shape \[20, 4\]; expected \[20, 5\]"
    ):
        NumpyPolicy(spec, {**arrays, "memory.weight_hh": np.zeros((20, 4), np.float32)}, 0)
    with pytest.raises(ConfigError, match=r"missing 'memory\.bias'"):
        NumpyPolicy(spec, {k: v for k, v in arrays.items() if k != "memory.bias"}, 0)
    bad = arrays["memory.weight_ih"].copy()
    bad[0, 0] = np.nan
    with pytest.raises(ConfigError, match="not finite"):
        NumpyPolicy(spec, {**arrays, "memory.weight_ih": bad}, 0)
    # The actor's first layer reads h (cell_size values), not the observation.
    wrong = {**arrays, "actor.0.weight": np.zeros((4, 3), np.float32)}
    with pytest.raises(ConfigError, match=r"expected \[out, 5\]"):
        NumpyPolicy(spec, wrong, 0)
    with pytest.raises(ConfigError, match="the LSTM reads 7 values; the encoded observation has 3"):
        ModelSpec(3, ("actor.0",), "tanh", "categorical", 2, memory=LSTMMemory(4, 7))


def test_conv_encoder_then_memory_matches_torch() -> None:
    torch.manual_seed(4)
    conv = nn.Conv2d(1, 2, 2, stride=2)
    lstm = nn.LSTM(8, 3, batch_first=True)
    head = nn.Linear(3, 3)
    layer = EncoderLayer("encoder.0.0", "conv", 2, (2, 2), (2, 2))
    encoder = ObservationEncoder(16, (ImageEncoder((4, 4, 1), False, 255.0, (layer,)),))
    spec = ModelSpec(
        16, ("actor.0",), "tanh", "categorical", 3, encoder=encoder, memory=LSTMMemory(3, 8)
    )
    arrays = {
        "encoder.0.0.weight": conv.weight.detach().numpy(),
        "encoder.0.0.bias": conv.bias.detach().numpy(),
        "actor.0.weight": head.weight.detach().numpy(),
        "actor.0.bias": head.bias.detach().numpy(),
        "memory.weight_ih": lstm.weight_ih_l0.detach().numpy(),
        "memory.weight_hh": lstm.weight_hh_l0.detach().numpy(),
        "memory.bias": (lstm.bias_ih_l0 + lstm.bias_hh_l0).detach().numpy(),
    }
    policy = NumpyPolicy(ModelSpec.from_wire(spec.to_wire()), arrays, 0)
    images = np.random.default_rng(5).integers(0, 256, (2, 3, 4, 4, 1)).astype(np.float32)
    with torch.no_grad():
        x = torch.from_numpy(images / 255.0).permute(0, 1, 4, 2, 3).reshape(6, 1, 4, 4)
        features = torch.relu(conv(x)).reshape(2, 3, 8)
        want = head(lstm(features)[0]).numpy()
    state = policy.initial_state(2)
    for t in range(3):
        logits, state = policy.recurrent_forward(images[:, t].reshape(2, 16), state)
        np.testing.assert_allclose(logits, want[:, t], rtol=1e-5, atol=1e-5)


def _masked_policy() -> NumpyPolicy:
    """Mask of 3 first, 2 observed values, an LSTM of 2 cells and a linear head of 3 logits."""
    spec = ModelSpec(
        5, ("actor.0",), "tanh", "categorical", 3, action_mask=(0, 3), memory=LSTMMemory(2, 2)
    )
    arrays = {
        **{k: v[:, :2] if k == "memory.weight_ih" else v for k, v in _tiny_arrays().items()},
        "actor.0.weight": np.array([[4.0, 0.0], [0.0, 4.0], [-4.0, -4.0]], np.float32),
        "actor.0.bias": np.array([3.0, 0.0, 0.0], np.float32),
    }
    return NumpyPolicy(ModelSpec.from_wire(spec.to_wire()), arrays, 0, seed=7)


def test_masks_with_memory_never_take_an_illegal_choice_and_the_state_ignores_the_mask() -> None:
    policy = _masked_policy()
    rows = 64
    obs = np.random.default_rng(8).standard_normal((rows, 5)).astype(np.float32)
    obs[:, :3] = 1.0
    obs[:, 0] = 0.0  # the favourite (bias 3) illegal everywhere
    state = policy.initial_state(rows)
    unmasked = obs.copy()
    unmasked[:, :3] = 1.0
    for _ in range(3):
        out = policy.compute_actions(obs, state=state)
        assert (out.actions != 0).all()
        np.testing.assert_allclose(policy.log_prob(obs, out.actions, state), out.logp, rtol=1e-5)
        other = policy.compute_actions(unmasked, state=state)
        assert other.state is not None and out.state is not None
        assert np.array_equal(out.state, other.state)  # the LSTM reads the observation only
        greedy = compute_actions(policy, obs, np.arange(rows) % 2 == 0, state)
        assert (greedy.actions != 0).all() and np.array_equal(greedy.state, out.state)  # type: ignore[arg-type]
        state = out.state
