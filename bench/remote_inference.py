"""Remote-inference benchmark: env steps/s against the loopback limit, latency, CPU, memory.

Every figure comes from real ``rlserve serve`` processes and real client processes that talk to
them through :class:`rlserve.PolicyClient`, exactly as a user's simulator would:

* 1, 8 and 64 client processes, each stepping its own gymnasium ``CartPole-v1`` with the loop
  ``start_episode`` / ``get_action`` / ``env.step`` / ``log_returns`` / ``end_episode``, with the
  learner idle (episodes started with ``training_enabled=False``: no sample reaches it) and with
  the learner training (``training_enabled=True``; PPO updates continuously, which is checked
  from ``learner/updates`` in ``GET /v1/metrics`` over every measurement window);
* the bare loopback limit of 1 and 8 clients (``limit-1``, ``limit-8``), run next to them: the
  same client loop against an echo server, one msgpack round trip per step carrying the bytes of
  rlserve's ``get_action`` (``bench/_loopback_limit.py``); every single-env rlserve figure is
  reported as a share of the limit of its client count measured in the same run;
* one client process stepping 16 CartPoles with one batched ``get_action`` per step of the vector;
* three options that locate the floor: ``--client wire`` runs the single-env rlserve scenarios
  with the bare protocol client of ``bench/_wire_client.py`` instead of ``PolicyClient``;
  ``--limit-load`` runs a learner-shaped process (``bench/_learner_load.py``) beside each echo
  limit; ``--limit-policy`` runs the limits against the floor of a Python and numpy policy
  server instead of the echo (``bench/_loopback_limit.py --policy``);
* CPU per env step of the serving process and the clients, and the learner's CPU per env step
  trained; the machine's load average at the start and the end;
* the resident memory of the server process plus its learner process after warm-up, and the time
  from launching ``rlserve serve`` to its listening line and to the first action served.

Each scenario gets a fresh server. Clients are started with multiprocessing ``spawn``, connect,
then run a warm-up period followed by ``--repeats`` back-to-back measurement windows of fixed
length; they report step counts and ``get_action`` latencies (``time.perf_counter`` around the
call) per window through a ``multiprocessing`` queue. The table shows the median over windows.

Run ``python bench/remote_inference.py`` (about 6 minutes on 2 idle cores), or ``--quick`` for a
shorter check (1 and 8 clients and their limits, 2 s windows: about 2.5 minutes).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import re
import shutil
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from _launch import ListeningProcess
from _learner_load import READY as LOAD_READY
from _loopback_limit import EchoClient, EchoServer
from _proc_cpu import CpuMeter, children, load_average, rss_kib, wait_for_quiet
from _remote_results import Result, Scenario, report
from _wire_client import WireClient

LISTENING = re.compile(
    r"rlserve listening on (?:tls://)?(\S+):(\d+) \(binary\) and https?://(\S+):(\d+)"
)

# -- client processes ---------------------------------------------------------------------------


def _window_of(now: float, bounds: list[float]) -> int:
    """Index of the measurement window holding ``now``: -1 before the first."""
    if now < bounds[0]:
        return -1
    for i in range(1, len(bounds)):
        if now < bounds[i]:
            return i - 1
    return len(bounds) - 1


def client_process(
    address: str,
    index: int,
    num_envs: int,
    training: bool,
    kind: str,
    ready: Any,
    go: Any,
    bounds_shared: Any,
    stop_at: Any,
    results: Any,
) -> None:
    """One client process: connect, wait for ``go``, run the loop, report per-window figures.

    ``kind``: ``policy`` (:class:`rlserve.PolicyClient`), ``wire`` (the bare protocol client of
    ``bench/_wire_client.py``), or ``echo`` (:class:`EchoClient`, for the echo server).
    """
    import gymnasium as gym

    envs = [gym.make("CartPole-v1") for _ in range(num_envs)]
    client: Any
    if kind == "echo":
        client = EchoClient(address)
    elif kind == "wire":
        client = WireClient(address, index)
    else:
        from rlserve import PolicyClient

        client = PolicyClient(address, inference_mode="remote", client_name=f"bench-{index}")
    observations = [env.reset(seed=1000 * index + i)[0] for i, env in enumerate(envs)]
    ready.put(index)
    go.wait()
    bounds = list(bounds_shared)
    windows = len(bounds) - 1
    steps = [0] * windows
    latencies: list[list[float]] = [[] for _ in range(windows)]
    loop = _single_env_loop if num_envs == 1 else _vector_loop
    loop(client, envs, observations, training, bounds, stop_at, steps, latencies)
    client.close()
    results.put(
        {
            "index": index,
            "steps": steps,
            "latencies": [np.asarray(lat, dtype=np.float64) for lat in latencies],
        }
    )


def _single_env_loop(
    client: Any,
    envs: list[Any],
    observations: list[Any],
    training: bool,
    bounds: list[float],
    stop_at: Any,
    steps: list[int],
    latencies: list[list[float]],
) -> None:
    """The user's loop of ``rlserve.cli.demo.cartpole_client``, timed (the limit's loop too)."""
    env, obs = envs[0], observations[0]
    windows = len(steps)
    now = time.monotonic()
    while now < stop_at.value:
        episode_id = client.start_episode(training_enabled=training)
        done = False
        while not done:
            started = time.perf_counter()
            action = client.get_action(episode_id, obs)
            elapsed = time.perf_counter() - started
            obs, reward, terminated, truncated, _ = env.step(action)
            client.log_returns(episode_id, float(reward))
            done = terminated or truncated
            if done:
                client.end_episode(episode_id, obs, truncated=truncated and not terminated)
            now = time.monotonic()
            window = _window_of(now, bounds)
            if 0 <= window < windows:
                steps[window] += 1
                latencies[window].append(elapsed)
            if now >= stop_at.value:
                break
        if done:
            obs, _ = env.reset()


def _vector_loop(
    client: Any,
    envs: list[Any],
    observations: list[Any],
    training: bool,
    bounds: list[float],
    stop_at: Any,
    steps: list[int],
    latencies: list[list[float]],
) -> None:
    """Step every env once per batched ``get_action``; finished episodes restart at once."""
    windows = len(steps)
    ids = [client.start_episode(training_enabled=training) for _ in envs]
    now = time.monotonic()
    while now < stop_at.value:
        started = time.perf_counter()
        actions = client.get_action(ids, np.stack(observations))
        elapsed = time.perf_counter() - started
        for i, env in enumerate(envs):
            obs, reward, terminated, truncated, _ = env.step(int(actions[i]))
            client.log_returns(ids[i], float(reward))
            if terminated or truncated:
                client.end_episode(ids[i], obs, truncated=truncated and not terminated)
                obs, _ = env.reset()
                ids[i] = client.start_episode(training_enabled=training)
            observations[i] = obs
        now = time.monotonic()
        window = _window_of(now, bounds)
        if 0 <= window < windows:
            steps[window] += len(envs)
            latencies[window].append(elapsed)


# -- the server ---------------------------------------------------------------------------------


class Server:
    """One ``rlserve serve`` process, its ports, and its start-up times."""

    def __init__(self, run_dir: Path, name: str, extra: list[str] | None = None):
        executable = Path(sys.executable).with_name("rlserve")
        command = (
            [str(executable)] if executable.exists() else [sys.executable, "-m", "rlserve.cli"]
        )
        command += [
            "serve",
            "--spaces-from",
            "CartPole-v1",
            "--port",
            "0",
            "--http-port",
            "0",
            "--run-dir",
            str(run_dir),
            "--name",
            name,
            "--no-progress",
            *(extra or []),
        ]
        launched = time.monotonic()
        self._launched = ListeningProcess(command, LISTENING, "rlserve serve")
        self.process, self.lines = self._launched.process, self._launched.lines
        self.listening_s = time.monotonic() - launched
        match = self._launched.match
        self.address = f"{match.group(1)}:{match.group(2)}"
        self.metrics_url = f"http://{match.group(3)}:{match.group(4)}/v1/metrics"
        self.first_action_s = self._first_action(launched)

    def _first_action(self, launched: float) -> float:
        from rlserve import PolicyClient

        with PolicyClient(
            self.address, inference_mode="remote", client_name="bench-probe"
        ) as client:
            episode = client.start_episode(training_enabled=False)
            client.get_action(episode, np.zeros(4, dtype=np.float32))
            elapsed = time.monotonic() - launched
            client.end_episode(episode, np.zeros(4, dtype=np.float32))
        return elapsed

    def metrics(self) -> dict[str, Any]:
        """``GET /v1/metrics``."""
        with urllib.request.urlopen(self.metrics_url, timeout=10) as response:
            return dict(json.load(response))

    def learner_pids(self) -> list[int]:
        """The server's children: the learner process (and the resource tracker, mostly idle)."""
        return [pid for pid, _ in children(self.process.pid)]

    def memory_mib(self) -> dict[str, float]:
        """RSS of the server, its learner child, and any other child (resource tracker)."""
        server = rss_kib(self.process.pid)
        learner = other = 0
        for pid, cmdline in children(self.process.pid):
            if "multiprocessing.resource_tracker" in cmdline:
                other += rss_kib(pid)
            else:
                learner += rss_kib(pid)
        return {
            "server_mib": server / 1024,
            "learner_mib": learner / 1024,
            "total_mib": (server + learner) / 1024,
            "other_children_mib": other / 1024,
        }

    def stop(self) -> None:
        """SIGTERM, and wait for the clean shutdown (final checkpoint)."""
        self._launched.stop(grace_s=60)


def demo_ppo_config(run_dir: Path) -> Path:
    """A ``--config`` file with the CartPole demo's PPO settings (``rlserve.cli.demo.TASKS``).

    The bench times the demo's client loop, so its server trains as the demo's does: small,
    fast updates. The general PPO defaults (2,048 steps, minibatches of 64, chosen on the
    learning suite of issue 22) make about four times as many optimiser steps per env step,
    a learner load the issue-21 targets were not set against. The demo's server option
    ``max_learner_lag_steps`` is left at its default: the bench measures serving unthrottled.
    """
    import tomli_w

    from rlserve.cli.demo import TASKS

    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "bench-ppo.toml"
    path.write_text(tomli_w.dumps({"ppo": TASKS["cartpole"].settings["ppo"]}))
    return path


# -- one scenario -------------------------------------------------------------------------------


def run_scenario(scenario: Scenario, args: argparse.Namespace, run_dir: Path, ctx: Any) -> Result:
    """Run ``scenario`` against a fresh server (the echo server for a limit) and measure it."""
    result = Result(scenario)
    server: Server | EchoServer
    load: ListeningProcess | None = None
    if scenario.limit:
        server = EchoServer(policy=scenario.policy_floor)
        if scenario.learner_load:
            try:
                load = ListeningProcess(
                    [sys.executable, str(Path(__file__).with_name("_learner_load.py"))],
                    re.compile(re.escape(LOAD_READY)),
                    "the learner load",
                )
            except BaseException:
                server.stop()
                raise
    else:
        extra = ["--learner-niceness", str(args.learner_niceness)]
        extra += ["--config", str(demo_ppo_config(run_dir))]
        server = Server(run_dir, f"bench-{scenario.key}-{os.getpid()}", extra)
    result.listening_s, result.first_action_s = server.listening_s, server.first_action_s
    ready, results, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    windows = args.repeats * (1 + args.extra_windows)
    bounds_shared = ctx.Array("d", windows + 1, lock=False)
    stop_at = ctx.Value("d", 0.0, lock=False)
    processes = [
        ctx.Process(
            target=client_process,
            args=(
                server.address,
                i,
                scenario.envs_per_client,
                scenario.training,
                "echo" if scenario.limit else args.client,
                ready,
                go,
                bounds_shared,
                stop_at,
                results,
            ),
            daemon=True,
        )
        for i in range(scenario.clients)
    ]
    window_stats: list[dict[str, float]] = []
    try:
        spawned = time.monotonic()
        for process in processes:
            process.start()
        for _ in processes:
            ready.get(timeout=300)
        result.client_start_s = time.monotonic() - spawned
        start = time.monotonic() + args.warmup
        bounds = [start + r * args.window for r in range(windows + 1)]
        bounds_shared[:] = bounds
        stop_at.value = bounds[-1]
        go.set()
        _sleep_until(start)
        result.memory = server.memory_mib()
        meter = CpuMeter(
            {
                "bench": [os.getpid()],
                "server": [server.process.pid],
                "learner": server.learner_pids() + ([load.process.pid] if load else []),
                "clients": [p.pid for p in processes if p.pid is not None],
            }
        )
        before = server.metrics()
        for r in range(windows):
            _sleep_until(bounds[r + 1])
            cores = meter.lap()
            after = server.metrics()
            window_stats.append(_server_window(before, after, args.window))
            window_stats[-1].update({f"{k}_cores": v for k, v in cores.items()})
            before = after
            clean = sum(w["other_cores"] <= args.max_other_load for w in window_stats)
            hopeless = r + 1 >= args.repeats and windows - r - 1 < args.repeats - clean
            if clean >= args.repeats or hopeless:
                # Enough clean windows (or too few left to get them): stop the clients now.
                stop_at.value = bounds[r + 1]
                break
        reports = [results.get(timeout=120) for _ in processes]
        for process in processes:
            process.join(timeout=30)
    finally:
        for process in processes:
            if process.is_alive():
                process.terminate()
        server.stop()
        if load is not None:
            load.stop(grace_s=10)
    # Keep the windows other processes left alone; if there are too few, keep them all.
    kept = [r for r, w in enumerate(window_stats) if w["other_cores"] <= args.max_other_load]
    if len(kept) < args.repeats:
        kept = list(range(len(window_stats)))
    result.windows_run, result.windows_kept = len(window_stats), len(kept)
    for r in kept:
        steps = sum(report["steps"][r] for report in reports)
        lat = np.concatenate([report["latencies"][r] for report in reports]) * 1e3
        result.steps_per_s.append(steps / args.window)
        result.p50_ms.append(float(np.percentile(lat, 50)) if lat.size else float("nan"))
        result.p99_ms.append(float(np.percentile(lat, 99)) if lat.size else float("nan"))
        for name, value in window_stats[r].items():
            getattr(result, name).append(value)
    return result


def _server_window(
    before: dict[str, Any], after: dict[str, Any], window: float
) -> dict[str, float]:
    def value(metrics: dict[str, Any], key: str) -> float:
        raw = metrics.get(key)
        return 0.0 if raw is None else float(raw)

    # actions_served == env_steps here (no log_action), so batches = env_steps / mean batch.
    def batches(metrics: dict[str, Any]) -> float:
        mean = value(metrics, "server/mean_inference_batch")
        return value(metrics, "samples/env_steps") / mean if mean else 0.0

    served = value(after, "samples/env_steps") - value(before, "samples/env_steps")
    count = batches(after) - batches(before)
    return {
        "learner_updates": value(after, "learner/updates") - value(before, "learner/updates"),
        "steps_trained": value(after, "learner/steps_trained")
        - value(before, "learner/steps_trained"),
        "update_seconds": value(after, "learner/update_seconds"),
        "server_steps_per_s": served / window,
        "mean_batch": served / count if count > 0 else float("nan"),
    }


def _sleep_until(deadline: float) -> None:
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(left, 0.5))


# -- main ---------------------------------------------------------------------------------------


def scenarios(client_counts: list[int], limit_counts: list[int]) -> list[Scenario]:
    """Per client count its limit (when asked for), idle and training; then the vector client."""
    chosen = []
    for n in client_counts:
        label = f"{n} client{'s' if n > 1 else ''}"
        if n in limit_counts:
            chosen.append(Scenario(f"limit-{n}", f"{label}, echo limit", n, 1, False, limit=True))
        chosen.append(Scenario(f"idle-{n}", label, n, 1, False))
        chosen.append(Scenario(f"train-{n}", label, n, 1, True))
    for training in (False, True):
        tag = "train" if training else "idle"
        chosen.append(Scenario(f"vec16-{tag}", "1 client, 16-env vector", 1, 16, training))
    return chosen


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="measurement windows per scenario")
    parser.add_argument("--window", type=float, help="seconds per window (5; --quick: 2)")
    parser.add_argument("--warmup", type=float, help="seconds of warm-up (5; --quick: 2)")
    parser.add_argument("--quick", action="store_true", help="short windows, fewer scenarios")
    parser.add_argument(
        "--clients", type=int, nargs="+", help="client process counts (1 8 64; --quick: 1 8)"
    )
    parser.add_argument(
        "--limit-clients",
        type=int,
        nargs="+",
        default=[1, 8],
        help="client counts (among --clients) whose echo-server limit runs too (1 8)",
    )
    parser.add_argument(
        "--only", nargs="+", help="run only these scenario keys, e.g. limit-8 train-8"
    )
    parser.add_argument("--json", type=Path, help="also write every measurement to this file")
    parser.add_argument("--run-dir", type=Path, help="keep the servers' run folders here")
    parser.add_argument(
        "--max-other-load",
        type=float,
        default=0.15,
        help="before each scenario wait until other processes use fewer cores than this",
    )
    parser.add_argument(
        "--extra-windows",
        type=int,
        default=2,
        help="up to repeats x this many more windows replace ones where other processes were busy",
    )
    parser.add_argument(
        "--wait-quiet", type=float, default=300.0, help="longest wait for a quiet machine (s)"
    )
    parser.add_argument(
        "--learner-niceness",
        type=int,
        default=0,
        help="rlserve serve --learner-niceness (0, the default: the learner shares the CPU)",
    )
    parser.add_argument(
        "--client",
        choices=["policy", "wire"],
        default="policy",
        help="rlserve's clients: PolicyClient, or the bare protocol client of _wire_client.py"
        " (single-env scenarios only)",
    )
    parser.add_argument(
        "--limit-policy",
        action="store_true",
        help="run the limits against the policy floor (_loopback_limit.py --policy: batching, "
        "a numpy MLP forward pass, sampling; no validation, episodes or learner)",
    )
    parser.add_argument(
        "--limit-load",
        action="store_true",
        help="run a learner-shaped process (_learner_load.py) beside each echo limit",
    )
    args = parser.parse_args()
    args.window = args.window or (2.0 if args.quick else 5.0)
    args.warmup = args.warmup or (2.0 if args.quick else 5.0)
    args.clients = args.clients or ([1, 8] if args.quick else [1, 8, 64])
    chosen = scenarios(args.clients, args.limit_clients)
    if args.only:
        chosen = [s for s in chosen if s.key in args.only]
    if args.client == "wire" and any(s.envs_per_client > 1 for s in chosen):
        # The bare client sends the single-episode get_action only.
        chosen = [s for s in chosen if s.envs_per_client == 1]
        print("--client wire: the vector-client scenarios are left out", file=sys.stderr)
    for scenario in chosen:
        scenario.learner_load = scenario.limit and args.limit_load
        scenario.policy_floor = scenario.limit and args.limit_policy

    ctx = mp.get_context("spawn")
    run_dir = args.run_dir or Path(tempfile.mkdtemp(prefix="rlserve-bench-"))
    results: dict[str, Result] = {}
    loads = [load_average()]
    print("load average at the start: {:.2f} {:.2f} {:.2f}".format(*loads[0]), file=sys.stderr)
    try:
        for scenario in chosen:
            load = wait_for_quiet(args.max_other_load, args.wait_quiet)
            print(
                f"running {scenario.key} (other processes use {load:.2f} cores) ...",
                file=sys.stderr,
                flush=True,
            )
            res = run_scenario(scenario, args, run_dir, ctx)
            res.load_before = load
            results[scenario.key] = res
            print(
                f"  {res.median('steps_per_s'):,.0f} env steps/s, p50 {res.median('p50_ms'):.2f}"
                f" ms, p99 {res.median('p99_ms'):.2f} ms, updates/window {res.learner_updates}",
                file=sys.stderr,
                flush=True,
            )
    except KeyboardInterrupt:
        print("interrupted: the report covers the scenarios that finished", file=sys.stderr)
    finally:
        if args.run_dir is None:
            shutil.rmtree(run_dir, ignore_errors=True)
    loads.append(load_average())
    print("load average at the end: {:.2f} {:.2f} {:.2f}".format(*loads[1]), file=sys.stderr)
    print(report(results, args, (loads[0], loads[1])))
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "args": {k: str(v) for k, v in vars(args).items()},
                    "load_average": {"start": loads[0], "end": loads[1]},
                    "results": [asdict(r) for r in results.values()],
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
