"""The actor's categorical log-probabilities and entropies, against torch's distribution."""

from __future__ import annotations

import torch

from rlserve.learners.models import categorical_log_prob_entropy


def test_categorical_log_prob_entropy_is_torchs_categorical() -> None:
    torch.manual_seed(0)
    logits = torch.randn(64, 5) * 3
    logits[0] = torch.tensor([0.0, -1e30, 2.0, -1e30, 1.0])  # probabilities of exactly 0
    logits.requires_grad_(True)
    actions = torch.randint(0, 5, (64,))
    actions[0] = 2
    logp, entropy = categorical_log_prob_entropy(logits, actions)
    dist = torch.distributions.Categorical(logits=logits)
    torch.testing.assert_close(logp, dist.log_prob(actions))
    torch.testing.assert_close(entropy, dist.entropy())
    assert torch.isfinite(entropy).all()
    ours = torch.autograd.grad((logp + entropy).sum(), logits)[0]
    theirs = torch.autograd.grad((dist.log_prob(actions) + dist.entropy()).sum(), logits)[0]
    torch.testing.assert_close(ours, theirs)
    float_actions = actions.to(torch.float32)  # choice indices may arrive as floats
    torch.testing.assert_close(categorical_log_prob_entropy(logits, float_actions)[0], logp)
