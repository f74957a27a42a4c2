"""Time to solve CartPole-v1: ``rlserve train`` against Stable-Baselines3's tuned PPO.

Run: ``PYTHONPATH=src .venv/bin/python bench/solve_cartpole.py`` (needs the ``bench`` extra:
``pip install -e '.[bench]'``; ``--seeds 0`` for one seed of each).

"Solved": the mean return of the last 100 finished episodes >= 475.

- **rlserve**: ``rlserve train --env CartPole-v1 --num-envs 8 --stop-return 475 --seed S
  --run-dir <tmp> --no-progress`` (its defaults otherwise); steps and seconds from its final
  ``solved: ... after N env steps in T s`` line.
- **SB3**: ``stable_baselines3.PPO`` with rl-zoo3's tuned CartPole-v1 hyperparameters (8 envs,
  ``MlpPolicy``, n_steps 32, batch_size 256, gae_lambda 0.8, gamma 0.98, n_epochs 20,
  ent_coef 0.0, learning rate and clip range linear from 1e-3 and 0.2 over 1e5 steps), one torch
  thread; a callback checks the last-100-episode mean of the Monitor wrappers
  (``ep_info_buffer``) after each rollout and stops once it reaches 475.

Both run as sub-processes of this script, one at a time, alternating per seed; the wall time is
measured around the sub-process (Python start-up and imports included). Figures: medians over
the seeds.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET = 475.0
SB3_STEPS = 100_000
SOLVED = re.compile(r"solved: .* after ([\d,]+) env steps in ([\d.]+) s")


def sb3_child(seed: int, budget: int) -> int:
    """Train SB3's PPO in this process; print the rlserve-style ``solved:`` line."""
    started = time.monotonic()
    import numpy as np
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    torch.set_num_threads(1)

    class StopAtReturn(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.solved_at: tuple[int, float, float] | None = None

        def _on_rollout_end(self) -> None:
            infos = self.model.ep_info_buffer
            if infos is not None and len(infos) == infos.maxlen:
                mean = float(np.mean([info["r"] for info in infos]))
                if mean >= TARGET and self.solved_at is None:
                    self.solved_at = (self.num_timesteps, mean, time.monotonic() - train_start)

        def _on_step(self) -> bool:
            return self.solved_at is None

    def linear(start: float):
        return lambda progress_remaining: progress_remaining * start

    env = make_vec_env("CartPole-v1", n_envs=8, seed=seed)
    model = PPO(
        "MlpPolicy",
        env,
        n_steps=32,
        batch_size=256,
        gae_lambda=0.8,
        gamma=0.98,
        n_epochs=20,
        ent_coef=0.0,
        learning_rate=linear(1e-3),
        clip_range=linear(0.2),
        seed=seed,
        device="cpu",
        verbose=0,
    )
    callback = StopAtReturn()
    train_start = time.monotonic()
    model.learn(total_timesteps=budget, callback=callback)
    if callback.solved_at is not None:
        steps, mean, _ = callback.solved_at
        elapsed = time.monotonic() - train_start
        print(
            f"solved: mean return {mean:.1f} over the last 100 episodes after {steps:,} env "
            f"steps in {elapsed:.1f} s ({time.monotonic() - started:.1f} s with imports)"
        )
        return 0
    infos = model.ep_info_buffer or []
    mean = float(np.mean([i["r"] for i in infos])) if infos else float("nan")
    print(f"stopped after {model.num_timesteps:,} env steps: mean return {mean:.1f}")
    return 1


def run(command: list[str]) -> tuple[int | None, float | None, float]:
    """Run a solver; its env steps and own seconds (None: not solved) and the wall seconds."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - start
    match = SOLVED.search(done.stdout)
    if match is None:
        tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
        print(f"  not solved (exit {done.returncode}): {' | '.join(tail)}", flush=True)
        return None, None, wall
    return int(match.group(1).replace(",", "")), float(match.group(2)), wall


def rlserve_command(seed: int, run_dir: str, extra: list[str]) -> list[str]:
    rlserve = Path(sys.executable).with_name("rlserve")
    head = [str(rlserve)] if rlserve.exists() else [sys.executable, "-m", "rlserve.cli"]
    return [
        *head,
        "train",
        "--env",
        "CartPole-v1",
        "--num-envs",
        "8",
        "--stop-return",
        str(TARGET),
        "--seed",
        str(seed),
        "--run-dir",
        run_dir,
        "--no-progress",
        *extra,
    ]


def fmt(values: list[float | int | None], spec: str) -> str:
    return " / ".join("-" if v is None else format(v, spec) for v in values)


def med(values: list[float | int | None]) -> float:
    return statistics.median([float("inf") if v is None else v for v in values])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--sb3-steps", type=int, default=SB3_STEPS, help="SB3's step budget")
    parser.add_argument("--only", choices=["rlserve", "sb3"], help="run one side only")
    parser.add_argument("--rlserve-args", default="", help="extra 'rlserve train' arguments")
    parser.add_argument("--sb3-child", type=int, metavar="SEED", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.sb3_child is not None:
        return sb3_child(args.sb3_child, args.sb3_steps)

    results: dict[str, list[tuple[int | None, float | None, float]]] = {"rlserve": [], "sb3": []}
    sides = [args.only] if args.only else ["rlserve", "sb3"]
    with tempfile.TemporaryDirectory(prefix="solve-cartpole-") as tmp:
        for seed in args.seeds:
            for side in sides:
                if side == "rlserve":
                    command = rlserve_command(seed, tmp, args.rlserve_args.split())
                else:
                    command = [
                        sys.executable,
                        __file__,
                        "--sb3-child",
                        str(seed),
                        "--sb3-steps",
                        str(args.sb3_steps),
                    ]
                steps, own, wall = run(command)
                results[side].append((steps, own, wall))
                print(
                    f"{side:8s} seed {seed}: {'-' if steps is None else f'{steps:,}'} env steps, "
                    f"{'-' if own is None else f'{own:.1f}'} s training, {wall:.1f} s wall",
                    flush=True,
                )

    print(f"\nmedians over seeds {' '.join(map(str, args.seeds))} (target {TARGET:g}):")
    print("| solver | env steps | training s | wall s (sub-process) | runs: steps | runs: wall s |")
    print("|---|---:|---:|---:|---|---|")
    for side in sides:
        rows = results[side]
        steps = [r[0] for r in rows]
        own = [r[1] for r in rows]
        wall = [r[2] if r[0] is not None else None for r in rows]
        print(
            f"| {side} | {med(steps):,.0f} | {med(own):.1f} | {med(wall):.1f} | "
            f"{fmt(steps, ',')} | {fmt(wall, '.1f')} |"
        )
    if len(sides) == 2:
        ours, theirs = results["rlserve"], results["sb3"]
        step_ratio = med([r[0] for r in ours]) / med([r[0] for r in theirs])
        wall_ratio = med([r[2] if r[0] else None for r in ours]) / med(
            [r[2] if r[0] else None for r in theirs]
        )
        ok = step_ratio < 1 and wall_ratio < 1
        print(
            f"rlserve / SB3 (medians): env steps {step_ratio:.2f}, wall {wall_ratio:.2f} "
            f"({'pass' if ok else 'FAIL'}: both must be < 1)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
