"""The shared gradient step: clipping as torch's, Adam's fused kernel, and its checkpoints."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch
from torch import nn

from rlserve.learners.common import (
    DeferredAdam,
    adam,
    clip_gradients,
    finite_step,
    load_optimizer,
)


def _net(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2))


def _loss(net: nn.Module, scale: float = 1.0) -> torch.Tensor:
    x = torch.linspace(-1, 1, 12).reshape(4, 3)
    return net(x * scale).pow(2).sum()


@pytest.mark.parametrize("max_norm", [0.01, 1e6])  # clipped, and left as it is
def test_clip_gradients_scales_as_clip_grad_norm(max_norm: float) -> None:
    ours, theirs = _net(), _net()
    _loss(ours, 10.0).backward()
    _loss(theirs, 10.0).backward()
    assert clip_gradients(list(ours.parameters()), max_norm)
    nn.utils.clip_grad_norm_(theirs.parameters(), max_norm)
    for a, b in zip(ours.parameters(), theirs.parameters(), strict=True):
        assert a.grad is not None and b.grad is not None
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-6, atol=0.0)


@pytest.mark.parametrize("kind", ["loss", "gradient"])
def test_a_nonfinite_step_is_not_taken_and_leaves_no_gradient(kind: str) -> None:
    net = _net()
    params = list(net.parameters())
    optimizer = adam(params, lr=0.1)
    before = [p.detach().clone() for p in params]
    if kind == "loss":
        bad = _loss(net) * math.inf
    else:  # a finite loss (0) whose gradient is NaN: d sqrt(|w - w|) at 0
        weight = net[0].weight
        bad = (weight - weight.detach()).abs().sqrt().sum() + _loss(net) * 0
        assert torch.isfinite(bad)
    assert not finite_step(optimizer, bad, params, 0.5)
    assert all(p.grad is None for p in params)
    assert all(torch.equal(a, b) for a, b in zip(before, params, strict=True))
    assert finite_step(optimizer, _loss(net), params, 0.5)
    assert any(not torch.equal(a, b) for a, b in zip(before, params, strict=True))


def test_adam_is_fused_on_cpu_and_steps_as_plain_adam() -> None:
    ours, theirs = _net(), _net()
    fused = adam(list(ours.parameters()), lr=1e-2, eps=1e-5)
    plain = torch.optim.Adam(theirs.parameters(), lr=1e-2, eps=1e-5)
    assert fused.param_groups[0]["fused"]
    for optimizer, net in ((fused, ours), (plain, theirs)):
        for _ in range(20):
            optimizer.zero_grad()
            _loss(net).backward()
            optimizer.step()
    for a, b in zip(ours.parameters(), theirs.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_load_optimizer_keeps_the_fused_kernel_of_an_older_checkpoints_state() -> None:
    old_net, net = _net(), _net()
    plain = torch.optim.Adam(old_net.parameters(), lr=1e-2)  # what an older rlserve saved
    _loss(old_net).backward()
    plain.step()
    optimizer = adam(list(net.parameters()), lr=1e-2)
    load_optimizer(optimizer, plain.state_dict())
    assert optimizer.param_groups[0]["fused"] is True
    assert optimizer.param_groups[0]["foreach"] is None
    net.load_state_dict(old_net.state_dict())
    steps = [optimizer.state[p]["step"] for p in net.parameters()]
    assert all(float(step) == 1.0 for step in steps)
    _loss(net).backward()
    optimizer.step()  # the restored moments in use: no error, a finite step
    assert all(torch.isfinite(p).all() for p in net.parameters())


def test_a_deferred_adam_is_built_at_first_use_and_its_state_round_trips() -> None:
    net, copy = _net(), _net()
    deferred = DeferredAdam(list(net.parameters()), lr=1e-2, eps=1e-5)
    assert deferred.state_dict() is None  # never built: nothing to save
    deferred.load_state_dict(None)
    assert deferred.state_dict() is None
    optimizer = deferred.optimizer
    assert deferred.optimizer is optimizer
    assert optimizer.param_groups[0]["lr"] == pytest.approx(1e-2)
    assert optimizer.param_groups[0]["eps"] == pytest.approx(1e-5)
    assert finite_step(optimizer, _loss(net), list(net.parameters()), 1.0)
    state = deferred.state_dict()
    assert state is not None and len(state["state"]) == 4
    restored = DeferredAdam(list(copy.parameters()), lr=1e-2, eps=1e-5)
    restored.load_state_dict(state)
    steps = [restored.optimizer.state[p]["step"] for p in copy.parameters()]
    assert all(float(step) == 1.0 for step in steps)
    restored.load_state_dict(None)  # a checkpoint saved before any step: as never built
    assert restored.state_dict() is None


# A learner process that has not trained yet: built, its weights published, a checkpoint saved
# and loaded. Building an optimiser would import torch._dynamo (about a second of CPU).
_LEARNER_THAT_NEVER_TRAINS = """
import sys, tempfile, pathlib
import gymnasium as gym
from rlserve.learners.registry import algorithm
for name, action_space in (("ppo", gym.spaces.Discrete(2)), ("dqn", gym.spaces.Discrete(2)),
                           ("sac", gym.spaces.Box(-1.0, 1.0, (2,)))):
    entry = algorithm(name)
    learner = entry.make_learner(gym.spaces.Box(-1.0, 1.0, (4,)), action_space, entry.settings())
    learner.weights()
    path = pathlib.Path(tempfile.mkdtemp()) / "checkpoint.pt"
    learner.save(path, {})
    learner.load(path)
print("torch._dynamo" in sys.modules)
"""


def test_a_learner_that_has_not_trained_builds_no_optimiser() -> None:
    result = subprocess.run(
        [sys.executable, "-c", _LEARNER_THAT_NEVER_TRAINS],
        capture_output=True,
        text=True,
        timeout=180,
        check=True,
    )
    assert result.stdout.strip() == "False", result.stderr
