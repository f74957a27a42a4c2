"""A learner-shaped CPU load, to run beside the echo limit (``remote_inference.py --limit-load``).

The question it answers: with a training learner on the same cores, how much of the echo
limit could the best possible server still reach? The load is what the PPO learner process of
``rlserve serve`` does while it trains CartPole with the demo's settings, without the serving
process feeding it: gradient steps of rlserve's own ``ActorCritic`` (64x64 tanh) on minibatches
of 256 random CartPole-shaped rows, with rlserve's Adam, one torch thread, and
:func:`~rlserve.learners.common.yield_cpu` between steps, back to back until SIGTERM. Like the
learner under load it is always runnable; unlike it, it needs no experience, so its share of the
cores is what the scheduler gives an always-busy process beside the limit's clients.

Run as a script (``python bench/_learner_load.py``); it prints a line once its first step is done.
"""

from __future__ import annotations

import signal
import sys
import time

MINIBATCH = 256
"""Rows per gradient step: the CartPole demo's PPO ``minibatch_size``."""

READY = "learner load running"
"""The line the script prints after its first gradient step."""


def main() -> int:
    """Run gradient steps until SIGTERM; print how many, and the CPU they took."""
    import gymnasium as gym
    import torch

    from rlserve.learners.common import adam, yield_cpu
    from rlserve.learners.models import ActorCritic

    stop = False

    def _stop(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = ActorCritic(gym.spaces.Box(-5.0, 5.0, (4,)), gym.spaces.Discrete(2))
    optimizer = adam(list(model.parameters()), lr=1e-3)
    obs = torch.randn(MINIBATCH, 4)
    actions = torch.randint(0, 2, (MINIBATCH,))
    returns = torch.randn(MINIBATCH)
    steps = 0
    while not stop:
        logp, entropy = model.log_prob_entropy(obs, actions)
        loss = -(logp * returns).mean() - 0.01 * entropy.mean()
        loss = loss + ((model.value(obs) - returns) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        yield_cpu()
        steps += 1
        if steps == 1:
            print(READY, flush=True)
    print(f"{steps} gradient steps in {time.process_time():.1f} CPU-s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
