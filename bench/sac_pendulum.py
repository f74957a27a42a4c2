"""SAC on Pendulum-v1: rlserve's SAC (Algorithm API, hosted env) against Stable-Baselines3's.

Run: ``PYTHONPATH=src .venv/bin/python bench/sac_pendulum.py`` (needs the ``bench`` extra;
``--seeds 0`` for one seed of each, ``--only rlserve`` or ``--only sb3`` for one side).

Target (issue 10): the mean return of the last 20 finished episodes >= -200 within 20,000 env
steps. Each side runs 20,000 steps with one torch thread in a sub-process of this script, one
at a time, alternating per seed; it prints the first step count (and seconds since training
began) at which the last-20 mean reached -200, and the last-20 mean and wall time at 20,000.

- **rlserve**: ``SACConfig().environment("Pendulum-v1")`` with ``hidden=(64, 64)``,
  ``lr=1e-3`` (rl-zoo3's Pendulum rate), its defaults otherwise (batch 256, gamma 0.99, tau
  0.005, one gradient step per env step paid every 64 steps, warm-up 100 steps, automatic
  entropy tuning).
- **SB3**: ``stable_baselines3.SAC("MlpPolicy", "Pendulum-v1", learning_rate=1e-3)``: rl-zoo3's
  Pendulum-v1 hyperparameters (its defaults otherwise: net 256x256, batch 256, train_freq 1,
  learning_starts 100); a callback reads the Monitor wrapper's episode returns.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections import deque

TARGET = -200.0
STEPS = 20_000
WINDOW = 20


def rlserve_child(seed: int) -> dict[str, float | None]:
    """Train rlserve's SAC here; return when it reached the target and where it ended."""
    started = time.monotonic()
    from rlserve import SACConfig

    algo = (
        SACConfig()
        .environment("Pendulum-v1")
        .training(hidden=(64, 64), lr=1e-3, torch_threads=1, min_env_steps_per_iteration=500)
        .debugging(seed=seed)
        .build()
    )
    returns: deque[float] = deque(maxlen=WINDOW)
    reached: tuple[int, float] | None = None
    while algo.env_steps_sampled < STEPS:
        algo.train()
        # The Algorithm keeps its last 100 returns; the bench reads the newest 20 of them.
        returns.extend(list(algo._returns)[-WINDOW:])
        if reached is None and len(returns) == WINDOW and statistics.mean(returns) >= TARGET:
            reached = (algo.env_steps_sampled, time.monotonic() - started)
    return _result(reached, returns, started)


def sb3_child(seed: int) -> dict[str, float | None]:
    """Train SB3's SAC here with rl-zoo3's Pendulum hyperparameters."""
    started = time.monotonic()
    import torch
    from stable_baselines3 import SAC
    from stable_baselines3.common.callbacks import BaseCallback

    torch.set_num_threads(1)
    returns: deque[float] = deque(maxlen=WINDOW)
    reached: list[tuple[int, float]] = []

    class Watch(BaseCallback):
        def _on_step(self) -> bool:
            for info in self.locals.get("infos", []):
                if "episode" in info:
                    returns.append(float(info["episode"]["r"]))
                    full = len(returns) == WINDOW
                    if not reached and full and statistics.mean(returns) >= TARGET:
                        reached.append((self.num_timesteps, time.monotonic() - started))
            return True

    model = SAC("MlpPolicy", "Pendulum-v1", learning_rate=1e-3, seed=seed, verbose=0)
    model.learn(STEPS, callback=Watch())
    return _result(reached[0] if reached else None, returns, started)


def _result(
    reached: tuple[int, float] | None, returns: deque[float], started: float
) -> dict[str, float | None]:
    return {
        "steps_to_target": None if reached is None else float(reached[0]),
        "seconds_to_target": None if reached is None else reached[1],
        "final_mean": statistics.mean(returns) if returns else None,
        "seconds": time.monotonic() - started,
    }


def main() -> None:
    """Run the comparison (or, with ``--child``, one side of it) and print the medians."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--only", choices=["rlserve", "sb3"])
    parser.add_argument("--child", choices=["rlserve", "sb3"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        run = rlserve_child if args.child == "rlserve" else sb3_child
        print(json.dumps(run(args.seeds[0])))
        return
    sides = [args.only] if args.only else ["rlserve", "sb3"]
    results: dict[str, list[dict[str, float | None]]] = {side: [] for side in sides}
    for seed in args.seeds:
        for side in sides:
            out = subprocess.run(
                [sys.executable, __file__, "--child", side, "--seeds", str(seed)],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            result = json.loads(out.strip().splitlines()[-1])
            results[side].append(result)
            print(f"{side} seed {seed}: {result}", flush=True)
    for side, runs in results.items():
        medians = {}
        for key in ("steps_to_target", "seconds_to_target", "final_mean", "seconds"):
            values = [r[key] for r in runs if r[key] is not None]
            medians[key] = statistics.median(values) if values else None
        reached = sum(r["steps_to_target"] is not None for r in runs)
        print(f"{side}: median over {len(runs)} seeds {medians}; reached {reached}/{len(runs)}")


if __name__ == "__main__":
    main()
