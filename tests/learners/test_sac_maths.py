"""SAC's losses, temperature update and squashed Gaussian against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rlserve.learners.sac import (
    actor_loss,
    critic_loss,
    polyak_update,
    soft_q_target,
    temperature_loss,
    to_squashed,
)
from rlserve.learners.sac_models import EnsembleQ, squashed_log_prob
from rlserve.policy.gaussian import SQUASH_EPS, squashed_sample
from rlserve.policy.gaussian import squashed_log_prob as numpy_squashed_log_prob

HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


def test_soft_q_target_takes_the_smaller_critic_and_subtracts_the_entropy_term() -> None:
    rewards = torch.tensor([1.0, 2.0])
    discounts = torch.tensor([0.99, 0.0])  # the second step ended the episode
    next_q = torch.tensor([[3.0, 5.0], [4.0, 1.0]])
    next_logp = torch.tensor([-1.0, 0.5])
    target = soft_q_target(rewards, discounts, next_q, next_logp, 0.2)
    # min Q = [3, 1]; soft values [3 + 0.2, 1 - 0.1]; targets [1 + 0.99 * 3.2, 2 + 0].
    torch.testing.assert_close(target, torch.tensor([4.168, 2.0]))


def test_critic_loss_is_half_the_summed_mean_squared_errors() -> None:
    q = torch.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    loss = critic_loss(q, torch.tensor([1.0, 1.0]))
    # Errors [0, 1] and [2, 3]: means 0.5 and 6.5; half their sum is 3.5.
    assert loss.item() == pytest.approx(3.5)
    loss.backward()
    assert q.grad is not None
    torch.testing.assert_close(q.grad, torch.tensor([[0.0, 0.5], [1.0, 1.5]]))


def test_actor_loss_uses_the_smaller_critic() -> None:
    logp = torch.tensor([-1.0, 1.0])
    q = torch.tensor([[2.0, 0.0], [1.0, 3.0]])
    # alpha * logp - min Q = [-0.5 - 1, 0.5 - 0]; the mean is -0.5.
    assert actor_loss(logp, q, 0.5).item() == pytest.approx(-0.5)


def test_temperature_gradient_is_entropy_minus_target() -> None:
    log_alpha = torch.zeros((), requires_grad=True)
    logp = torch.tensor([-0.25, -0.75], requires_grad=True)  # entropy estimate 0.5
    loss = temperature_loss(log_alpha, logp, target_entropy=-1.0)
    assert loss.item() == 0.0  # log_alpha is 0
    loss.backward()
    # d/dlog_alpha = -(mean(logp) + target) = -(-0.5 - 1) = 1.5: the entropy 0.5 is above the
    # target -1, so descending the loss lowers the temperature.
    assert log_alpha.grad is not None and log_alpha.grad.item() == pytest.approx(1.5)
    assert logp.grad is None  # the log-probabilities are held fixed
    optimiser = torch.optim.SGD([log_alpha], lr=0.1)
    optimiser.step()
    assert log_alpha.item() == pytest.approx(-0.15)
    assert math.exp(log_alpha.item()) == pytest.approx(0.860708, abs=1e-6)


def test_temperature_rises_when_the_policy_is_less_random_than_the_target() -> None:
    log_alpha = torch.zeros((), requires_grad=True)
    temperature_loss(log_alpha, torch.tensor([2.0, 4.0]), target_entropy=-1.0).backward()
    assert log_alpha.grad is not None and log_alpha.grad.item() == pytest.approx(-2.0)


def test_polyak_update_moves_the_target_by_tau() -> None:
    target = [torch.zeros(3), torch.full((2,), 4.0)]
    source = [torch.full((3,), 10.0), torch.zeros(2)]
    polyak_update(target, source, 0.1)
    torch.testing.assert_close(target[0], torch.full((3,), 1.0))
    torch.testing.assert_close(target[1], torch.full((2,), 3.6))


def test_actions_are_rescaled_from_any_box_to_minus_one_one() -> None:
    low, high = np.array([-100.0, 0.0]), np.array([100.0, 10.0])
    actions = np.array([[50.0, 5.0], [100.0, 0.0], [-200.0, 12.0]], dtype=np.float32)
    expected = np.array([[0.5, 0.0], [1.0, -1.0], [-1.0, 1.0]], dtype=np.float32)
    np.testing.assert_allclose(to_squashed(actions, low, high), expected)


def test_squashed_log_prob_of_the_centre_by_hand() -> None:
    # mean 0, std 1, u = 0: a = 0 is the Box's centre; Box(-2, 2) scales by 2.
    params = np.zeros((1, 2))
    logp = numpy_squashed_log_prob(params, (-2.0,), (2.0,), np.zeros((1, 1), np.float32))
    expected = -HALF_LOG_2PI - math.log(1.0 + SQUASH_EPS) - math.log(2.0)
    assert logp[0] == pytest.approx(expected, abs=1e-6)


def test_squashed_sample_and_log_prob_by_hand() -> None:
    # mean 0.5, std 0.5 and a standard normal draw n: u = 0.5 + 0.5 n, a = tanh(u), and the
    # action in Box(0, 10) is 5 (a + 1).
    params = np.array([[0.5, math.log(0.5)]])
    rng = np.random.default_rng(3)
    n = np.random.default_rng(3).standard_normal((1, 1))[0, 0]
    actions, logp = squashed_sample(params, (0.0,), (10.0,), rng, explore=True)
    u = 0.5 + 0.5 * n
    assert actions[0, 0] == pytest.approx(5.0 * (math.tanh(u) + 1.0), rel=1e-6)
    expected = (
        -0.5 * n**2
        - math.log(0.5)
        - HALF_LOG_2PI
        - math.log(1.0 - math.tanh(u) ** 2 + SQUASH_EPS)
        - math.log(5.0)
    )
    assert logp[0] == pytest.approx(expected, abs=1e-5)
    again = numpy_squashed_log_prob(params, (0.0,), (10.0,), actions)
    assert again[0] == pytest.approx(expected, abs=1e-4)


def test_squashed_mode_is_tanh_of_the_mean_scaled() -> None:
    params = np.array([[1.0, -3.0, 0.0, 0.0]])  # means [1, -3]; log-stds 0
    rng = np.random.default_rng(0)
    actions, _ = squashed_sample(params, (-100.0, 0.0), (100.0, 1.0), rng, explore=False)
    expected = [100.0 * math.tanh(1.0), (math.tanh(-3.0) + 1.0) / 2.0]
    np.testing.assert_allclose(actions[0], expected, rtol=1e-6)


def test_log_std_is_clamped() -> None:
    wide = np.array([[0.0, 50.0]])
    clamped = np.array([[0.0, 2.0]])
    action = np.array([[0.3]], np.float32)
    box = ((-1.0,), (1.0,))
    np.testing.assert_allclose(
        numpy_squashed_log_prob(wide, *box, action), numpy_squashed_log_prob(clamped, *box, action)
    )


def test_torch_log_prob_matches_the_hand_formula() -> None:
    u = torch.tensor([[1.0, -0.5]])
    mean = torch.tensor([[0.5, 0.0]])
    log_std = torch.tensor([[math.log(0.5), 0.0]])
    logp = squashed_log_prob(u, mean, log_std, torch.tanh(u))
    expected = 0.0
    for ui, m, s in ((1.0, 0.5, 0.5), (-0.5, 0.0, 1.0)):
        z = (ui - m) / s
        expected += -0.5 * z * z - math.log(s) - HALF_LOG_2PI
        expected -= math.log(1.0 - math.tanh(ui) ** 2 + SQUASH_EPS)
    assert logp.item() == pytest.approx(expected, abs=1e-5)


def test_ensemble_critics_are_independent_networks() -> None:
    torch.manual_seed(0)
    critics = EnsembleQ(3, 1, (8, 8), "relu", n=2)
    obs, actions = torch.randn(5, 3), torch.randn(5, 1)
    q = critics(obs, actions)
    assert q.shape == (2, 5)
    x = torch.cat([obs, actions], dim=1)
    for i in range(2):
        h = x
        for layer, (w, b) in enumerate(zip(critics.weights, critics.biases, strict=True)):
            h = h @ w[i] + b[i]
            if layer < len(critics.weights) - 1:
                h = torch.relu(h)
        torch.testing.assert_close(q[i], h.squeeze(-1))
    q[0].sum().backward()
    assert critics.weights[0].grad is not None
    assert critics.weights[0].grad[1].abs().sum() == 0  # the first critic's loss: only its own
