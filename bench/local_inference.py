"""Local-inference benchmark: client env steps/s while the server trains, and server ingest.

Run: ``.venv/bin/python bench/local_inference.py`` (``--quick`` for a short run).

1. One local-mode client process steps its own ``gymnasium.make("CartPole-v1")`` with actions from
   its numpy policy (default ``PolicyClient`` settings), while the server trains PPO on the
   batches it reports. Figure: env steps/s including the CartPole step.
2. A synthetic sender pipelines ``report_samples`` batches (10 fragments of 200 CartPole steps)
   over one binary connection and waits for every reply. The learner only takes the fragments in
   (its train batch is set larger than the run), so the figure is the serving side's ingest:
   decode, validation, queueing and hand-off to the learner process.

Each figure is the median of ``--repeats`` runs, each with a fresh server.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

LISTENING = re.compile(
    r"rlserve listening on (?:tls://)?[^:]+:(\d+) \(binary\) and https?://[^:]+:(\d+)"
)
RLSERVE = str(Path(sys.executable).parent / "rlserve")


def start_server(run_dir: str, *flags: str) -> tuple[subprocess.Popen[str], int, int]:
    name = f"bench-{uuid.uuid4().hex[:8]}"
    command = [RLSERVE, "serve", "--spaces-from", "CartPole-v1", "--port", "0", "--http-port", "0"]
    command += ["--run-dir", run_dir, "--name", name, "--no-progress", *flags]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    assert process.stdout is not None
    for line in process.stdout:
        match = LISTENING.search(line)
        if match:
            return process, int(match[1]), int(match[2])
    raise RuntimeError("the server exited before listening")


def stop_server(process: subprocess.Popen[str]) -> None:
    process.terminate()
    try:
        process.wait(60)
    except subprocess.TimeoutExpired:
        process.kill()


def metrics(http_port: int) -> dict[str, Any]:
    import json
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v1/metrics", timeout=10) as r:
        return json.loads(r.read())


def client_process(port: int, warmup: float, window: float, out: Any) -> None:
    import gymnasium as gym

    from rlserve import PolicyClient

    client = PolicyClient(f"127.0.0.1:{port}", inference_mode="local")
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=0)
    steps, started, measured_from = 0, time.perf_counter(), None
    while True:
        episode_id = client.start_episode()
        done = False
        while not done:
            action = client.get_action(episode_id, obs)
            obs, reward, terminated, truncated, _ = env.step(action)
            client.log_returns(episode_id, float(reward))
            done = terminated or truncated
            steps += 1
        client.end_episode(episode_id, obs, truncated=truncated and not terminated)
        obs, _ = env.reset()
        now = time.perf_counter()
        if measured_from is None and now - started >= warmup:
            measured_from, steps_at = now, steps
        if measured_from is not None and now - measured_from >= window:
            out.put(((steps - steps_at) / (now - measured_from), client.weights_version))
            client.local.close(timeout=5) if client.local is not None else None
            return


def measure_client(run_dir: str, warmup: float, window: float) -> tuple[float, int]:
    process, port, http_port = start_server(run_dir)
    try:
        ctx = mp.get_context("spawn")
        out = ctx.Queue()
        worker = ctx.Process(target=client_process, args=(port, warmup, window, out))
        worker.start()
        rate, _version = out.get(timeout=warmup + window + 120)
        worker.join(30)
        updates = int(metrics(http_port).get("learner/updates", 0))
        return rate, updates
    finally:
        stop_server(process)


WARMUP_BATCHES = 50
"""Batches sent before the ingest measurement starts."""


def synthetic_batch(version: int, rng: np.random.Generator) -> dict[str, Any]:
    fragments = []
    for _ in range(10):
        steps = 200
        fragments.append(
            {
                "episode_id": uuid.uuid4().hex,
                "obs": rng.uniform(-0.05, 0.05, (steps + 1, 4)).astype(np.float32),
                "actions": rng.integers(0, 2, steps),
                "rewards": np.ones(steps, np.float32),
                "behaviour_logp": np.full(steps, -0.69, np.float32),
                "policy_chosen": np.ones(steps, bool),
                "weights_version": np.full(steps, version, np.int64),
                "terminated": False,
                "truncated": False,
            }
        )
    return {"type": "report_samples", "fragments": fragments}


def measure_ingest(run_dir: str, batches: int) -> float:
    from rlserve.client.connection import Connection, Timeouts

    # The learner takes fragments in but never reaches a train batch: only ingest is measured.
    process, port, _ = start_server(
        run_dir, "--ppo-train-batch-size", "1000000000", "--max-sample-queue-steps", "10000000"
    )
    try:
        conn = Connection(f"127.0.0.1:{port}", None, "bench", "local", Timeouts(request=120))
        conn.open()
        version = conn.request({"type": "get_weights"})["version"]
        template = synthetic_batch(version, np.random.default_rng(0))
        steps = sum(len(f["rewards"]) for f in template["fragments"])
        # Warm up first (the learner's first reads, the log's first segment), as a running
        # server would be: the figure is the steady ingest rate.
        for i in range(WARMUP_BATCHES):
            conn.send_nowait({**template, "batch_id": f"warmup{i}"})
        conn.request({"type": "ping"})
        started = time.perf_counter()
        for i in range(batches):
            conn.send_nowait({**template, "batch_id": f"b{i}"})
        conn.close()  # waits for every reply
        return steps * batches / (time.perf_counter() - started)
    finally:
        stop_server(process)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="short windows, one repeat")
    args = parser.parse_args()
    repeats = 1 if args.quick else args.repeats
    warmup, window = (2.0, 3.0) if args.quick else (3.0, 8.0)
    batches = 200 if args.quick else 500
    with tempfile.TemporaryDirectory() as run_dir:
        client_runs = [measure_client(run_dir, warmup, window) for _ in range(repeats)]
        ingest_runs = [measure_ingest(run_dir, batches) for _ in range(repeats)]
    rates = [r for r, _ in client_runs]
    client_rate = statistics.median(rates)
    ingest_rate = statistics.median(ingest_runs)
    print(f"local inference benchmark ({repeats} repeat(s), medians)")
    print(f"{'figure':<52}{'value':>14}{'target':>12}  verdict")
    print(
        f"{'one local client, env steps/s (server training)':<52}{client_rate:>14,.0f}"
        f"{20_000:>12,}  {'PASS' if client_rate >= 20_000 else 'FAIL'}"
    )
    print(
        f"{'server ingest of reported batches, env steps/s':<52}{ingest_rate:>14,.0f}"
        f"{200_000:>12,}  {'PASS' if ingest_rate >= 200_000 else 'FAIL'}"
    )
    print(
        f"runs: client {[round(r) for r in rates]}, learner updates {[u for _, u in client_runs]}"
    )
    print(f"runs: ingest {[round(r) for r in ingest_runs]}")


if __name__ == "__main__":
    main()
