"""Env-source benchmark: the speed-up of sub-process envs, and the cost of the in-process source.

Run: ``PYTHONPATH=src .venv/bin/python bench/subprocess_envs.py`` (``--quick`` for a short run).

1. Parallel speed-up: 8 copies of a slow env (CartPole that sleeps 1 ms per step), random
   actions through ``step_all``, in this process (``InProcessVectorSource``) vs one copy per
   sub-process (``ProcessVectorSource``). Figure: env steps/s of each, and their ratio. Sleeping
   is not CPU work, so the speed-up can exceed the number of cores.
2. In-process overhead: 8 plain CartPole-v1 copies, random actions, ``step_all`` vs Gymnasium's
   own ``SyncVectorEnv.step`` (same-step autoreset). Figure: env steps/s of each.

Each figure is the median of ``--repeats`` runs.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from rlserve.env import InProcessVectorSource, ProcessVectorSource, VectorEnvSource

NUM_ENVS = 8
SLEEP_S = 0.001


class SlowCartPole(gym.Wrapper[Any, Any, Any, Any]):
    """CartPole-v1 that sleeps 1 ms in every step, standing in for a slow simulator."""

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        super().__init__(gym.make("CartPole-v1"))

    def step(self, action: Any) -> Any:
        """Sleep, then step CartPole."""
        time.sleep(SLEEP_S)
        return self.env.step(action)


def actions(count: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.integers(0, 2, NUM_ENVS) for _ in range(count)]


def source_rate(make: Callable[[], VectorEnvSource], steps: int) -> float:
    source = make()
    try:
        source.reset_all(seed=0)
        batch = actions(steps)
        start = time.perf_counter()
        for a in batch:
            source.step_all(a)
        return NUM_ENVS * steps / (time.perf_counter() - start)
    finally:
        source.close()


def sync_rate(steps: int) -> float:
    envs = SyncVectorEnv(
        [lambda: gym.make("CartPole-v1")] * NUM_ENVS, autoreset_mode=AutoresetMode.SAME_STEP
    )
    try:
        envs.reset(seed=0)
        batch = actions(steps)
        start = time.perf_counter()
        for a in batch:
            envs.step(a)
        return NUM_ENVS * steps / (time.perf_counter() - start)
    finally:
        envs.close()


def median(run: Callable[[], float], repeats: int) -> float:
    return statistics.median(run() for _ in range(repeats))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="fewer steps per run")
    args = parser.parse_args()
    slow_steps, fast_steps = (100, 5_000) if args.quick else (400, 25_000)

    local = median(
        lambda: source_rate(
            lambda: InProcessVectorSource(SlowCartPole, num_envs=NUM_ENVS), slow_steps
        ),
        args.repeats,
    )
    remote = median(
        lambda: source_rate(
            lambda: ProcessVectorSource(SlowCartPole, num_envs=NUM_ENVS), slow_steps
        ),
        args.repeats,
    )
    print(f"slow env ({SLEEP_S * 1e3:g} ms/step), {NUM_ENVS} copies, median of {args.repeats}:")
    print(f"  in process:    {local:10.0f} env steps/s")
    print(f"  sub-processes: {remote:10.0f} env steps/s")
    print(f"  speed-up:      {remote / local:10.2f}x")

    sync = median(lambda: sync_rate(fast_steps), args.repeats)
    ours = median(
        lambda: source_rate(
            lambda: InProcessVectorSource("CartPole-v1", num_envs=NUM_ENVS), fast_steps
        ),
        args.repeats,
    )
    print(f"CartPole-v1, {NUM_ENVS} copies, random actions, median of {args.repeats}:")
    print(f"  SyncVectorEnv.step:                {sync:10.0f} env steps/s")
    print(f"  InProcessVectorSource.step_all:    {ours:10.0f} env steps/s")
    print(f"  ratio:                             {ours / sync:10.2f}")


if __name__ == "__main__":
    main()
