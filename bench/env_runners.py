"""Env-runner benchmark: the speed-up of ``num_env_runners`` on a slow env.

Run: ``PYTHONPATH=src .venv/bin/python bench/env_runners.py`` (``--quick`` for a short run).

The env is CartPole that sleeps 1 ms per step (``bench/subprocess_envs.py``'s ``SlowCartPole``),
``--envs`` copies per runner (2 by default), acted on by the default 64x64 PPO policy;
``--env cartpole`` uses plain CartPole-v1 instead (no sleep: what the runner protocol costs, and
what 2 cores allow).

1. Sampling: ``RunnerGroup.sample`` rounds of ``--batch`` steps (the weights broadcast, every
   runner's share sampled in parallel, the fragments sent back and decoded), with 1 and with 4
   runners, and the same steps sampled in this process (``EnvRunner``, ``num_env_runners=0``).
   Figure: env steps/s of each, and the 4-vs-1 ratio.
2. Training: ``Algorithm.train()`` end to end (sampling plus the PPO update in this process,
   ``num_epochs=1``) with 0, 1 and 4 runners. Figure: env steps/s.

Each figure is the median of ``--repeats`` runs. Sleeping is not CPU work, so the speed-up can
exceed the number of cores.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from rlserve import PPOConfig
from rlserve.algorithm.algorithm import Algorithm
from subprocess_envs import SLEEP_S, SlowCartPole

ENVS: dict[str, Any] = {"slow": SlowCartPole, "cartpole": "CartPole-v1"}


def config(runners: int, envs: int, batch: int, env: str = "slow") -> Any:
    return (
        PPOConfig()
        .environment(ENVS[env])
        .env_runners(num_env_runners=runners, num_envs_per_env_runner=envs)
        .training(
            train_batch_size=batch,
            minibatch_size=min(batch, 256),
            num_epochs=1,
            min_env_steps_per_iteration=batch,
        )
        .resources(device="cpu")
        .debugging(seed=0)
    )


def sample_rate(runners: int, envs: int, batch: int, rounds: int, env: str) -> float:
    """Env steps/s of sampling alone (no update), with ``runners`` processes or in process."""
    algo = config(runners, envs, batch, env).build()
    try:
        sampler, packages = algo.samplers[0], algo._packages
        sampler.sample(batch, packages)  # warm-up: first resets (runner processes: start)
        start = time.perf_counter()
        steps = 0
        for _ in range(rounds):
            steps += sampler.sample(batch, packages).env_steps
        return steps / (time.perf_counter() - start)
    finally:
        algo.stop()


def train_rate(runners: int, envs: int, batch: int, iterations: int, env: str) -> float:
    """Env steps/s of ``Algorithm.train()`` (sampling and updates)."""
    algo: Algorithm = config(runners, envs, batch, env).build()
    try:
        algo.train()  # warm-up
        start = time.perf_counter()
        steps = sum(algo.train()["env_runners"]["num_env_steps_sampled"] for _ in range(iterations))
        return steps / (time.perf_counter() - start)
    finally:
        algo.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--envs", type=int, default=2, help="env copies per runner")
    parser.add_argument("--batch", type=int, default=1024, help="steps per round")
    parser.add_argument("--quick", action="store_true", help="fewer rounds per run")
    parser.add_argument(
        "--env", choices=sorted(ENVS), default="slow", help="cartpole: the IPC cost, no sleep"
    )
    args = parser.parse_args()
    rounds = 2 if args.quick else 5

    def median(run: Any) -> float:
        return statistics.median(run() for _ in range(args.repeats))

    name = f"slow env ({SLEEP_S * 1e3:g} ms/step)" if args.env == "slow" else "CartPole-v1"
    print(
        f"{name}, {args.envs} copies per runner, "
        f"{args.batch} steps per round, median of {args.repeats}:"
    )
    sampled = {
        n: median(lambda n=n: sample_rate(n, args.envs, args.batch, rounds, args.env))
        for n in (0, 1, 4)
    }
    print("  sampling only:")
    print(f"    in process (0 runners): {sampled[0]:10.0f} env steps/s")
    print(f"    1 runner:               {sampled[1]:10.0f} env steps/s")
    print(f"    4 runners:              {sampled[4]:10.0f} env steps/s")
    print(f"    4 vs 1 runner:          {sampled[4] / sampled[1]:10.2f}x")
    trained = {
        n: median(lambda n=n: train_rate(n, args.envs, args.batch, rounds, args.env))
        for n in (0, 1, 4)
    }
    print("  Algorithm.train() (num_epochs=1):")
    print(f"    in process (0 runners): {trained[0]:10.0f} env steps/s")
    print(f"    1 runner:               {trained[1]:10.0f} env steps/s")
    print(f"    4 runners:              {trained[4]:10.0f} env steps/s")
    print(f"    4 vs 1 runner:          {trained[4] / trained[1]:10.2f}x")


if __name__ == "__main__":
    main()
