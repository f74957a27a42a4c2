"""PPO with memory: the recurrent model, the chunked batch, the learner on a memory task."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from gymnasium import spaces
from recurrent_task import ACTIONS, OBS_SPACE, act

from rlserve.errors import ConfigError
from rlserve.learners.ppo import PPOLearner, PPOSettings
from rlserve.learners.ppo_losses import clipped_policy_loss, normalise_advantages, value_loss
from rlserve.learners.ppo_sequences import build_sequence_batch, valid_steps
from rlserve.learners.recurrent_models import RecurrentActorCritic
from rlserve.policy import NumpyPolicy
from rlserve.protocol.fragment import Fragment

BOX = spaces.Box(-2.0, 2.0, (4,), np.float32)


def _model(
    action_space: spaces.Space[Any] = ACTIONS, cell: int = 5, seed: int = 0
) -> RecurrentActorCritic:
    torch.manual_seed(seed)
    return RecurrentActorCritic(BOX, action_space, (8,), "tanh", cell_size=cell)


def _fragment(steps: int, rng: np.random.Generator, state_size: int, **kw: Any) -> Fragment:
    fields: dict[str, Any] = {
        "episode_id": "e",
        "agent_id": "agent0",
        "policy_id": "default",
        "obs": rng.uniform(-1, 1, (steps + 1, 4)).astype(np.float32),
        "actions": rng.integers(0, 2, steps).astype(np.int64),
        "rewards": rng.normal(size=steps).astype(np.float32),
        "behaviour_logp": np.full(steps, -0.7, dtype=np.float32),
        "policy_chosen": np.ones(steps, dtype=bool),
        "weights_version": np.zeros(steps, dtype=np.int64),
        "terminated": False,
        "truncated": False,
        "state_in": rng.normal(0, 0.5, state_size).astype(np.float32),
    }
    fields.update(kw)
    return Fragment(**fields)


def _settings(**overrides: Any) -> PPOSettings:
    base: dict[str, Any] = {
        "use_lstm": True,
        "lstm_cell_size": 5,
        "hidden": (8,),
        "max_seq_len": 20,
        "train_batch_size": 40,
        "minibatch_size": 40,
        "num_epochs": 2,
        "device": "cpu",
    }
    return PPOSettings(**(base | overrides))


# -- the model -------------------------------------------------------------------------------


def test_the_sequence_forward_equals_a_step_by_step_loop() -> None:
    model = _model()
    rng = np.random.default_rng(0)
    obs = torch.as_tensor(rng.uniform(-1, 1, (3, 7, 4)).astype(np.float32))
    state = torch.as_tensor(rng.normal(0, 0.5, (3, 10)).astype(np.float32))
    with torch.no_grad():
        h_seq, last = model.unroll(obs, state)
        stepped = state
        for t in range(7):
            h, stepped = model.step(obs[:, t], stepped)
            torch.testing.assert_close(h, h_seq[:, t], rtol=0, atol=1e-6)
            torch.testing.assert_close(h, stepped[:, :5])
    torch.testing.assert_close(last, stepped, rtol=0, atol=1e-6)


def test_the_spec_and_arrays_follow_the_contract() -> None:
    model = _model(cell=6)
    spec = model.spec()
    assert spec.memory is not None
    assert (spec.memory.cell_size, spec.memory.input_dim, spec.state_size) == (6, 4, 12)
    arrays = model.actor_arrays()
    assert arrays["memory.weight_ih"].shape == (24, 4)
    assert arrays["memory.weight_hh"].shape == (24, 6)
    lstm = model.memory
    expected = (lstm.bias_ih_l0 + lstm.bias_hh_l0).detach().numpy()
    np.testing.assert_array_equal(arrays["memory.bias"], expected)
    assert {a.dtype for a in arrays.values()} == {np.dtype(np.float32)}
    assert set(arrays) >= {"actor.0.weight", "actor.2.bias"}
    assert not any(name.startswith("critic") for name in arrays)


@pytest.mark.parametrize("action_space", [ACTIONS, spaces.Box(-1.0, 1.0, (2,), np.float32)])
def test_torch_and_the_numpy_policy_agree_step_by_step(action_space: spaces.Space[Any]) -> None:
    model = _model(action_space, cell=7, seed=3)
    with torch.no_grad():  # biases away from zero, so that they are checked too
        for parameter in model.memory.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.3)
    policy = NumpyPolicy(model.spec(), model.actor_arrays(), 0)
    rng = np.random.default_rng(1)
    state_np = policy.initial_state(4)
    state_t = model.initial_state(4)
    for _ in range(6):
        obs = rng.uniform(-1, 1, (4, 4)).astype(np.float32)
        out = policy.compute_actions(obs, explore=True, state=state_np)
        with torch.no_grad():
            h, state_t = model.step(torch.as_tensor(obs), state_t)
            actions = torch.as_tensor(out.actions)
            logp, _ = model.log_prob_entropy(torch.as_tensor(obs), actions, h)
        np.testing.assert_allclose(out.state, state_t.numpy(), rtol=0, atol=1e-5)
        np.testing.assert_allclose(out.logp, logp.numpy(), rtol=0, atol=1e-5)
        np.testing.assert_allclose(policy.log_prob(obs, out.actions, state_np), out.logp, atol=1e-5)
        greedy = policy.compute_actions(obs, explore=False, state=state_np)
        if isinstance(action_space, spaces.Discrete):
            with torch.no_grad():
                best = model.params(torch.as_tensor(obs), h).argmax(-1).numpy()
            np.testing.assert_array_equal(greedy.actions, best)
        state_np = out.state


# -- the batch of chunks ---------------------------------------------------------------------


def test_a_fragment_of_45_steps_is_cut_into_chunks_of_20_20_and_5() -> None:
    model = _model()
    rng = np.random.default_rng(0)
    fragment = _fragment(45, rng, model.state_size)
    batch = build_sequence_batch([fragment], model, _settings(), 0, None, None, torch.device("cpu"))
    tensors = batch.tensors
    assert tensors is not None
    assert tensors["obs"].shape == (3, 20, 4)
    assert tensors["valid"].sum(1).tolist() == [20, 20, 5]
    assert not tensors["valid"][2, 5:].any()
    np.testing.assert_array_equal(tensors["obs"].reshape(60, 4)[:45].numpy(), fragment.obs[:45])
    # Each chunk starts from the state the model reaches there from state_in.
    state = torch.as_tensor(fragment.state_in)[None]
    with torch.no_grad():
        _, after_20 = model.unroll(torch.as_tensor(fragment.obs[None, :20]), state)
        _, after_40 = model.unroll(torch.as_tensor(fragment.obs[None, :40]), state)
    starts = tensors["state_in"]
    torch.testing.assert_close(starts[0], state[0])
    torch.testing.assert_close(starts[1], after_20[0], rtol=0, atol=1e-6)
    torch.testing.assert_close(starts[2], after_40[0], rtol=0, atol=1e-6)
    # The values and the proximal log-probabilities are the model's from state_in.
    with torch.no_grad():
        h, _ = model.unroll(torch.as_tensor(fragment.obs[None]), state)
        obs = torch.as_tensor(fragment.obs)
        values = model.value(obs, h[0]).numpy()
        prox, _ = model.log_prob_entropy(obs[:45], torch.as_tensor(fragment.actions), h[0, :45])
    valid = tensors["valid"]
    np.testing.assert_allclose(tensors["values"][valid].numpy(), values[:45], atol=1e-6)
    np.testing.assert_allclose(tensors["prox_logp"][valid].numpy(), prox.numpy(), atol=1e-6)
    # Truncation bootstrapping as without memory: the last return leans on V(obs[T]).
    gamma, lam = 0.99, 0.95
    last = tensors["returns"][valid][-1].item()
    assert last == pytest.approx(fragment.rewards[-1] + gamma * values[45], abs=1e-5)
    assert lam  # the last step's advantage is its TD error whatever lambda


def _loss(model: RecurrentActorCritic, minibatch: dict[str, torch.Tensor]) -> torch.Tensor:
    obs, features, columns = valid_steps(model, minibatch)
    logp, entropy = model.log_prob_entropy(obs, columns["actions"], features)
    policy, _ = clipped_policy_loss(
        logp,
        columns["prox_logp"],
        normalise_advantages(columns["advantages"]),
        0.2,
        columns["weights"],
    )
    values = model.value(obs, features)
    return policy + 0.5 * value_loss(values, columns["returns"]) - 0.01 * entropy.mean()


def test_padded_steps_change_neither_the_loss_nor_its_gradient() -> None:
    model = _model()
    rng = np.random.default_rng(2)
    fragment = _fragment(45, rng, model.state_size)
    batch = build_sequence_batch([fragment], model, _settings(), 0, None, None, torch.device("cpu"))
    assert batch.tensors is not None
    tensors = dict(batch.tensors)
    loss = _loss(model, tensors)
    grads = torch.autograd.grad(loss, list(model.parameters()), allow_unused=True)
    changed = dict(tensors)
    for name in ("obs", "advantages", "returns", "prox_logp"):
        column = tensors[name].clone()
        column[2, 5:] = 1e3  # padding only
        changed[name] = column
    changed_loss = _loss(model, changed)
    assert changed_loss.item() == loss.item()
    changed_grads = torch.autograd.grad(changed_loss, list(model.parameters()), allow_unused=True)
    for a, b in zip(grads, changed_grads, strict=True):
        if a is not None:
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    # A valid step's observation does change it (the test can fail).
    valid_changed = dict(tensors)
    obs = tensors["obs"].clone()
    obs[2, 4] = 1e3
    valid_changed["obs"] = obs
    assert _loss(model, valid_changed).item() != loss.item()


def test_the_first_minibatch_starts_at_the_proximal_policy() -> None:
    """Unrolled from the stored chunk starts, the model's log-probs are the proximal ones."""
    model = _model()
    rng = np.random.default_rng(4)
    fragments = [_fragment(n, rng, model.state_size) for n in (45, 3, 21)]
    batch = build_sequence_batch(fragments, model, _settings(), 0, None, None, torch.device("cpu"))
    assert batch.tensors is not None
    assert batch.tensors["valid"].sum().item() == 69
    with torch.no_grad():
        obs, features, columns = valid_steps(model, batch.tensors)
        logp, _ = model.log_prob_entropy(obs, columns["actions"], features)
    torch.testing.assert_close(logp, columns["prox_logp"], rtol=0, atol=1e-6)


def test_stale_steps_are_invalid_but_still_carry_the_state() -> None:
    model = _model()
    rng = np.random.default_rng(5)
    versions = np.array([0] * 10 + [3] * 15, dtype=np.int64)
    fragment = _fragment(25, rng, model.state_size, weights_version=versions)
    batch = build_sequence_batch(
        [fragment], model, _settings(max_seq_len=10), 3, None, None, torch.device("cpu")
    )
    assert batch.tensors is not None
    # The first chunk has no fresh step and is left out; the second starts from its state.
    assert batch.tensors["valid"].sum(1).tolist() == [10, 5]
    with torch.no_grad():
        _, after_10 = model.unroll(
            torch.as_tensor(fragment.obs[None, :10]), torch.as_tensor(fragment.state_in)[None]
        )
    torch.testing.assert_close(batch.tensors["state_in"][0], after_10[0], rtol=0, atol=1e-6)


def test_logged_steps_and_the_step_cap_leave_steps_out_of_the_losses_only() -> None:
    model = _model()
    rng = np.random.default_rng(6)
    chosen = np.ones(30, dtype=bool)
    chosen[12:15] = False  # logged with log_action: left out, the state carried on
    old = _fragment(30, rng, model.state_size, policy_chosen=chosen)
    new = _fragment(30, rng, model.state_size, weights_version=np.ones(30, np.int64))
    cfg = _settings(max_seq_len=10, max_steps_per_update=50)
    batch = build_sequence_batch([old, new], model, cfg, 1, None, None, torch.device("cpu"))
    assert batch.tensors is not None
    # 57 fresh policy steps, the 7 oldest over the cap: the first chunk of the older fragment.
    assert (batch.steps_logged, batch.steps_dropped_cap) == (3, 7)
    assert batch.tensors["valid"].sum(1).tolist() == [3, 7, 10, 10, 10, 10]
    assert not batch.tensors["valid"][1, 2:5].any()
    with torch.no_grad():
        _, after_20 = model.unroll(
            torch.as_tensor(old.obs[None, :20]), torch.as_tensor(old.state_in)[None]
        )
    torch.testing.assert_close(batch.tensors["state_in"][2], after_20[0], rtol=0, atol=1e-6)


# -- the learner -----------------------------------------------------------------------------


def test_a_fragment_without_state_in_is_refused_naming_the_fix(
    caplog: pytest.LogCaptureFixture,
) -> None:
    learner = PPOLearner(BOX, ACTIONS, _settings())
    rng = np.random.default_rng(0)
    missing = _fragment(5, rng, 10, state_in=None)
    wrong = _fragment(5, rng, 7)
    fine = _fragment(5, rng, 10)
    with caplog.at_level("WARNING", logger="rlserve.learner"):
        learner.ingest([missing, wrong, fine])
    assert learner.counters()["fragments_excluded_invalid"] == 2
    assert learner.buffered_steps == 5
    assert "has no state_in, and this policy has memory (use_lstm)" in caplog.text
    assert learner.sanitise(wrong)[1] == "state_in has shape [7], expected [10]"
    nonfinite = dataclasses.replace(fine, state_in=np.full(10, np.nan, np.float32))
    assert "state_in holds nan" in learner.sanitise(nonfinite)[1]


def test_weights_and_checkpoints_carry_the_memory(tmp_path: Path) -> None:
    learner = PPOLearner(BOX, ACTIONS, _settings())
    rng = np.random.default_rng(0)
    learner.ingest([_fragment(40, rng, 10)])
    learner.update()
    package = learner.weights()
    assert package.spec.state_size == 10
    NumpyPolicy(package.spec, package.arrays, package.version)  # the client can build it
    path = tmp_path / "ckpt.pt"
    learner.save(path, {})
    assert any(k.startswith("memory.") for k in torch.load(path, weights_only=True)["model"])
    other = PPOLearner(BOX, ACTIONS, _settings(seed=1))
    other.load(path)
    for a, b in zip(learner.model.parameters(), other.model.parameters(), strict=True):
        torch.testing.assert_close(a, b)
    plain = PPOLearner(BOX, ACTIONS, _settings(use_lstm=False))
    with pytest.raises(ValueError, match="memory settings must be the same"):
        plain.initialise_from(path)


def test_the_minibatches_are_whole_chunks() -> None:
    learner = PPOLearner(BOX, ACTIONS, _settings(max_seq_len=10, minibatch_size=20, num_epochs=1))
    rng = np.random.default_rng(0)
    learner.ingest([_fragment(40, rng, 10)])
    seen: list[tuple[int, ...]] = []
    original = learner._minibatch

    def record(minibatch: dict[str, torch.Tensor], *args: Any) -> bool:
        seen.append(tuple(minibatch["obs"].shape))
        return original(minibatch, *args)

    learner._minibatch = record  # type: ignore[method-assign]
    metrics = learner.update()
    assert seen == [(2, 10, 4), (2, 10, 4)]
    assert metrics["learner/batch_steps"] == 40


def test_settings_errors_name_the_fix() -> None:
    with pytest.raises(ConfigError, match="max_seq_len must be a whole number of 1 or more"):
        PPOSettings(max_seq_len=0)
    with pytest.raises(ConfigError, match="lstm_cell_size must be a whole number of 1 or more"):
        PPOSettings(lstm_cell_size=True)


@pytest.mark.timeout(120)
def test_the_learner_learns_to_repeat_the_cue() -> None:
    """Fragments cut mid-episode, each from its state_in: only memory earns more than 0.5."""
    cfg = PPOSettings(
        use_lstm=True,
        lstm_cell_size=16,
        hidden=(32,),
        max_seq_len=4,
        train_batch_size=512,
        minibatch_size=64,
        num_epochs=4,
        lr=1e-3,
        device="cpu",
        # act() feeds the model raw observations: the learner must read them raw too, or the
        # policy acting (and measured) is not the one trained.
        normalize_observations=False,
    )
    learner = PPOLearner(OBS_SPACE, ACTIONS, cfg)
    model = learner.model
    assert isinstance(model, RecurrentActorCritic)
    rng = np.random.default_rng(0)
    before = act(model, 512, rng)[1]
    best = 0.0
    for _ in range(40):
        fragments, _ = act(model, 128, rng, learner.version)
        learner.ingest(fragments)
        learner.update()
        best = max(best, act(model, 256, rng, learner.version)[1])
        if best >= 0.9:
            break
    assert before < 0.6
    assert best >= 0.9  # without memory (or without state_in) at most 0.5 is to be had


# -- with images, masks and normalisation; on cuda --------------------------------------------

MASKED = spaces.Dict(
    {"action_mask": spaces.MultiBinary(3), "observations": spaces.Box(-1.0, 1.0, (4,), np.float32)}
)
SPACES: dict[str, tuple[spaces.Space[Any], dict[str, Any]]] = {
    "image": (spaces.Box(0, 255, (7, 7, 3), np.uint8), {}),
    "mask": (MASKED, {}),
    "normalised": (spaces.Box(-np.inf, np.inf, (4,), np.float32), {"normalize_observations": True}),
}


def _random_fragment(
    space: spaces.Space[Any], steps: int, state_size: int, rng: np.random.Generator
) -> Fragment:
    space.seed(int(rng.integers(1 << 31)))
    rows = []
    for _ in range(steps + 1):
        sample = space.sample()
        if isinstance(space, spaces.Dict):
            sample["action_mask"][:] = 0
            sample["action_mask"][int(rng.integers(3))] = 1
        rows.append(spaces.flatten(space, sample).astype(np.float32))
    obs = np.stack(rows)
    if isinstance(space, spaces.Dict):
        actions = obs[:steps, :3].argmax(1).astype(np.int64)  # the legal one
    else:
        actions = rng.integers(0, 3, steps).astype(np.int64)
    return _fragment(steps, rng, state_size, obs=obs, actions=actions)


def _trains_and_publishes(space: spaces.Space[Any], **overrides: Any) -> PPOLearner:
    learner = PPOLearner(space, spaces.Discrete(3), _settings(**overrides))
    rng = np.random.default_rng(0)
    fragments = [_random_fragment(space, n, 10, rng) for n in (25, 15)]
    learner.ingest(fragments)
    metrics = learner.update()
    assert learner.version == 1
    assert all(np.isfinite(v) for k, v in metrics.items() if k != "learner/explained_variance")
    # The published policy acts as the learner's model: the log-probabilities of a fragment's
    # actions, stepped from its state_in, are those of a fresh replay.
    package = learner.weights()
    policy = NumpyPolicy(package.spec, package.arrays, package.version)
    fragment = fragments[0]
    state = fragment.state_in[None]
    logps = []
    for t in range(len(fragment)):
        logps.append(policy.log_prob(fragment.obs[t : t + 1], fragment.actions[t : t + 1], state))
        state = policy.compute_actions(fragment.obs[t : t + 1], False, state).state
    learner.ingest([dataclasses.replace(fragment, weights_version=np.ones(25, np.int64))])
    batch = learner._build_batch()
    assert batch is not None
    np.testing.assert_allclose(
        np.concatenate(logps), batch["prox_logp"][batch["valid"]].cpu().numpy(), atol=1e-5
    )
    return learner


@pytest.mark.parametrize("name", sorted(SPACES))
def test_memory_with_images_masks_and_normalised_observations(name: str) -> None:
    space, overrides = SPACES[name]
    learner = _trains_and_publishes(space, **overrides)
    model = learner.model
    assert isinstance(model, RecurrentActorCritic)
    assert (model.image is not None) == (name == "image")
    # Memory turns observation normalisation on by default, except for images (raw pixels).
    assert (learner.obs_normalization is not None) == (name != "image")


def test_memory_normalises_observations_and_rewards_unless_told_not_to() -> None:
    bounded = spaces.Box(-1.0, 1.0, (2,), np.float32)
    learner = PPOLearner(bounded, spaces.Discrete(2), _settings())
    assert learner.obs_normalization is not None and learner.return_scaler is not None
    off = _settings(normalize_observations=False, normalize_rewards=False)
    learner = PPOLearner(bounded, spaces.Discrete(2), off)
    assert learner.obs_normalization is None and learner.return_scaler is None
    plain = dataclasses.replace(_settings(), use_lstm=False)
    learner = PPOLearner(bounded, spaces.Discrete(2), plain)
    assert learner.obs_normalization is None and learner.return_scaler is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_recurrent_learner_trains_on_cuda_and_resumes_on_the_cpu(tmp_path: Path) -> None:
    learner = _trains_and_publishes(BOX, device="cuda")
    assert next(learner.model.parameters()).device.type == "cuda"
    path = tmp_path / "ckpt.pt"
    learner.save(path, {})
    cpu = PPOLearner(BOX, spaces.Discrete(3), _settings(device="cpu"))
    cpu.load(path)
    for a, b in zip(learner.model.parameters(), cpu.model.parameters(), strict=True):
        torch.testing.assert_close(a.cpu(), b)
