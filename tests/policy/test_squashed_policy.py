"""The numpy policy's squashed Gaussian (SAC) against the torch actor it mirrors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces

from rlserve.errors import UnsupportedSpaceError
from rlserve.learners.registry import algorithm
from rlserve.learners.sac import to_squashed
from rlserve.learners.sac_config import check_sac_spaces
from rlserve.learners.sac_models import SquashedGaussianActor
from rlserve.policy import ModelSpec, NumpyPolicy

OBS_SPACE = spaces.Box(-np.inf, np.inf, (5,), np.float32)
BOX = spaces.Box(np.array([-100.0, -2.0, 0.0], np.float32), np.array([100.0, 2.0, 0.5], np.float32))


def _actor(activation: str = "relu", seed: int = 0) -> SquashedGaussianActor:
    torch.manual_seed(seed)
    actor = SquashedGaussianActor(OBS_SPACE, BOX, (16, 8), activation)
    with torch.no_grad():
        for p in actor.actor.parameters():
            p.normal_(0.0, 0.4)  # outputs of a few units: the tanh and the clamp both matter
    return actor


def _policy(actor: SquashedGaussianActor, seed: int = 0) -> NumpyPolicy:
    return NumpyPolicy(actor.spec(), actor.actor_arrays(), version=3, seed=seed)


def _obs(n: int = 64, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 1.5, (n, 5)).astype(np.float32)


def _bounds() -> tuple[np.ndarray, np.ndarray]:
    return BOX.low.astype(np.float64), BOX.high.astype(np.float64)


@pytest.mark.parametrize("activation", ["tanh", "relu"])
def test_log_prob_matches_torch(activation: str) -> None:
    actor = _actor(activation)
    policy = _policy(actor)
    obs = _obs()
    low, high = _bounds()
    actions = np.random.default_rng(2).uniform(low, high, (len(obs), 3)).astype(np.float32)
    with torch.no_grad():
        squashed = torch.as_tensor(to_squashed(actions, low, high))
        expected = actor.log_prob(torch.as_tensor(obs), squashed) - actor.log_scale
    out = policy.log_prob(obs, actions)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, expected.numpy(), atol=2e-4, rtol=1e-5)


def test_greedy_actions_match_torch_and_lie_in_the_box() -> None:
    actor = _actor()
    policy = _policy(actor)
    obs = _obs()
    low, high = _bounds()
    with torch.no_grad():
        mode = actor.deterministic(torch.as_tensor(obs)).numpy().astype(np.float64)
    expected = low + (mode + 1.0) / 2.0 * (high - low)
    out = policy.compute_actions(obs, explore=False)
    np.testing.assert_allclose(out.actions, expected, atol=1e-4, rtol=1e-5)
    # Recomputed from the float32 action: well-conditioned away from the bounds only (near
    # them tanh is flat, and float32 rounding moves atanh a lot).
    inner = (np.abs(mode) < 0.99).all(axis=1)
    assert inner.sum() > 20
    recomputed = policy.log_prob(obs[inner], out.actions[inner])
    np.testing.assert_allclose(out.logp[inner], recomputed, atol=1e-3)
    env = policy.to_env_actions(out.actions)
    assert (env >= BOX.low).all() and (env <= BOX.high).all()


def test_samples_have_the_torch_actor_s_distribution() -> None:
    actor = _actor()
    policy = _policy(actor, seed=5)
    candidates = _obs()
    with torch.no_grad():
        means, _ = actor.params(torch.as_tensor(candidates))
    # The observation whose actions are furthest from the bounds on every value.
    row = int(means.abs().max(dim=1).values.argmin())
    obs = np.repeat(candidates[row : row + 1], 20_000, axis=0)
    low, high = _bounds()
    out = policy.compute_actions(obs, explore=True)
    assert (out.actions >= BOX.low).all() and (out.actions <= BOX.high).all()
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        squashed, logp = actor.sample(torch.as_tensor(obs), generator)
    torch_actions = low + (squashed.numpy().astype(np.float64) + 1.0) / 2.0 * (high - low)
    spread = high - low
    np.testing.assert_allclose(
        out.actions.mean(axis=0) / spread, torch_actions.mean(axis=0) / spread, atol=0.01
    )
    np.testing.assert_allclose(
        out.actions.std(axis=0) / spread, torch_actions.std(axis=0) / spread, atol=0.01
    )
    # The log-density the numpy policy reports is that of the action it sent (recomputed
    # away from the bounds, where float32 keeps atanh well-conditioned).
    inner = (np.abs(to_squashed(out.actions, low, high)) < 0.99).all(axis=1)
    assert inner.sum() > 500
    np.testing.assert_allclose(
        out.logp[inner], policy.log_prob(obs[inner], out.actions[inner]), atol=2e-3
    )
    # ... and torch's, in squashed units, differs by the scaling's log-Jacobian only.
    assert float(np.mean(out.logp)) == pytest.approx(float(logp.mean()) - actor.log_scale, abs=0.05)


def test_spec_round_trips_the_wire_and_needs_no_log_std_array() -> None:
    actor = _actor()
    spec = actor.spec()
    assert spec.distribution == "squashed_gaussian"
    assert spec.action_dim == 6  # three means and three log-stds
    again = ModelSpec.from_wire(spec.to_wire())
    assert again == spec
    assert "log_std" not in actor.actor_arrays()
    obs = _obs(4)
    np.testing.assert_array_equal(
        NumpyPolicy(again, actor.actor_arrays(), 1).forward(obs), _policy(actor).forward(obs)
    )


def test_sac_refuses_spaces_it_cannot_act_in() -> None:
    with pytest.raises(UnsupportedSpaceError, match=r"float Box action spaces only, not Discrete"):
        check_sac_spaces(OBS_SPACE, spaces.Discrete(3))
    with pytest.raises(UnsupportedSpaceError, match="infinite bound"):
        check_sac_spaces(OBS_SPACE, spaces.Box(-np.inf, np.inf, (2,), np.float32))
    with pytest.raises(UnsupportedSpaceError, match="float Box"):
        check_sac_spaces(OBS_SPACE, spaces.Box(0, 5, (2,), np.int64))
    # The registry's check adds the algorithms that learn the spaces instead.
    with pytest.raises(UnsupportedSpaceError, match=r"learn these spaces: ppo, dqn$"):
        algorithm("sac").check(OBS_SPACE, spaces.Discrete(3))
    assert check_sac_spaces(OBS_SPACE, BOX).kind == "squashed_gaussian"
