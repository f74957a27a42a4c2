"""Two serving front-ends against one, on a two-node loopback Ray cluster: steps/s and ingest.

Run: ``PYTHONPATH=src .venv/bin/python bench/ray_front_ends.py`` (``--quick`` for a short run).
Needs ``pip install 'rlserve[ray]'``.

The script starts a two-node Ray cluster of its own (head on 127.0.0.2, a second node on
127.0.0.3, each 1 CPU, its own temp dir; stopped at the end by killing the processes that name
that dir), then for ``--replicas 1`` and ``2`` an ``rlserve serve --ray ... --replicas N``
(PPO on CartPole-v1, the learner an actor) and, for remote and then local inference,
``--clients`` client processes playing CartPole as fast as they can, spread over the
front-ends (each given every front-end, its own first; a local client waits while its buffer of
20,000 steps is full, so its steps are what the serving path took). After ``--warmup``
seconds it measures over ``--seconds``:

* env steps/s: the steps the clients took (their own count), in total and per front-end;
* ingest: the steps the front-ends logged (``samples/steps_logged``: what they acknowledged,
  which with two front-ends is once the learner merged it, or cut from remote episodes), the
  steps the learner read from its log (``learner/steps_consumed``: trained, or dropped from its
  queue when training falls behind) and trained (``learner/steps_trained``), per second.

On one machine the front-ends, the learner and the clients share its cores: the figures say
what the cluster's machinery costs and how it divides, not what real nodes would reach.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from _launch import ListeningProcess
from _server import LISTENING, rlserve_command

NODES = ("127.0.0.2", "127.0.0.3")
SMALL_PPO = [
    "--ppo-train-batch-size",
    "1024",
    "--ppo-minibatch-size",
    "256",
    "--ppo-num-epochs",
    "1",
]


@contextlib.contextmanager
def two_nodes() -> Iterator[str]:
    """A two-node Ray cluster on 127.0.0.2 and 127.0.0.3; its address. Killed after."""
    temp_dir = tempfile.mkdtemp(prefix="rlray", dir="/tmp")
    with socket.socket() as sock:
        sock.bind((NODES[0], 0))
        port = sock.getsockname()[1]
    address = f"{NODES[0]}:{port}"
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": os.pathsep.join(sys.path)}
    ray_cli = str(Path(sys.executable).parent / "ray")
    common = ["--num-cpus=1", f"--temp-dir={temp_dir}", "--disable-usage-stats",
              f"--object-store-memory={200 * 1024 * 1024}"]  # fmt: skip
    try:
        subprocess.run(
            [ray_cli, "start", "--head", f"--port={port}", f"--node-ip-address={NODES[0]}",
             "--include-dashboard=false", *common],
            env=env, check=True, capture_output=True, timeout=180,
        )  # fmt: skip
        subprocess.run(
            [ray_cli, "start", f"--address={address}", f"--node-ip-address={NODES[1]}", *common],
            env=env, check=True, capture_output=True, timeout=180,
        )  # fmt: skip
        yield address
    finally:
        for entry in Path("/proc").iterdir():
            with contextlib.suppress(OSError):
                if entry.name.isdigit() and temp_dir.encode() in (entry / "cmdline").read_bytes():
                    os.kill(int(entry.name), signal.SIGKILL)
        shutil.rmtree(temp_dir, ignore_errors=True)


def free_port_on_both() -> int:
    """A port free on both nodes' addresses."""
    while True:
        with socket.socket() as sock:
            sock.bind((NODES[0], 0))
            port = int(sock.getsockname()[1])
        with socket.socket() as other, contextlib.suppress(OSError):
            other.bind((NODES[1], port))
            return port


def metrics(node: str, port: int) -> dict[str, Any]:
    """A front-end's ``/v1/metrics`` (empty when it does not answer)."""
    try:
        with urllib.request.urlopen(f"http://{node}:{port}/v1/metrics", timeout=30) as reply:
            return dict(json.loads(reply.read()))
    except OSError:
        return {}


def play(addresses: list[str], mode: str, counter: Any, stop: Any) -> None:
    """A client process: CartPole as fast as it can until ``stop``, counting its steps."""
    import gymnasium as gym

    from rlserve import PolicyClient
    from rlserve.client.local import LocalConfig
    from rlserve.errors import EpisodeLostError

    # A local client waits when its buffer is full: its steps are what the serving path takes.
    patient = LocalConfig(when_full="block", max_buffered_steps=20_000)
    client = PolicyClient(addresses, inference_mode=mode, update_interval=1.0, local=patient)
    env = gym.make("CartPole-v1")
    episode = 0
    while not stop.is_set():
        obs, _ = env.reset(seed=episode)
        eid = client.start_episode()
        done = False
        steps = 0
        try:
            while not done:
                action = client.get_action(eid, obs)
                obs, reward, terminated, truncated, _ = env.step(action)
                client.log_returns(eid, float(reward))
                steps += 1
                done = terminated or truncated
            client.end_episode(eid, obs)
        except EpisodeLostError:
            pass
        with counter.get_lock():
            counter.value += steps
        episode += 1
    client.close()


def serve(address: str, replicas: int, port: int, run_dir: Path) -> ListeningProcess:
    """``rlserve serve --ray`` with ``replicas`` front-ends, once all of them listen."""
    command = [*rlserve_command(), "serve", "--spaces-from", "CartPole-v1", "--no-progress",
               "--ray", address, "--ray-node-ip", NODES[0], "--replicas", str(replicas),
               "--host", NODES[0], "--port", str(port), "--run-dir", str(run_dir),
               *SMALL_PPO]  # fmt: skip
    server = ListeningProcess(command, LISTENING, "rlserve serve --ray")
    run = Path(server.match["run"])
    deadline = time.monotonic() + 600
    while replicas > 1 and time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            listed = json.loads((run / "endpoints.json").read_text()).get("front_ends", [])
            if len(listed) == replicas and all(e.get("pid") for e in listed):
                break
        time.sleep(0.5)
    return server


def measure(
    replicas: int, mode: str, port: int, clients: int, warmup: float, seconds: float
) -> dict[str, float]:
    """Steps/s of ``clients`` clients on ``replicas`` front-ends, and the ingest (per second)."""
    nodes = NODES[:replicas]
    spawn = mp.get_context("spawn")
    stop = spawn.Event()
    counters = [spawn.Value("q", 0) for _ in range(clients)]
    procs = []
    for i in range(clients):
        own = i % replicas
        addresses = [f"{nodes[(own + k) % replicas]}:{port}" for k in range(replicas)]
        proc = spawn.Process(target=play, args=(addresses, mode, counters[i], stop), daemon=True)
        proc.start()
        procs.append(proc)
    try:
        time.sleep(warmup)

        def snapshot() -> tuple[float, list[int], float, float, float]:
            taken = [c.value for c in counters]
            fronts = [metrics(node, port) for node in nodes]
            logged = sum(float(m.get("samples/steps_logged", 0)) for m in fronts)
            consumed = float(fronts[0].get("learner/steps_consumed", 0))
            trained = float(fronts[0].get("learner/steps_trained", 0))
            return time.monotonic(), taken, logged, consumed, trained

        t0, steps0, logged0, consumed0, trained0 = snapshot()
        time.sleep(seconds)
        t1, steps1, logged1, consumed1, trained1 = snapshot()
    finally:
        stop.set()
        for proc in procs:
            proc.join(60)
            if proc.is_alive():
                proc.kill()
    span = t1 - t0
    per_client = [(b - a) / span for a, b in zip(steps0, steps1, strict=True)]
    per_front = [sum(per_client[i::replicas]) for i in range(replicas)]
    return {
        "steps_s": sum(per_client),
        "per_front_end": min(per_front),
        "logged_s": (logged1 - logged0) / span,
        "consumed_s": (consumed1 - consumed0) / span,
        "trained_s": (trained1 - trained0) / span,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--warmup", type=float, default=10.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--quick", action="store_true", help="2 clients, 5 s warm-up, 8 s")
    args = parser.parse_args()
    if args.quick:
        args.clients, args.warmup, args.seconds = 2, 5.0, 8.0
    print(f"load average at start: {os.getloadavg()[0]:.1f}")
    print(f"{args.clients} clients, {args.warmup:g} s warm-up, {args.seconds:g} s measured:")
    with two_nodes() as address, tempfile.TemporaryDirectory() as runs:
        for replicas in (1, 2):
            port = free_port_on_both()
            server = serve(address, replicas, port, Path(runs) / f"r{replicas}")
            try:
                for mode in ("remote", "local"):
                    got = measure(replicas, mode, port, args.clients, args.warmup, args.seconds)
                    print(
                        f"  {replicas} front-end(s), {mode:6}: {got['steps_s']:8.0f} env "
                        f"steps/s ({got['per_front_end']:6.0f} on the slower front-end); "
                        f"logged {got['logged_s']:7.0f}/s, learner read "
                        f"{got['consumed_s']:7.0f}/s, trained {got['trained_s']:7.0f}/s; "
                        f"load {os.getloadavg()[0]:.1f}"
                    )
            finally:
                server.stop(60)
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
