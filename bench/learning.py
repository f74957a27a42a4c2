"""Issue 10's learning targets, through external clients, side by side with Stable-Baselines3.

Run: ``PYTHONPATH=src .venv/bin/python bench/learning.py`` (needs the ``bench`` extra:
``pip install -e '.[bench]'``). ``--seeds 0`` for one seed, ``--tasks dqn sac`` for some of the
tasks, ``--only rlserve`` to leave SB3 out. Every run is a sub-process of this script, one at a
time, the two sides alternating per seed; figures are medians over the seeds.

Tasks (rlserve always through its real server and 4 client processes, each with its own env,
as ``rlserve demo`` runs them; every rlserve setting is the server's default unless named):

- ``dqn``: CartPole-v1, ``rlserve demo cartpole --algo dqn``. Target: the mean return of the
  last 100 episodes >= 475 within 60,000 env steps. SB3: ``DQN`` with rl-zoo3's CartPole-v1
  hyperparameters (lr 2.3e-3, batch 64, buffer 100k, learning_starts 1000, gamma 0.99, target
  update every 10 steps, train_freq 256 with 128 gradient steps, exploration over 16% of the
  run to 0.04, net 256x256), 60,000 steps, stopped at the target.
- ``logged``: one client that only calls ``log_action``, with a scripted CartPole balancer
  that takes a random action 30% of the time (20,000 steps into ``rlserve serve --algo dqn
  --dqn-n-step-through-logged``: n-step sums over the controller's actions);
  then 20 greedy evaluation episodes (``training_enabled=False``). Target: clearly better than
  the scripted controller. SB3 has no way to train on another controller's actions without
  custom code, so this row has no SB3 side.
- ``sac``: Pendulum-v1, ``rlserve demo pendulum`` (SAC with 64x64 networks and lr 1e-3, run
  to 20,000 steps). Target: the mean return of the last 20 episodes >= -200 within 20,000
  steps, in less wall time than SB3's ``SAC`` with rl-zoo3's Pendulum-v1 hyperparameters
  (``bench/sac_pendulum.py``'s SB3 side: lr 1e-3, net 256x256), also 20,000 steps.
- ``ppo``: CartPole-v1, ``rlserve demo cartpole`` (PPO). Target: no worse than 60,000-70,000
  steps to a last-100 mean of 475. SB3: rl-zoo3's tuned PPO (``bench/solve_cartpole.py``'s SB3
  side: 8 envs in process, which is easier than 4 external clients).

Wall times are measured inside each run, from the start of training (rlserve: the server start,
client processes included) to the target or the budget; torch uses one thread on both sides.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
DQN_STEPS = 60_000
SAC_STEPS = 20_000
LOGGED_STEPS = 20_000
EVAL_EPISODES = 20
TASKS = ("dqn", "logged", "sac", "ppo")
SB3_SIDES = {"dqn", "sac", "ppo"}


# -- rlserve runs --------------------------------------------------------------------------


def rlserve_demo(task: str, seed: int, run_dir: str) -> dict[str, Any]:
    """One ``rlserve demo`` run (in this process; it starts the server and its clients)."""
    from rlserve.cli.demo import DemoConfig, demo_result

    name, algo, budget, stop = {
        "dqn": ("cartpole", "dqn", DQN_STEPS, True),
        "sac": ("pendulum", "sac", SAC_STEPS, False),
        "ppo": ("cartpole", "ppo", 300_000, True),
    }[task]
    config = DemoConfig(
        seed=seed,
        algo=algo,
        max_env_steps=budget,
        run_dir=run_dir,
        progress=False,
        stop_when_solved=stop,
        time_limit=1800.0,
    )
    result = demo_result(config, name)
    return {
        "steps_to_target": result.solved_at_steps,
        "seconds_to_target": result.solved_at_seconds,
        "final_mean": result.final_return,
        "steps": result.env_steps,
        "seconds": result.seconds,
        "failure": result.failure,
        # The last-window mean every 5,000 env steps: where a run was slow or slipped.
        "curve": [round(mean) for _, mean in result.curve],
    }


def scripted(obs: Any) -> int:
    """A hand-written CartPole balancer: push the way the pole is falling."""
    return int(obs[3] > 0)


def rlserve_logged(seed: int, run_dir: str) -> dict[str, Any]:
    """DQN from ``log_action`` data alone, then greedy evaluation episodes."""
    import gymnasium as gym
    import httpx
    import numpy as np

    from rlserve import PolicyClient

    started = time.monotonic()
    name = f"logged-seed{seed}"
    rlserve = Path(sys.executable).with_name("rlserve")
    head = [str(rlserve)] if rlserve.exists() else [sys.executable, "-m", "rlserve.cli"]
    server = subprocess.Popen(
        [
            *head,
            "serve",
            "--algo",
            "dqn",
            "--spaces-from",
            "CartPole-v1",
            "--port",
            "0",
            "--http-port",
            "0",
            "--run-dir",
            run_dir,
            "--name",
            name,
            "--seed",
            str(seed),
            "--dqn-n-step-through-logged",
            "--no-progress",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        endpoints_file = Path(run_dir) / name / "endpoints.json"
        while not endpoints_file.exists():
            if server.poll() is not None:
                raise RuntimeError(f"rlserve serve exited with code {server.returncode}")
            time.sleep(0.05)
        endpoints = json.loads(endpoints_file.read_text())
        address = f"127.0.0.1:{endpoints['binary']['port']}"
        metrics_url = f"{endpoints['http']['url']}/v1/metrics"
        rng = np.random.default_rng(seed)
        env = gym.make("CartPole-v1")
        behaviour: list[float] = []
        steps = 0
        with PolicyClient(address, client_name="logger", timeout=60) as client:
            episode = 0
            while steps < LOGGED_STEPS:
                obs, _ = env.reset(seed=seed * 100_000 + episode)
                eid = client.start_episode()
                total, done = 0.0, False
                while not done:
                    noisy = rng.random() < 0.3
                    action = int(rng.integers(2)) if noisy else scripted(obs)
                    client.log_action(eid, obs, action)
                    obs, reward, terminated, truncated, _ = env.step(action)
                    client.log_returns(eid, float(reward))
                    total += float(reward)
                    steps += 1
                    done = terminated or truncated
                client.end_episode(eid, obs, truncated=not terminated)
                behaviour.append(total)
                episode += 1
            # The learner is within the server's lag bound: let it pay what it still owes.
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                metrics = httpx.get(metrics_url, timeout=10).json()
                if metrics.get("samples/learner_lag_steps", 0) < 64:
                    break
                time.sleep(0.2)
            trained_seconds = time.monotonic() - started
            learned: list[float] = []
            for k in range(EVAL_EPISODES):
                obs, _ = env.reset(seed=10**6 + k)
                eid = client.start_episode(training_enabled=False)
                total, done = 0.0, False
                while not done:
                    action = client.get_action(eid, obs)
                    obs, reward, terminated, truncated, _ = env.step(action)
                    total += float(reward)
                    done = terminated or truncated
                client.end_episode(eid, obs, truncated=not terminated)
                learned.append(total)
        return {
            "behaviour_mean": float(np.mean(behaviour)),
            "greedy_mean": float(np.mean(learned)),
            "seconds": trained_seconds,
            "steps": steps,
        }
    finally:
        server.terminate()
        server.wait(30)


# -- SB3 runs ------------------------------------------------------------------------------


def sb3_dqn(seed: int) -> dict[str, Any]:
    """SB3's DQN with rl-zoo3's CartPole-v1 hyperparameters, stopped at the target."""
    import numpy as np
    import torch
    from stable_baselines3 import DQN
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    torch.set_num_threads(1)
    started = time.monotonic()
    returns: deque[float] = deque(maxlen=100)
    reached: list[tuple[int, float]] = []

    class Watch(BaseCallback):
        def _on_step(self) -> bool:
            for info in self.locals.get("infos", []):
                if "episode" in info:
                    returns.append(float(info["episode"]["r"]))
                    if len(returns) == 100 and not reached and np.mean(returns) >= 475:
                        reached.append((self.num_timesteps, time.monotonic() - started))
            return not reached

    model = DQN(
        "MlpPolicy",
        make_vec_env("CartPole-v1", n_envs=1, seed=seed),
        learning_rate=2.3e-3,
        batch_size=64,
        buffer_size=100_000,
        learning_starts=1000,
        gamma=0.99,
        target_update_interval=10,
        train_freq=256,
        gradient_steps=128,
        exploration_fraction=0.16,
        exploration_final_eps=0.04,
        policy_kwargs={"net_arch": [256, 256]},
        seed=seed,
        device="cpu",
        verbose=0,
    )
    model.learn(DQN_STEPS, callback=Watch())
    return {
        "steps_to_target": reached[0][0] if reached else None,
        "seconds_to_target": reached[0][1] if reached else None,
        "final_mean": float(np.mean(returns)) if returns else None,
        "steps": int(model.num_timesteps),
        "seconds": time.monotonic() - started,
    }


def sb3_other(task: str, seed: int) -> dict[str, Any]:
    """SB3's side of ``sac`` and ``ppo``, from the benches that already hold it."""
    if task == "sac":
        command = [sys.executable, str(BENCH / "sac_pendulum.py"), "--child", "sb3"]
        out = subprocess.run(
            [*command, "--seeds", str(seed)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        return result
    sys.path.insert(0, str(BENCH))
    from solve_cartpole import run

    steps, seconds, wall = run(
        [sys.executable, str(BENCH / "solve_cartpole.py"), "--sb3-child", str(seed)]
    )
    return {"steps_to_target": steps, "seconds_to_target": seconds, "seconds": wall}


# -- the comparison ------------------------------------------------------------------------


def child(task: str, side: str, seed: int) -> dict[str, Any]:
    """One run, in this process."""
    with tempfile.TemporaryDirectory(prefix=f"learning-{task}-") as tmp:
        if side == "rlserve":
            if task == "logged":
                return rlserve_logged(seed, tmp)
            return rlserve_demo(task, seed, tmp)
    if task == "dqn":
        return sb3_dqn(seed)
    return sb3_other(task, seed)


def median(values: list[Any]) -> float | None:
    """The median of the values that are not None (None when there are none)."""
    present = [float(v) for v in values if v is not None]
    return statistics.median(present) if present else None


def show(value: float | None, spec: str) -> str:
    """A figure, or ``-`` for none."""
    return "-" if value is None else format(value, spec)


def report(task: str, runs: dict[str, list[dict[str, Any]]]) -> None:
    """Print one task's medians as a markdown table."""
    print(f"\n### {task}")
    if task == "logged":
        rows = runs["rlserve"]
        behaviour = median([r["behaviour_mean"] for r in rows])
        greedy = median([r["greedy_mean"] for r in rows])
        print("| runs | scripted controller mean | greedy DQN mean | per seed (greedy) |")
        print("|---|---:|---:|---|")
        per_seed = " / ".join(f"{r['greedy_mean']:.0f}" for r in rows)
        print(f"| {len(rows)} | {show(behaviour, '.1f')} | {show(greedy, '.1f')} | {per_seed} |")
        return
    print("| side | reached | steps to target | s to target | final mean | s (run) | per seed |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for side, rows in runs.items():
        reached = sum(r.get("steps_to_target") is not None for r in rows)
        per_seed = " / ".join(show(r.get("steps_to_target"), ",.0f") for r in rows)
        print(
            f"| {side} | {reached}/{len(rows)} "
            f"| {show(median([r.get('steps_to_target') for r in rows]), ',.0f')} "
            f"| {show(median([r.get('seconds_to_target') for r in rows]), '.1f')} "
            f"| {show(median([r.get('final_mean') for r in rows]), '.1f')} "
            f"| {show(median([r.get('seconds') for r in rows]), '.1f')} | {per_seed} |"
        )


def main() -> int:
    """Run the chosen tasks over the seeds (or, with ``--child``, one run) and print medians."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--tasks", nargs="+", choices=TASKS, default=list(TASKS))
    parser.add_argument("--only", choices=["rlserve", "sb3"], help="run one side only")
    parser.add_argument(
        "--child", nargs=3, metavar=("TASK", "SIDE", "SEED"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.child:
        task, side, seed = args.child
        print(json.dumps(child(task, side, int(seed))), flush=True)
        return 0
    for task in args.tasks:
        sides = [s for s in ("rlserve", "sb3") if args.only in (None, s)]
        if task not in SB3_SIDES:
            sides = [s for s in sides if s == "rlserve"]
        runs: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
        for seed in args.seeds:
            for side in sides:
                done = subprocess.run(
                    [sys.executable, __file__, "--child", task, side, str(seed)],
                    capture_output=True,
                    text=True,
                    check=False,
                )
                lines = done.stdout.strip().splitlines()
                if done.returncode != 0 or not lines:
                    tail = " | ".join(done.stderr.strip().splitlines()[-3:])
                    print(f"{task} {side} seed {seed}: FAILED ({tail})", flush=True)
                    continue
                result = json.loads(lines[-1])
                runs[side].append(result)
                print(f"{task} {side} seed {seed}: {result}", flush=True)
        report(task, runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
