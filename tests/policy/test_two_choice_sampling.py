"""NumpyPolicy with two choices (its own sampling shortcut): softmax frequencies, exact logp."""

from __future__ import annotations

import numpy as np
import torch
from gymnasium import spaces

from rlserve.learners.models import ActorCritic
from rlserve.policy import NumpyPolicy

OBS_SPACE = spaces.Box(-np.inf, np.inf, (3,), np.float32)


def test_two_choices_follow_the_softmax_and_report_their_logp() -> None:
    torch.manual_seed(0)
    model = ActorCritic(OBS_SPACE, spaces.Discrete(2), (8,), "tanh")
    with torch.no_grad():
        for p in model.actor.parameters():
            p.normal_(0.0, 0.6)
    policy = NumpyPolicy(model.spec(), model.actor_arrays(), version=1, seed=3)
    obs = np.random.default_rng(1).normal(0, 1.5, (8, 3)).astype(np.float32)
    with torch.no_grad():
        probs = torch.softmax(model.actor(torch.as_tensor(obs)), dim=-1).numpy()
    counts = np.zeros((8, 2))
    rounds = 4000
    for _ in range(rounds):
        out = policy.compute_actions(obs)  # batches of 8: the small-batch path
        assert out.actions.dtype == np.int64 and out.logp.dtype == np.float32
        counts[np.arange(8), out.actions] += 1
        np.testing.assert_allclose(out.logp, policy.log_prob(obs, out.actions), atol=1e-6)
    # Seeded, so deterministic; 4000 draws put each frequency within 0.035 of its probability.
    np.testing.assert_allclose(counts / rounds, probs, atol=0.035)


def _general_path(out: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """The categorical sampling of any number of choices, as NumpyPolicy does it for K > 2."""
    shifted = out - np.maximum.reduce(out, axis=1, keepdims=True)
    weights = np.exp(shifted)
    total = np.add.reduce(weights, axis=1)
    u = rng.random(out.shape[0]) * total
    below = np.less(np.cumsum(weights[:, :-1], axis=1), u[:, None])
    actions = np.add.reduce(below, axis=1, dtype=np.int64)
    logp = shifted[np.arange(out.shape[0]), actions] - np.log(total)
    return actions, logp.astype(np.float32)


def test_two_choices_give_the_general_paths_bits() -> None:
    model = ActorCritic(OBS_SPACE, spaces.Discrete(2), (4,), "tanh")
    policy = NumpyPolicy(model.spec(), model.actor_arrays(), version=1, seed=5)
    reference = np.random.default_rng(5)
    data = np.random.default_rng(2)
    for rows in (2, 8, 64):
        for scale in (0.01, 1.0, 30.0):
            logits = data.normal(0.0, scale, (rows, 2)).astype(np.float32)
            logits[0] = (-0.0, 0.0)  # a tie of signed zeros
            logits[1] = (3.0, 3.0)  # a tie
            want_actions, want_logp = _general_path(logits.copy(), reference)
            got = policy._sample_two(logits.copy())
            assert got.actions.dtype == np.int64 and got.logp.dtype == np.float32
            assert got.actions.tobytes() == want_actions.tobytes()
            assert got.logp.tobytes() == want_logp.tobytes()
