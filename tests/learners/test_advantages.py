"""GAE against numbers worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from rlserve.learners.advantages import gae

REWARDS = np.array([1.0, 2.0, 3.0], dtype=np.float32)
VALUES = np.array([0.5, 1.0, 1.5], dtype=np.float32)
GAMMA, LAM = 0.9, 0.8


def test_gae_with_bootstrap_by_hand() -> None:
    # bootstrap V(s3) = 2.0, gamma * lam = 0.72
    # delta2 = 3 + 0.9 * 2.0 - 1.5 = 3.3      A2 = 3.3
    # delta1 = 2 + 0.9 * 1.5 - 1.0 = 2.35     A1 = 2.35 + 0.72 * 3.3   = 4.726
    # delta0 = 1 + 0.9 * 1.0 - 0.5 = 1.4      A0 = 1.4  + 0.72 * 4.726 = 4.80272
    adv, ret = gae(REWARDS, VALUES, 2.0, GAMMA, LAM)
    np.testing.assert_allclose(adv, [4.80272, 4.726, 3.3], rtol=1e-6)
    np.testing.assert_allclose(ret, [5.30272, 5.726, 4.8], rtol=1e-6)
    assert adv.dtype == np.float32
    assert ret.dtype == np.float32


def test_gae_terminal_without_bootstrap_by_hand() -> None:
    # delta2 = 3 - 1.5 = 1.5                  A2 = 1.5
    # delta1 = 2.35                           A1 = 2.35 + 0.72 * 1.5  = 3.43
    # delta0 = 1.4                            A0 = 1.4  + 0.72 * 3.43 = 3.8696
    adv, ret = gae(REWARDS, VALUES, 0.0, GAMMA, LAM)
    np.testing.assert_allclose(adv, [3.8696, 3.43, 1.5], rtol=1e-6)
    np.testing.assert_allclose(ret, [4.3696, 4.43, 3.0], rtol=1e-6)


def test_returns_are_advantages_plus_values() -> None:
    rng = np.random.default_rng(0)
    rewards = rng.standard_normal(20).astype(np.float32)
    values = rng.standard_normal(20).astype(np.float32)
    adv, ret = gae(rewards, values, 0.7, 0.99, 0.95)
    np.testing.assert_allclose(ret, adv + values, rtol=1e-6, atol=1e-6)


def _discounted_returns(rewards: np.ndarray, bootstrap: float, gamma: float) -> np.ndarray:
    out = np.zeros(len(rewards))
    running = bootstrap
    for t in reversed(range(len(rewards))):
        running = rewards[t] + gamma * running
        out[t] = running
    return out


@pytest.mark.parametrize("bootstrap", [0.0, 1.25])
def test_lambda_one_is_discounted_return_minus_value(bootstrap: float) -> None:
    # By hand for the 3-step case, bootstrap 0: G2 = 3, G1 = 2 + 0.9 * 3 = 4.7,
    # G0 = 1 + 0.9 * 4.7 = 5.23.
    if bootstrap == 0.0:
        np.testing.assert_allclose(_discounted_returns(REWARDS, 0.0, GAMMA), [5.23, 4.7, 3.0])
    adv, ret = gae(REWARDS, VALUES, bootstrap, GAMMA, 1.0)
    expected = _discounted_returns(REWARDS, bootstrap, GAMMA)
    np.testing.assert_allclose(adv, expected - VALUES, rtol=1e-6)
    np.testing.assert_allclose(ret, expected, rtol=1e-6)


def test_lambda_one_random() -> None:
    rng = np.random.default_rng(1)
    rewards = rng.standard_normal(50).astype(np.float32)
    values = rng.standard_normal(50).astype(np.float32)
    adv, _ = gae(rewards, values, -0.3, 0.97, 1.0)
    expected = _discounted_returns(rewards.astype(np.float64), -0.3, 0.97) - values
    np.testing.assert_allclose(adv, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("bootstrap", [0.0, 2.0])
def test_lambda_zero_is_td_error(bootstrap: float) -> None:
    adv, ret = gae(REWARDS, VALUES, bootstrap, GAMMA, 0.0)
    next_values = np.array([1.0, 1.5, bootstrap])
    td = REWARDS + GAMMA * next_values - VALUES
    np.testing.assert_allclose(adv, td, rtol=1e-6)
    # By hand with bootstrap 2.0: [1.4, 2.35, 3.3]
    if bootstrap == 2.0:
        np.testing.assert_allclose(adv, [1.4, 2.35, 3.3], rtol=1e-6)
    np.testing.assert_allclose(ret, td + VALUES, rtol=1e-6)


def test_single_step() -> None:
    adv, ret = gae(np.array([2.0], np.float32), np.array([0.5], np.float32), 1.0, 0.5, 0.9)
    np.testing.assert_allclose(adv, [2.0 + 0.5 * 1.0 - 0.5])
    np.testing.assert_allclose(ret, [2.5])


def test_gamma_zero_ignores_the_future() -> None:
    adv, _ = gae(REWARDS, VALUES, 100.0, 0.0, 0.95)
    np.testing.assert_allclose(adv, REWARDS - VALUES)


# -- traces cut the lambda trace step by step (Retrace's c) ----------------------------------


def test_traces_by_hand() -> None:
    # traces [t0, 0.5, 0.0], bootstrap 2.0, gamma * lam = 0.72; deltas [1.4, 2.35, 3.3]
    # A2 = 3.3
    # A1 = 2.35 + 0.72 * traces[2] * A2 = 2.35 + 0          = 2.35
    # A0 = 1.4  + 0.72 * traces[1] * A1 = 1.4 + 0.36 * 2.35 = 2.246
    # traces[0] scales nothing: step 0's own delta always counts in full.
    for first in (1.0, 0.3, 0.0):
        adv, ret = gae(REWARDS, VALUES, 2.0, GAMMA, LAM, np.array([first, 0.5, 0.0]))
        np.testing.assert_allclose(adv, [2.246, 2.35, 3.3], rtol=1e-6)
        np.testing.assert_allclose(ret, [2.746, 3.35, 4.8], rtol=1e-6)
        assert adv.dtype == np.float32 and ret.dtype == np.float32


def test_traces_of_one_are_plain_gae() -> None:
    rng = np.random.default_rng(2)
    rewards = rng.standard_normal(30).astype(np.float32)
    values = rng.standard_normal(30).astype(np.float32)
    plain = gae(rewards, values, 0.4, 0.99, 0.95)
    traced = gae(rewards, values, 0.4, 0.99, 0.95, np.ones(30, np.float32))
    np.testing.assert_allclose(traced[0], plain[0], rtol=1e-6)
    np.testing.assert_allclose(traced[1], plain[1], rtol=1e-6)


def test_traces_of_zero_are_td_errors() -> None:
    adv, _ = gae(REWARDS, VALUES, 2.0, GAMMA, LAM, np.zeros(3))
    np.testing.assert_allclose(adv, [1.4, 2.35, 3.3], rtol=1e-6)
