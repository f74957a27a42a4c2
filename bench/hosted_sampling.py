"""Hosted sampling: env steps/s of ``EnvRunner.sample`` against Gymnasium's own vector env.

Run: ``PYTHONPATH=src .venv/bin/python bench/hosted_sampling.py`` (``--quick`` for a short run).

What is measured, for 1 and 8 copies of CartPole-v1, in this process and in sub-processes
(``remote_worker_envs=True``, one copy per process):

- **rlserve**: ``algo.local.runner.sample(n)`` of ``PPOConfig().environment("CartPole-v1")
  .env_runners(...).build()``, i.e. the env steps, the forward pass of the default 64x64 PPO
  actor (``NumpyPolicy``), action sampling and all episode bookkeeping (the ``EpisodeTable``
  cutting fragments, episode summaries). The fragments are discarded; the learner never trains,
  so the policy stays the untrained one (short episodes: many resets, the worst case for
  bookkeeping).
- **ceiling**: ``gym.make_vec("CartPole-v1", num_envs=N, vectorization_mode="sync")`` (in
  process) or ``"async"`` (sub-processes) stepping random actions drawn in advance: no policy,
  no bookkeeping.

Each figure is the median of ``--repeats`` runs; rlserve and the ceiling alternate within a
repeat, so the ratio compares runs taken under the same load.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import gymnasium as gym
import numpy as np

from rlserve.algorithm import PPOConfig


def rlserve_rate(num_envs: int, remote: bool, steps: int) -> float:
    algo = (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_envs_per_env_runner=num_envs, remote_worker_envs=remote)
        .debugging(seed=0)
        .build()
    )
    try:
        runner = algo.local.runner
        fragments = algo.local.fragments  # the collector's sink; emptied as we go
        runner.sample(max(num_envs, 256))  # warm-up: reset, first forward passes
        fragments.clear()
        chunk = 2048
        done = 0
        start = time.perf_counter()
        while done < steps:
            done += runner.sample(chunk)
            fragments.clear()
        return done / (time.perf_counter() - start)
    finally:
        algo.stop()


def gym_rate(num_envs: int, remote: bool, steps: int) -> float:
    mode = "async" if remote else "sync"
    envs = gym.make_vec("CartPole-v1", num_envs=num_envs, vectorization_mode=mode)
    try:
        envs.reset(seed=0)
        rounds = max(1, steps // num_envs)
        rng = np.random.default_rng(0)
        batch = rng.integers(0, 2, (rounds, num_envs))
        for a in batch[: min(rounds, 32)]:  # warm-up
            envs.step(a)
        start = time.perf_counter()
        for a in batch:
            envs.step(a)
        return rounds * num_envs / (time.perf_counter() - start)
    finally:
        envs.close()


def measure(
    run_a: Callable[[], float], run_b: Callable[[], float], repeats: int
) -> tuple[list[float], list[float]]:
    a_runs, b_runs = [], []
    for _ in range(repeats):
        a_runs.append(run_a())
        b_runs.append(run_b())
    return a_runs, b_runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="fewer steps per run")
    args = parser.parse_args()
    in_steps, sub_steps = (10_000, 4_000) if args.quick else (60_000, 20_000)

    rows = []
    for remote in (False, True):
        for num_envs in (1, 8):
            steps = sub_steps if remote else in_steps
            ours, ceiling = measure(
                lambda n=num_envs, r=remote, s=steps: rlserve_rate(n, r, s),
                lambda n=num_envs, r=remote, s=steps: gym_rate(n, r, s),
                args.repeats,
            )
            ratios = [a / b for a, b in zip(ours, ceiling, strict=True)]
            where = "sub-processes" if remote else "in process"
            rows.append((where, num_envs, ours, ceiling, ratios))
            print(
                f"{where:13s} {num_envs} env(s): rlserve {statistics.median(ours):9,.0f} "
                f"ceiling {statistics.median(ceiling):9,.0f} steps/s, ratio of medians "
                f"{statistics.median(ours) / statistics.median(ceiling):.2f} "
                f"(runs rlserve {' / '.join(f'{v:,.0f}' for v in ours)}; ceiling "
                f"{' / '.join(f'{v:,.0f}' for v in ceiling)}; same-repeat ratios "
                f"{' / '.join(f'{v:.2f}' for v in ratios)})",
                flush=True,
            )

    print(f"\nmedians of {args.repeats} (env steps/s, inference and bookkeeping included):")
    print("| envs | where | rlserve | ceiling (gym.make_vec) | rlserve / ceiling |")
    print("|---|---|---:|---:|---:|")
    for where, num_envs, ours, ceiling, ratios in rows:
        mode = "async" if where == "sub-processes" else "sync"
        print(
            f"| {num_envs} | {where} | {statistics.median(ours):,.0f} | "
            f"{statistics.median(ceiling):,.0f} ({mode}) | {statistics.median(ratios):.2f} |"
        )
    target = next(r for r in rows if r[0] == "in process" and r[1] == 8)
    ratio = statistics.median(target[4])
    verdict = "pass" if ratio >= 0.70 else "FAIL"
    print(f"target: 8 envs in process >= 0.70 of the ceiling: {ratio:.2f} ({verdict})")


if __name__ == "__main__":
    main()
