"""PPO with memory (``use_lstm``) on StatelessCartPole, hosted and remote, against RecurrentPPO.

Run: ``PYTHONPATH=src .venv/bin/python bench/stateless_cartpole.py`` (needs the ``bench``
extra: ``pip install -e '.[bench]'``, for sb3-contrib); ``--seeds 0`` for one seed, ``--steps N``
for another budget, ``--only hosted recurrentppo`` for some rows, ``--jobs 2`` for two runs at
once, ``--quick`` for a plumbing check (one seed, 20,000 steps: no row reaches the target).

Target (issue 23, "Memory"): on :class:`rlserve.env.StatelessCartPole` (CartPole-v1 observing
cart position and pole angle only), the mean return of the last 100 training episodes >= 350
within 300,000 env steps, hosted and through remote clients, in less wall time than
sb3-contrib's ``RecurrentPPO`` on the same machine; the same PPO without memory stays far
below. RLlib's own example (PPO, ``use_lstm=True``, ``max_seq_len=20``) expects ~350 within
~300,000 steps. Rows, each one run per seed (medians over the seeds):

- ``hosted``: ``PPOConfig().environment(StatelessCartPole).training(use_lstm=True,
  max_seq_len=20)``, every other setting the default (one env copy).
- ``remote``: ``rlserve serve`` (a sub-process) with the same settings (``[ppo]`` of a
  ``--config`` file, the spaces from a ``--spaces-file``) and ``--clients`` client processes
  (4), each stepping its own StatelessCartPole with ``PolicyClient`` over loopback, remote
  inference (the server acts and keeps each episode's recurrent state; ``--inference local``:
  each client acts with the numpy policy and keeps the state). The server holds the clients
  while its learner is 256 env steps behind (``--max-learner-lag-steps 256``), so that the
  learner trains on the budget's steps and nearly on-policy: by default a PPO server never
  holds its clients, and 4 fast clients then outran the slower recurrent learner, which trained
  43,000 of 300,000 steps; held at 4,096 steps (as ``rlserve demo`` does for PPO) every step it
  trained on was one weights version old, and the recurrent policy crossed 350 but did not hold
  it (docs/benchmarks.md). ``--serve-args`` replaces the flags.
- ``nomemory``: as ``hosted`` without ``use_lstm``: the MLP sees one observation.
- ``recurrentppo``: ``RecurrentPPO("MlpLstmPolicy", ...)`` with sb3-contrib's defaults (one
  env, LSTM of 256, 128 steps per update), episodes from its Monitor wrapper.

``torch_threads=1`` / ``torch.set_num_threads(1)`` and ``device="cpu"`` on every side. Per run:
the mean return of the last 100 episodes ended by the budget, the env step (and wall second) at
which the last-100 mean first reached 350, wall seconds to the budget (building and training,
the server's start-up included; Python start-up excluded) and env steps/s. Hosted episodes come
from the ``on_episode_end`` callback (exact env steps with one env copy); remote ones from the
clients (the env step of an episode is the sum of every client's steps at the episodes they
had ended by then). Each run is a sub-process of this script.

The rlserve memory rows need PPO's ``use_lstm`` (issue 23); where this rlserve has none they
stop before anything runs, with a message naming the rows that do run.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from _suite_contenders import Recorder

STEPS = 300_000
QUICK_STEPS = 20_000
TARGET = 350.0
MEMORY = {"use_lstm": True, "max_seq_len": 20}
"""The settings of the memory rows over PPO's defaults (the contract's names)."""
ROWS = ("hosted", "remote", "nomemory", "recurrentppo")
MEMORY_ROWS = ("hosted", "remote")
COMMON = {"torch_threads": 1, "device": "cpu"}
"""Settings that only keep a run on one core."""


def missing_memory() -> str | None:
    """Why this rlserve cannot run the memory rows (None when PPO takes ``MEMORY``)."""
    from rlserve import PPOConfig
    from rlserve.errors import ConfigError

    try:
        PPOConfig().training(**MEMORY)
    except ConfigError as exc:
        return str(exc).split(";")[0]
    return None


class Timed(Recorder):
    """A :class:`Recorder` that also notes the wall second the threshold was first reached."""

    def __init__(self, budget: int, threshold: float, started: float) -> None:
        super().__init__(budget, threshold)
        self.started = started
        self.reached_seconds: float | None = None

    def episode(self, step: int, episode_return: float) -> None:
        """An episode ended at env step ``step`` with ``episode_return``."""
        super().episode(step, episode_return)
        if self.reached is not None and self.reached_seconds is None:
            self.reached_seconds = round(time.monotonic() - self.started, 1)

    def timed_result(self, steps: int, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """The run's record (without its curve), with the second the threshold was reached."""
        result = self.result(steps, time.monotonic() - self.started)
        result.pop("curve")
        return {**result, "seconds_to_threshold": self.reached_seconds, **(extra or {})}


def run_hosted(seed: int, steps: int, settings: dict[str, Any]) -> dict[str, Any]:
    """Hosted rlserve PPO on StatelessCartPole with ``settings`` over its defaults."""
    from rlserve import PPOConfig
    from rlserve.env import StatelessCartPole

    recorder = Timed(steps, TARGET, time.monotonic())
    pending: list[tuple[int, float]] = []
    lengths: dict[str, int] = defaultdict(int)

    def on_episode_end(*, episode: Any, **_: Any) -> None:
        if episode.training_enabled:
            lengths[episode.source] += episode.length
            pending.append((lengths[episode.source], episode.episode_return))

    config = (
        PPOConfig()
        .environment(StatelessCartPole)
        .training(**COMMON, **settings)
        .debugging(seed=seed)
        .callbacks(on_episode_end=on_episode_end, fail_fast=True)
    )
    with config.build() as algo:
        while algo.env_steps_sampled < steps:
            algo.train()
            for summed, episode_return in pending:
                recorder.episode(summed * max(1, len(lengths)), episode_return)
            pending.clear()
        done = algo.env_steps_sampled
    return recorder.timed_result(done)


def client_loop(
    address: str, index: int, seed: int, inference: str, stop: Any, episodes: Any
) -> None:
    """One remote client: step its own StatelessCartPole until ``stop``; report each episode.

    Puts ``(index, this client's env steps so far, episode return)`` on ``episodes``.
    """
    from rlserve import PolicyClient
    from rlserve.env import StatelessCartPole
    from rlserve.errors import ConnectionLostError

    episodes.cancel_join_thread()  # what is still unsent when it stops is not needed
    env = StatelessCartPole()
    steps, episode = 0, 0
    try:
        with PolicyClient(
            address, inference_mode=inference, client_name=f"stateless-{index}", timeout=120
        ) as client:
            while not stop.is_set():
                obs, _ = env.reset(seed=seed * 1000 + index * 100_000 + episode)
                episode_id = client.start_episode()
                total, done = 0.0, False
                while not done:
                    action = client.get_action(episode_id, obs)
                    obs, reward, terminated, truncated, _ = env.step(action)
                    client.log_returns(episode_id, float(reward))
                    total += float(reward)
                    steps += 1
                    done = terminated or truncated or stop.is_set()
                client.end_episode(episode_id, obs, truncated=not terminated)
                if terminated or truncated:
                    episodes.put((index, steps, total))
                episode += 1
    except ConnectionLostError:
        if not stop.is_set():
            raise


def _serve_files(folder: Path, settings: dict[str, Any]) -> list[str]:
    """The spaces file and the ``[ppo]`` config of the remote row; the flags naming them."""
    from rlserve.env import StatelessCartPole
    from rlserve.protocol.spaces import describe

    env = StatelessCartPole()
    spaces = {
        "observation_space": describe(env.observation_space),
        "action_space": describe(env.action_space),
    }
    (folder / "spaces.json").write_text(json.dumps(spaces))
    lines = ["[ppo]"] + [f"{key} = {json.dumps(value)}" for key, value in settings.items()]
    (folder / "rlserve.toml").write_text("\n".join(lines) + "\n")
    return ["--spaces-file", str(folder / "spaces.json"), "--config", str(folder / "rlserve.toml")]


def run_remote(
    seed: int,
    steps: int,
    settings: dict[str, Any],
    clients: int,
    inference: str,
    serve_args: list[str],
) -> dict[str, Any]:
    """``rlserve serve`` with ``settings`` and ``clients`` client processes over loopback."""
    import multiprocessing as mp
    import queue

    from _server import start_server

    with tempfile.TemporaryDirectory(prefix="stateless-") as tmp:
        folder = Path(tmp)
        flags = _serve_files(folder, {**COMMON, **settings})
        started = time.monotonic()
        recorder = Timed(steps, TARGET, started)
        server = start_server([*flags, "--seed", str(seed), *serve_args], folder)
        ctx = mp.get_context("spawn")
        stop, episodes = ctx.Event(), ctx.Queue()
        processes = [
            ctx.Process(
                target=client_loop, args=(server.address, i, seed, inference, stop, episodes)
            )
            for i in range(clients)
        ]
        try:
            for process in processes:
                process.start()
            latest = [0] * clients
            while sum(latest) < steps:
                try:
                    index, taken, episode_return = episodes.get(timeout=5)
                except queue.Empty:
                    if not server.alive():
                        raise RuntimeError(f"the server exited:\n{server.log()}") from None
                    if not all(p.is_alive() for p in processes):
                        raise RuntimeError(
                            "a client exited before the budget (its traceback is above)"
                        ) from None
                    continue
                latest[index] = taken
                recorder.episode(sum(latest), episode_return)
            result = recorder.timed_result(sum(latest))
            stop.set()
            metrics = server.get_json("/v1/metrics")
            result["steps_trained"] = metrics.get("learner/steps_trained")
            result["steps_dropped"] = sum(
                int(metrics.get(key) or 0)
                for key in (
                    "samples/steps_dropped_queue_full",
                    "learner/steps_dropped_stale",
                    "learner/steps_dropped_cap",
                )
            )
        finally:
            stop.set()
            for process in processes:
                process.join(30)
                if process.is_alive():
                    process.kill()
            server.stop()
    return result


def run_recurrentppo(seed: int, steps: int) -> dict[str, Any]:
    """sb3-contrib's RecurrentPPO with its defaults on StatelessCartPole."""
    from sb3_contrib import RecurrentPPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    from rlserve.env import StatelessCartPole

    recorder = Timed(steps, TARGET, time.monotonic())

    class Episodes(BaseCallback):
        def _on_step(self) -> bool:
            for info in self.locals.get("infos", []):
                if "episode" in info:
                    recorder.episode(self.num_timesteps, float(info["episode"]["r"]))
            return True

    env = make_vec_env(StatelessCartPole, n_envs=1, seed=seed)
    model = RecurrentPPO("MlpLstmPolicy", env, seed=seed, device="cpu", verbose=0)
    model.learn(steps, callback=Episodes())
    env.close()
    return recorder.timed_result(model.num_timesteps)


def child(args: argparse.Namespace) -> dict[str, Any]:
    """One run of ``args.only[0]`` in this process, with one torch thread."""
    import torch

    torch.set_num_threads(1)
    row, seed = args.only[0], args.seeds[0]
    if row in MEMORY_ROWS and (why := missing_memory()) is not None:
        raise SystemExit(_no_memory(why))
    if row == "hosted":
        result = run_hosted(seed, args.steps, MEMORY)
    elif row == "remote":
        serve_args = shlex.split(args.serve_args)
        result = run_remote(seed, args.steps, MEMORY, args.clients, args.inference, serve_args)
    elif row == "nomemory":
        result = run_hosted(seed, args.steps, {})
    else:
        result = run_recurrentppo(seed, args.steps)
    return {"row": row, "seed": seed, **result}


def _no_memory(why: str) -> str:
    return (
        f"the rows {', '.join(MEMORY_ROWS)} need PPO's use_lstm and max_seq_len (issue 23's "
        f"memory), which this rlserve has not: {why}\nrun the other rows alone "
        "(--only nomemory recurrentppo), or run this bench on a build with the memory feature"
    )


def _line(result: dict[str, Any]) -> str:
    reached = result["steps_to_threshold"]
    when = f"{reached:,} ({result['seconds_to_threshold']:.0f} s)" if reached else "never"
    extra = ""
    if "steps_trained" in result:
        extra = f"; learner trained {result['steps_trained']}, dropped {result['steps_dropped']}"
    return (
        f"{result['row']} seed {result['seed']}: last-100 mean {result['final_mean']:.1f} at "
        f"{result['steps']:,} steps ({result['episodes']:,} episodes); >= {TARGET:.0f} first at "
        f"{when}; {result['seconds']:.0f} s, {result['steps_per_s']:.0f} steps/s{extra}"
    )


def summarise(results: dict[str, list[dict[str, Any]]], budget: int) -> None:
    """Print each row's medians and the target's verdict."""
    medians: dict[str, dict[str, Any]] = {}
    for row in ROWS:
        runs = results.get(row)
        if not runs:
            continue
        # A run that never reached the threshold counts as past the budget in the median.
        reach = statistics.median(r["steps_to_threshold"] or budget + 1 for r in runs)
        medians[row] = {
            "final": statistics.median(r["final_mean"] for r in runs),
            "reach": reach if reach <= budget else None,
            "seconds": statistics.median(r["seconds"] for r in runs),
        }
        m = medians[row]
        reach_text = f"{m['reach']:,.0f}" if m["reach"] else "never"
        print(
            f"{row}: median last-100 mean {m['final']:.1f}; median steps to {TARGET:.0f} "
            f"{reach_text} (reached in "
            f"{sum(bool(r['steps_to_threshold']) for r in runs)}/{len(runs)} runs); median "
            f"{m['seconds']:.0f} s, {statistics.median(r['steps_per_s'] for r in runs):.0f} "
            "steps/s",
            flush=True,
        )
    anchor = medians.get("recurrentppo")
    for row in MEMORY_ROWS:
        if row not in medians:
            continue
        m = medians[row]
        reached = m["reach"] is not None
        faster = anchor is not None and m["seconds"] < anchor["seconds"]
        verdict = "PASS" if reached and faster else "FAIL"
        if reached and anchor is None:
            verdict = "INCOMPLETE (run the recurrentppo row too for the wall-time comparison)"
        against = f"{anchor['seconds']:.0f} s" if anchor else "not run"
        print(
            f"target {row}: {verdict}: >= {TARGET:.0f} within {budget:,} steps "
            f"{'yes' if reached else 'no'}; wall {m['seconds']:.0f} s against RecurrentPPO's "
            f"{against}",
            flush=True,
        )
    if "nomemory" in medians:
        memory = [medians[row]["final"] for row in MEMORY_ROWS if row in medians]
        print(
            f"without memory: median last-100 mean {medians['nomemory']['final']:.1f}"
            + (f" against {', '.join(f'{v:.1f}' for v in memory)} with it" if memory else ""),
            flush=True,
        )


def main() -> None:
    """Run every row for every seed (sub-processes, ``--jobs`` at once); print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", help="seeds (default 0 1 2; quick 0)")
    parser.add_argument("--only", nargs="+", choices=ROWS, default=list(ROWS), help="rows")
    parser.add_argument("--steps", type=int, help=f"env step budget per run ({STEPS:,})")
    parser.add_argument("--quick", action="store_true", help="one seed, 20,000 steps")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once (processes)")
    parser.add_argument("--clients", type=int, default=4, help="client processes (remote)")
    parser.add_argument(
        "--inference", choices=["remote", "local"], default="remote", help="remote row's clients"
    )
    parser.add_argument(
        "--serve-args",
        default="--max-learner-lag-steps 256",
        help="extra 'rlserve serve' flags (remote; default: %(default)s)",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.seeds = args.seeds or ([0] if args.quick else [0, 1, 2])
    args.steps = args.steps or (QUICK_STEPS if args.quick else STEPS)
    if args.child:
        print(json.dumps(child(args)))
        return
    if any(row in MEMORY_ROWS for row in args.only) and (why := missing_memory()) is not None:
        raise SystemExit(_no_memory(why))
    print(
        f"StatelessCartPole, {args.steps:,} env steps, seeds {args.seeds}; memory rows: PPO "
        f"with {MEMORY} over the defaults; remote: {args.clients} clients, "
        f"{args.inference} inference",
        flush=True,
    )
    queue = [(seed, row) for seed in args.seeds for row in args.only]
    running: list[tuple[subprocess.Popen[str], Any, str, int]] = []
    results: dict[str, list[dict[str, Any]]] = defaultdict(list)
    while queue or running:
        while queue and len(running) < max(1, args.jobs):
            seed, row = queue.pop(0)
            command = [sys.executable, __file__, "--child", "--only", row, "--seeds", str(seed)]
            command += ["--steps", str(args.steps), "--clients", str(args.clients)]
            command += ["--inference", args.inference, f"--serve-args={args.serve_args}"]
            # A file, not a pipe: a pipe could fill up while other runs are waited on.
            out = tempfile.TemporaryFile("w+")  # noqa: SIM115 (closed once the run ends)
            running.append((subprocess.Popen(command, stdout=out, text=True), out, row, seed))
        time.sleep(0.5)
        for entry in [e for e in running if e[0].poll() is not None]:
            running.remove(entry)
            process, out, row, seed = entry
            out.seek(0)
            text = out.read()
            out.close()
            if process.returncode != 0:
                raise SystemExit(f"{row} seed {seed} failed (exit code {process.returncode})")
            result = json.loads(text.strip().splitlines()[-1])
            results[row].append(result)
            print(_line(result), flush=True)
    summarise(results, args.steps)


if __name__ == "__main__":
    main()
