"""Train each algorithm briefly on a CUDA learner and print what it reached: a GPU smoke check.

CI has no GPU, so this is run by hand on a machine with one::

    python bench/cuda_smoke.py                 # PPO and DQN on CartPole-v1, SAC on Pendulum-v1
    python bench/cuda_smoke.py --steps 20000   # longer runs

For each algorithm it builds a hosted Algorithm with ``.resources(device="cuda")``, trains for
``--steps`` env steps and prints the learner's device, the updates done, the mean return of the
last episodes and env steps per second. It exits non-zero when a learner is not on CUDA, an
update fails or a return is not finite.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from typing import Any

import torch

from rlserve import DQNConfig, PPOConfig, SACConfig


def _configs(seed: int) -> dict[str, Any]:
    return {
        "ppo": PPOConfig().environment("CartPole-v1").debugging(seed=seed),
        "dqn": DQNConfig().environment("CartPole-v1").debugging(seed=seed),
        "sac": SACConfig().environment("Pendulum-v1").debugging(seed=seed),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8000, help="env steps per algorithm")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--algos", default="ppo,dqn,sac", help="comma-separated")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check", file=sys.stderr)
        return 2
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}")
    failed = []
    configs = _configs(args.seed)
    for name in args.algos.split(","):
        config = configs[name].resources(device="cuda")
        started = time.perf_counter()
        with config.build() as algo:
            learner = algo.learners["default"]
            result: dict[str, Any] = {}
            while algo.env_steps_sampled < args.steps:
                result = algo.train()
            elapsed = time.perf_counter() - started
            device = str(getattr(learner, "device", "?"))
            updates = int(learner.counters().get("updates", 0))
        mean = float(result["env_runners"]["episode_return_mean"])
        print(
            f"{name}: device {device}, {algo.env_steps_sampled} env steps, {updates} updates, "
            f"return mean {mean:.1f}, {algo.env_steps_sampled / elapsed:.0f} env steps/s"
        )
        if not device.startswith("cuda") or updates == 0 or not math.isfinite(mean):
            failed.append(name)
    if failed:
        print(f"FAILED: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
