"""PPO's batch over a backlog past its step cap: every fragment, or only those that hold kept steps.

A PPO learner behind its clients, or one that replays the experience log after a restart,
holds far more fresh steps than one update keeps (``step_cap``, 2 x train_batch_size by
default). ``build_batch`` runs the forward passes and GAE only over the fragments that hold one
of the kept steps; ``batch_of_fragments`` over every fragment is what it did before. Both run
here, one after the other, on the same synthetic CartPole-shaped backlog (fragments of 16 steps,
versions within the lag, a few logged steps) with PPO's default settings, and the batches are
checked equal.

    python bench/ppo_backlog.py [--steps 86000 20000 2000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import resource
import statistics
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from gymnasium import spaces

from rlserve.learners.ppo import PPOLearner, PPOSettings
from rlserve.learners.ppo_batch import TrainingBatch, batch_of_fragments, build_batch
from rlserve.protocol.fragment import Fragment

FRAGMENT_STEPS = 16
VERSION = 20


def backlog(steps: int, seed: int = 0) -> list[Fragment]:
    """CartPole-shaped fragments of 16 steps, versions 18-20 in arrival order, 5% logged."""
    rng = np.random.default_rng(seed)
    count = steps // FRAGMENT_STEPS
    fragments = []
    for index in range(count):
        version = VERSION - 2 + (3 * index) // count
        fragments.append(
            Fragment(
                episode_id=f"e{index}",
                agent_id="agent0",
                policy_id="default",
                obs=rng.normal(0, 1, (FRAGMENT_STEPS + 1, 4)).astype(np.float32),
                actions=rng.integers(0, 2, FRAGMENT_STEPS).astype(np.int64),
                rewards=np.ones(FRAGMENT_STEPS, np.float32),
                behaviour_logp=np.full(FRAGMENT_STEPS, -0.69, np.float32),
                policy_chosen=rng.random(FRAGMENT_STEPS) > 0.05,
                weights_version=np.full(FRAGMENT_STEPS, version, np.int64),
                terminated=False,
                truncated=False,
            )
        )
    return fragments


def cpu_seconds(build: Callable[..., TrainingBatch], *args: Any) -> tuple[float, TrainingBatch]:
    """The process's CPU seconds for one call of ``build(*args)``, and its batch."""
    before = resource.getrusage(resource.RUSAGE_SELF)
    batch = build(*args)
    after = resource.getrusage(resource.RUSAGE_SELF)
    spent = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return spent, batch


def main() -> None:
    """Print, per backlog size, the CPU of both ways (medians) and their ratio."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[86_000, 20_000, 2_000])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    cfg = PPOSettings(device="cpu", max_policy_lag=4)
    model = PPOLearner(spaces.Box(-5, 5, (4,), np.float32), spaces.Discrete(2), cfg).model
    common = (model, cfg, VERSION, None, None, torch.device("cpu"))
    print(f"step cap {cfg.step_cap}; CPU seconds per batch, median of {args.repeats}")
    print(f"{'backlog steps':>14} {'every fragment':>15} {'kept ones':>10} {'ratio':>7}")
    for steps in args.steps:
        fragments = backlog(steps)
        every, kept = [], []
        for _ in range(args.repeats):  # alternating, so both see the same machine
            spent, full = cpu_seconds(batch_of_fragments, fragments, *common)
            every.append(spent)
            spent, trimmed = cpu_seconds(build_batch, fragments, *common)
            kept.append(spent)
        assert full.tensors is not None and trimmed.tensors is not None
        for name, column in full.tensors.items():
            np.testing.assert_allclose(trimmed.tensors[name].numpy(), column.numpy(), atol=1e-6)
        assert (trimmed.steps_dropped_cap, trimmed.steps_logged) == (
            full.steps_dropped_cap,
            full.steps_logged,
        )
        a, b = statistics.median(every), statistics.median(kept)
        print(f"{steps:>14,} {a:>14.3f}s {b:>9.3f}s {a / max(b, 1e-9):>6.1f}x")


if __name__ == "__main__":
    main()
