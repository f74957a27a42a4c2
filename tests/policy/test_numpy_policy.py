"""NumpyPolicy against the torch ActorCritic it mirrors."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from gymnasium import spaces

from float_paths import assert_same_choices
from rlserve.errors import ConfigError
from rlserve.learners.models import ActorCritic
from rlserve.policy import ModelSpec, NumpyPolicy
from rlserve.policy.matmul import serial_matmul

OBS_SPACE = spaces.Box(-np.inf, np.inf, (5,), np.float32)
DISCRETE = spaces.Discrete(4)
BOX = spaces.Box(np.array([-1.0, -2.0, 0.0], np.float32), np.array([1.0, 2.0, 0.5], np.float32))


def _model(action_space: spaces.Space[Any], activation: str, seed: int = 0) -> ActorCritic:
    torch.manual_seed(seed)
    model = ActorCritic(OBS_SPACE, action_space, (16, 8), activation)
    with torch.no_grad():
        # The policy head is initialised near zero; spread the weights so that a mismatch in any
        # layer shows in the outputs.
        for p in model.actor.parameters():
            p.normal_(0.0, 0.6)
        model.log_std.copy_(torch.linspace(-0.7, 0.4, model.action_dim))
    return model


def _policy(model: ActorCritic, seed: int = 0) -> NumpyPolicy:
    return NumpyPolicy(model.spec(), model.actor_arrays(), version=7, seed=seed)


def _obs(n: int = 64, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 1.5, (n, 5)).astype(np.float32)


@pytest.mark.parametrize("activation", ["tanh", "relu"])
@pytest.mark.parametrize("action_space", [DISCRETE, BOX], ids=["discrete", "box"])
def test_forward_matches_torch(action_space: spaces.Space[Any], activation: str) -> None:
    model = _model(action_space, activation)
    policy = _policy(model)
    obs = _obs()
    with torch.no_grad():
        expected = model.actor(torch.as_tensor(obs)).numpy()
    out = policy.forward(obs)
    assert out.shape == expected.shape
    assert np.abs(expected).max() > 0.5  # a non-trivial output
    np.testing.assert_allclose(out, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("activation", ["tanh", "relu"])
def test_discrete_log_prob_matches_torch(activation: str) -> None:
    model = _model(DISCRETE, activation)
    policy = _policy(model)
    obs = _obs()
    actions = np.random.default_rng(2).integers(0, 4, size=len(obs))
    with torch.no_grad():
        expected, _ = model.log_prob_entropy(torch.as_tensor(obs), torch.as_tensor(actions))
    out = policy.log_prob(obs, actions)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, expected.numpy(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("activation", ["tanh", "relu"])
def test_box_log_prob_matches_torch(activation: str) -> None:
    model = _model(BOX, activation)
    policy = _policy(model)
    obs = _obs()
    actions = np.random.default_rng(3).normal(0, 1, (len(obs), 3)).astype(np.float32)
    with torch.no_grad():
        expected, _ = model.log_prob_entropy(torch.as_tensor(obs), torch.as_tensor(actions))
    out = policy.log_prob(obs, actions)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, expected.numpy(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("action_space", [DISCRETE, BOX], ids=["discrete", "box"])
def test_sampled_logp_matches_torch(action_space: spaces.Space[Any]) -> None:
    model = _model(action_space, "tanh")
    policy = _policy(model, seed=11)
    obs = _obs()
    out = policy.compute_actions(obs)
    with torch.no_grad():
        expected, _ = model.log_prob_entropy(torch.as_tensor(obs), torch.as_tensor(out.actions))
    np.testing.assert_allclose(out.logp, expected.numpy(), atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(out.logp, policy.log_prob(obs, out.actions), atol=1e-5)


def test_output_dtypes_and_shapes() -> None:
    obs = _obs(9)
    discrete = _policy(_model(DISCRETE, "tanh")).compute_actions(obs)
    assert discrete.actions.shape == (9,)
    assert discrete.actions.dtype == np.int64
    assert discrete.logp.shape == (9,)
    assert discrete.logp.dtype == np.float32
    assert ((discrete.actions >= 0) & (discrete.actions < 4)).all()
    box = _policy(_model(BOX, "tanh")).compute_actions(obs)
    assert box.actions.shape == (9, 3)
    assert box.actions.dtype == np.float32
    assert box.logp.dtype == np.float32


def test_categorical_sample_frequencies_match_softmax() -> None:
    model = _model(DISCRETE, "tanh", seed=4)
    policy = _policy(model, seed=123)
    n = 20_000
    one = _obs(1, seed=5)
    with torch.no_grad():
        probs = torch.softmax(model.actor(torch.as_tensor(one)), dim=-1).numpy()[0]
    assert probs.min() > 0.02  # every action can show up
    assert probs.max() - probs.min() > 0.1  # far from uniform, so a uniform sampler fails
    actions = policy.compute_actions(np.repeat(one, n, axis=0)).actions
    counts = np.bincount(actions, minlength=4)
    expected = probs * n
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    # 3 degrees of freedom: P(chi2 > 16.27) = 0.001. Seeded, so this is deterministic.
    assert chi2 < 16.27, (counts, expected)


def test_categorical_sampling_is_seeded() -> None:
    model = _model(DISCRETE, "tanh")
    obs = _obs(200)
    a = _policy(model, seed=9).compute_actions(obs).actions
    b = _policy(model, seed=9).compute_actions(obs).actions
    c = _policy(model, seed=10).compute_actions(obs).actions
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_gaussian_sample_moments() -> None:
    model = _model(BOX, "tanh", seed=6)
    policy = _policy(model, seed=321)
    n = 20_000
    one = _obs(1, seed=7)
    mean = policy.forward(one)[0]
    std = np.exp(model.log_std.detach().numpy())
    actions = policy.compute_actions(np.repeat(one, n, axis=0)).actions
    # Standard errors: std / sqrt(n) for the mean, about std / sqrt(2n) for the std.
    np.testing.assert_array_less(np.abs(actions.mean(0) - mean), 5 * std / np.sqrt(n))
    np.testing.assert_array_less(np.abs(actions.std(0) - std), 5 * std / np.sqrt(2 * n))


def test_no_exploration_takes_argmax() -> None:
    model = _model(DISCRETE, "relu")
    policy = _policy(model)
    obs = _obs()
    out = policy.compute_actions(obs, explore=False)
    with torch.no_grad():
        logits = model.actor(torch.as_tensor(obs)).numpy()
    # Torch and numpy agree on the logits to about 1e-5 (above), not bit for bit: a near-tie
    # may go either way.
    assert_same_choices(out.actions, logits.argmax(axis=1), logits, tol=1e-4)
    assert len(set(out.actions.tolist())) > 1  # not trivially constant
    np.testing.assert_allclose(out.logp, policy.log_prob(obs, out.actions), atol=1e-6)


def test_no_exploration_takes_the_mean() -> None:
    model = _model(BOX, "tanh")
    policy = _policy(model)
    obs = _obs()
    out = policy.compute_actions(obs, explore=False)
    with torch.no_grad():
        means = model.actor(torch.as_tensor(obs)).numpy()
        expected, _ = model.log_prob_entropy(torch.as_tensor(obs), torch.as_tensor(means))
    np.testing.assert_allclose(out.actions, means, atol=1e-5)
    np.testing.assert_allclose(out.logp, expected.numpy(), atol=1e-5)


def test_to_env_actions_clips_box_actions() -> None:
    policy = _policy(_model(BOX, "tanh"))
    actions = np.array([[2.0, -3.0, 0.25], [-0.5, 1.5, -1.0]], np.float32)
    np.testing.assert_array_equal(
        policy.to_env_actions(actions), [[1.0, -2.0, 0.25], [-0.5, 1.5, 0.0]]
    )
    # The sampled (unclipped) actions are left alone.
    assert actions[0, 0] == 2.0


def test_to_env_actions_leaves_discrete_actions() -> None:
    policy = _policy(_model(DISCRETE, "tanh"))
    actions = np.array([0, 3, 1], np.int64)
    np.testing.assert_array_equal(policy.to_env_actions(actions), actions)


def test_version_is_kept() -> None:
    assert _policy(_model(DISCRETE, "tanh")).version == 7


# -- malformed weights -----------------------------------------------------------------------


def _arrays(action_space: spaces.Space[Any] = DISCRETE) -> tuple[ModelSpec, dict[str, np.ndarray]]:
    model = _model(action_space, "tanh")
    return model.spec(), model.actor_arrays()


def test_spec_names_linear_layers() -> None:
    spec, arrays = _arrays()
    assert spec.actor_layers == ("actor.0", "actor.2", "actor.4")
    assert arrays["actor.0.weight"].shape == (16, 5)
    assert arrays["actor.4.bias"].shape == (4,)


@pytest.mark.parametrize(
    ("name", "shape"),
    [
        ("actor.0.weight", (5, 16)),  # transposed
        ("actor.0.weight", (16, 6)),  # wrong input width
        ("actor.2.weight", (8,)),  # not 2-d
        ("actor.2.bias", (7,)),
        ("actor.4.bias", (4, 1)),
        ("actor.4.weight", (5, 8)),  # output wider than action_dim
    ],
)
def test_wrong_weight_shapes(name: str, shape: tuple[int, ...]) -> None:
    spec, arrays = _arrays()
    arrays[name] = np.zeros(shape, np.float32)
    if name == "actor.4.weight":
        arrays["actor.4.bias"] = np.zeros(shape[0], np.float32)
    with pytest.raises(ConfigError):
        NumpyPolicy(spec, arrays, version=0)


def test_missing_weight() -> None:
    spec, arrays = _arrays()
    del arrays["actor.2.bias"]
    with pytest.raises(ConfigError, match=r"actor\.2"):
        NumpyPolicy(spec, arrays, version=0)


def test_gaussian_needs_log_std() -> None:
    spec, arrays = _arrays(BOX)
    del arrays["log_std"]
    with pytest.raises(ConfigError, match="log_std"):
        NumpyPolicy(spec, arrays, version=0)


@pytest.mark.parametrize("shape", [(1,), (2,), (4,)])
def test_gaussian_log_std_of_wrong_shape(shape: tuple[int, ...]) -> None:
    # action_dim is 3: a log_std of another length would broadcast (or fail) at sampling time
    # and give wrong log-probabilities.
    spec, arrays = _arrays(BOX)
    arrays["log_std"] = np.zeros(shape, np.float32)
    with pytest.raises(ConfigError):
        NumpyPolicy(spec, arrays, version=0)


def test_model_spec_wire_round_trip() -> None:
    spec, _ = _arrays(BOX)
    assert ModelSpec.from_wire(spec.to_wire()) == spec


@pytest.mark.parametrize(
    "change",
    [{"activation": "gelu"}, {"distribution": "beta"}, {"obs_dim": "x"}, {"action_dim": None}],
    ids=str,
)
def test_model_spec_from_wire_rejects_bad_values(change: dict[str, Any]) -> None:
    spec, _ = _arrays()
    raw = spec.to_wire()
    raw.update(change)
    with pytest.raises(ConfigError):
        ModelSpec.from_wire(raw)


def test_model_spec_from_wire_missing_field() -> None:
    raw = _arrays()[0].to_wire()
    del raw["actor_layers"]
    with pytest.raises(ConfigError):
        ModelSpec.from_wire(raw)


def test_discrete_start_offsets_the_actions_sent() -> None:
    import gymnasium as gym

    from rlserve.learners.models import ActorCritic

    model = ActorCritic(gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(2, start=5))
    policy = NumpyPolicy(model.spec(), model.actor_arrays(), version=0, seed=0)
    out = policy.compute_actions(np.zeros((64, 3), dtype=np.float32))
    assert set(out.actions.tolist()) <= {0, 1}
    assert set(policy.to_env_actions(out.actions).tolist()) <= {5, 6}


def test_single_decisions_follow_the_softmax_and_report_its_logp() -> None:
    import gymnasium as gym

    from rlserve.learners.models import ActorCritic

    model = ActorCritic(gym.spaces.Box(-1, 1, (2,)), gym.spaces.Discrete(3))
    arrays = model.actor_arrays()
    last = model.spec().actor_layers[-1]
    arrays[f"{last}.weight"] = np.zeros_like(arrays[f"{last}.weight"])
    arrays[f"{last}.bias"] = np.array([0.0, 1.0, -1.0], dtype=np.float32)
    policy = NumpyPolicy(model.spec(), arrays, version=0, seed=3)
    obs = np.zeros((1, 2), dtype=np.float32)
    probs = np.exp([0.0, 1.0, -1.0]) / np.exp([0.0, 1.0, -1.0]).sum()
    counts = np.zeros(3)
    for _ in range(20_000):
        out = policy.compute_actions(obs)
        counts[out.actions[0]] += 1
        assert out.logp[0] == pytest.approx(np.log(probs[out.actions[0]]), abs=1e-5)
    expected = probs * 20_000
    chi2 = float((((counts - expected) ** 2) / expected).sum())
    assert chi2 < 13.8  # p = 0.001 with 2 degrees of freedom
    assert policy.compute_actions(obs, explore=False).actions[0] == 1


@pytest.mark.parametrize("rows", [1, 63, 64, 65, 256, 1000])
def test_a_large_batch_goes_through_small_layers_in_row_blocks_with_the_same_result(
    rows: int,
) -> None:
    rng = np.random.default_rng(rows)
    x = rng.normal(0, 1, (rows, 64)).astype(np.float32)
    w = rng.normal(0, 1, (64, 64)).astype(np.float32)
    out = serial_matmul(x, w)
    assert out.shape == (rows, 64) and out.dtype == np.float32
    np.testing.assert_allclose(out, x @ w, rtol=1e-5, atol=1e-4)
    # A layer too large for two rows per block runs whole, on one BLAS thread.
    big = rng.normal(0, 1, (512, 512)).astype(np.float32)
    np.testing.assert_allclose(
        serial_matmul(x[:, :1].repeat(512, axis=1), big),
        x[:, :1].repeat(512, axis=1) @ big,
        rtol=1e-5,
        atol=1e-3,
    )


def test_a_large_batch_has_the_actions_of_its_rows_one_by_one() -> None:
    model = _model(DISCRETE, "tanh")
    policy = _policy(model)
    obs = _obs(n=300)
    batched = policy.forward(obs)
    one_by_one = np.concatenate([policy.forward(obs[i : i + 1]) for i in range(300)])
    np.testing.assert_allclose(batched, one_by_one, rtol=1e-5, atol=1e-5)
