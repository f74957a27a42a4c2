"""DQN on CartPole-v1, hosted with 4 envs: the proxy of issue 10's remote DQN target.

Run: ``PYTHONPATH=src .venv/bin/python bench/dqn_cartpole.py`` (``--seeds 0`` for one seed,
``--set lr=5e-4 --set hidden=128,128`` to override DQN settings, ``--full`` to go on to the
step budget after reaching the target).

Target (issue 10): through external remote clients, the mean return of the last 100 episodes
>= 475 within 60,000 env steps, 3 seeds of 3. The demo has 4 clients, each its own CartPole;
here ``DQNConfig().environment("CartPole-v1")`` steps 4 copies (``num_envs_per_env_runner=4``)
with the demo's DQN settings (``rlserve.cli.demo.TASKS["cartpole"]``) over the hosted defaults
(:data:`rlserve.algorithm.training_settings.HOSTED_DQN_DEFAULTS` over
:class:`~rlserve.learners.dqn_config.DQNSettings`), one torch thread, on the CPU. The
mean is over the last 100 finished training episodes, with exploration, as the clients see it;
it is read after every ``train()`` iteration of 256 env steps (so the step reported is at most
256 past the episode that crossed 475).

Each seed runs in a sub-process of this script, one at a time; its wall time is measured from
before the Algorithm is built (imports excluded) to the target (or to the budget).
"""

from __future__ import annotations

import argparse
import ast
import json
import statistics
import subprocess
import sys
import time
from typing import Any

TARGET = 475.0
STEPS = 60_000
ENVS = 4
REPORT_EVERY = 256
CURVE_EVERY = 5000


def parse_value(text: str) -> Any:
    """A ``--set`` value: a Python literal, ``128,128`` (a tuple of ints), or the text itself.

    Literals: ``1e-3``, ``True``, ``(128, 128)``.
    """
    if "," in text and not text.startswith(("(", "[")):
        return tuple(int(v) for v in text.split(",") if v)
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def child(seed: int, overrides: dict[str, Any], steps: int, full: bool) -> dict[str, Any]:
    """Train one seed here; return when the last-100 mean reached the target and where it ended."""
    from rlserve import DQNConfig
    from rlserve.cli.demo import TASKS

    tuned = TASKS["cartpole"].settings["dqn"]
    started = time.monotonic()
    config = (
        DQNConfig()
        .environment("CartPole-v1")
        .env_runners(num_envs_per_env_runner=ENVS)
        .training(
            **{"torch_threads": 1, "device": "cpu", **tuned, **overrides},
            min_env_steps_per_iteration=REPORT_EVERY,
        )
        .debugging(seed=seed)
    )
    reached: tuple[int, float] | None = None
    best, mean = float("-inf"), float("nan")
    result: dict[str, Any] = {}
    curve: list[float] = []
    block: list[float] = []
    with config.build() as algo:
        while algo.env_steps_sampled < steps:
            before = algo.episodes_total
            result = algo.train()
            mean = result["env_runners"]["episode_return_mean"]
            # The Algorithm keeps its last 100 returns; the curve reads the newest ones.
            new = algo.episodes_total - before
            block += list(algo._returns)[-new:] if new else []
            while algo.env_steps_sampled >= CURVE_EVERY * (len(curve) + 1):
                curve.append(round(statistics.mean(block)) if block else 0)
                block = []
            if algo.episodes_total < 100:
                continue
            best = max(best, mean)
            if reached is None and mean >= TARGET:
                reached = (algo.env_steps_sampled, time.monotonic() - started)
                if not full:
                    break
        learner = result.get("learners", {}).get("default", {})
        return {
            "seed": seed,
            "reached_step": None if reached is None else reached[0],
            "reached_seconds": None if reached is None else round(reached[1], 1),
            "best_mean": round(best, 1),
            "last_mean": round(mean, 1),
            "steps": algo.env_steps_sampled,
            "seconds": round(time.monotonic() - started, 1),
            "gradient_steps": int(learner.get("gradient_steps", 0)),
            "epsilon": learner.get("epsilon"),
            "curve": curve,
        }


def main() -> None:
    """Run the seeds one at a time (each in a sub-process) and print their figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a DQN setting (DQNSettings field), e.g. --set lr=5e-4",
    )
    parser.add_argument("--steps", type=int, default=STEPS, help="env step budget per seed")
    parser.add_argument(
        "--full", action="store_true", help="go on to the budget after reaching the target"
    )
    parser.add_argument(
        "--curve",
        action="store_true",
        help=f"print the mean return of the episodes ending in each {CURVE_EVERY:,} steps",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    overrides: dict[str, Any] = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--set takes KEY=VALUE, got {item!r}")
        overrides[key.strip()] = parse_value(value.strip())
    if args.child:
        print(json.dumps(child(args.seeds[0], overrides, args.steps, args.full)))
        return
    print(
        f"DQN CartPole-v1, {ENVS} hosted envs, budget {args.steps:,} steps, overrides {overrides}"
    )
    results = []
    for seed in args.seeds:
        command = [sys.executable, __file__, "--child", "--seeds", str(seed)]
        command += [f"--set={item}" for item in args.set]
        command += ["--steps", str(args.steps)] + (["--full"] if args.full else [])
        out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        result = json.loads(out.strip().splitlines()[-1])
        results.append(result)
        where = (
            f"reached at {result['reached_step']:,} steps ({result['reached_seconds']} s)"
            if result["reached_step"] is not None
            else "not reached"
        )
        print(
            f"seed {seed}: {where}; best last-100 mean {result['best_mean']}, "
            f"last {result['last_mean']} at {result['steps']:,} steps; "
            f"{result['seconds']} s, {result['gradient_steps']:,} gradient steps",
            flush=True,
        )
        if args.curve:
            print(f"  mean return per {CURVE_EVERY:,} steps: {result['curve']}", flush=True)
    hits = [r["reached_step"] for r in results if r["reached_step"] is not None]
    median = statistics.median(hits) if len(hits) == len(results) else None
    print(
        f"reached {len(hits)}/{len(results)}; median steps "
        f"{'n/a' if median is None else f'{median:,.0f}'}; "
        f"worst {'n/a' if median is None else f'{max(hits):,}'}; "
        f"median wall {statistics.median(r['seconds'] for r in results):.1f} s"
    )


if __name__ == "__main__":
    main()
