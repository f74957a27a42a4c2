"""PPO on CartPole-v1 when every batch was collected by older weights, without timing noise.

Run: ``PYTHONPATH=src .venv/bin/python bench/ppo_lag.py --lag 1 --seeds 0 1 2 3 4``
(``--set clip_coef=0.2 --set truncated_traces=true`` overrides PPO settings; values are JSON).

The remote demo's learner trains on steps that the previous weights took (the server keeps
acting while the learner trains), at a lag that depends on the machine's load. This benchmark
fixes the lag instead: every batch of ``train_batch_size`` steps is collected by the weights
published ``--lag`` updates earlier, one CartPole-v1 stepped by a :class:`NumpyPolicy` (as the
server serves), so two PPO variants can be compared on the same data regime and the figure is
the number of env steps until the mean return of the last 100 episodes reaches 475 (the demo's
target). Each seed runs in its own process; the figures are medians over the seeds.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import subprocess
import sys
import time
from typing import Any

import numpy as np

TARGET = 475.0
FRAGMENT = 200


def run_one(seed: int, lag: int, overrides: dict[str, Any], budget: int) -> dict[str, Any]:
    """Train one seed in this process; return its figures."""
    import gymnasium as gym

    from rlserve.learners.ppo import PPOLearner
    from rlserve.learners.ppo_config import PPOSettings
    from rlserve.policy import NumpyPolicy
    from rlserve.protocol.fragment import Fragment

    settings = {"device": "cpu", "seed": seed, "max_policy_lag": max(1, lag), **overrides}
    config = PPOSettings(**settings)
    env = gym.make("CartPole-v1")
    learner = PPOLearner(env.observation_space, env.action_space, config)
    published = collections.deque([learner.weights()], maxlen=lag + 1)
    returns: collections.deque[float] = collections.deque(maxlen=100)
    obs, _ = env.reset(seed=seed)
    episode_return, total, policy_seed = 0.0, 0, seed * 1000
    columns: dict[str, list[Any]] = {"obs": [obs], "act": [], "rew": [], "logp": [], "ver": []}
    first_kl: list[float] = []
    started = time.perf_counter()
    while total < budget:
        package = published[0]
        policy = NumpyPolicy(package.spec, package.arrays, package.version, seed=policy_seed)
        policy_seed += 1
        fragments = []
        for _ in range(config.train_batch_size):
            out = policy.compute_actions(np.asarray(obs, np.float32)[None])
            action = int(out.actions[0])
            obs, reward, terminated, truncated, _ = env.step(action)
            episode_return += float(reward)
            total += 1
            for name, value in (
                ("act", action),
                ("rew", reward),
                ("logp", float(out.logp[0])),
                ("ver", package.version),
                ("obs", obs),
            ):
                columns[name].append(value)
            if terminated or truncated or len(columns["act"]) >= FRAGMENT:
                steps = len(columns["act"])
                fragments.append(
                    Fragment(
                        "e",
                        "agent0",
                        "default",
                        np.asarray(columns["obs"], np.float32),
                        np.asarray(columns["act"], np.int64),
                        np.asarray(columns["rew"], np.float32),
                        np.asarray(columns["logp"], np.float32),
                        np.ones(steps, bool),
                        np.asarray(columns["ver"], np.int64),
                        bool(terminated),
                        bool(truncated and not terminated),
                    )
                )
                if terminated or truncated:
                    returns.append(episode_return)
                    episode_return = 0.0
                    obs, _ = env.reset()
                columns = {"obs": [obs], "act": [], "rew": [], "logp": [], "ver": []}
        learner.ingest(fragments)
        metrics = learner.update()
        first_kl.append(metrics.get("learner/behaviour_kl", float("nan")))
        published.append(learner.weights())
        if len(returns) == returns.maxlen and np.mean(returns) >= TARGET:
            break
    solved = len(returns) == returns.maxlen and float(np.mean(returns)) >= TARGET
    return {
        "seed": seed,
        "solved": solved,
        "env_steps": total,
        "updates": learner.counters()["updates"],
        "seconds": round(time.perf_counter() - started, 1),
        "behaviour_kl_median": float(np.nanmedian(first_kl)) if first_kl else float("nan"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lag", type=int, default=1, help="Versions behind (0: on-policy).")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--budget", type=int, default=300_000, help="Env steps per seed at most.")
    parser.add_argument("--set", action="append", default=[], help="PPO setting NAME=JSON.")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    overrides = {k: json.loads(v) for k, v in (item.split("=", 1) for item in args.set)}
    if args.child is not None:
        print(json.dumps(run_one(args.child, args.lag, overrides, args.budget)))
        return
    results = []
    for seed in args.seeds:
        command = [sys.argv[0], "--child", str(seed), "--lag", str(args.lag)]
        command += ["--budget", str(args.budget)] + [f"--set={item}" for item in args.set]
        output = subprocess.run(
            [sys.executable, *command], capture_output=True, text=True, check=True
        ).stdout
        result = json.loads(output.strip().splitlines()[-1])
        results.append(result)
        print(json.dumps(result), flush=True)
    steps = [r["env_steps"] for r in results]
    solved = sum(r["solved"] for r in results)
    median = statistics.median(steps)
    print(
        f"lag {args.lag} {overrides or 'defaults'}: median env steps {median:,.0f} "
        f"(runs {', '.join(f'{s:,}' for s in steps)}), solved {solved}/{len(results)}"
    )


if __name__ == "__main__":
    main()
