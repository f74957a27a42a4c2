"""Ray env runners against process env runners on one machine: what the cluster costs.

Run: ``PYTHONPATH=src .venv/bin/python bench/ray_runners.py`` (``--quick`` for a short run).
Needs ``pip install 'rlserve[ray]'``.

The script starts a one-node Ray cluster of its own on 127.0.0.2 (its own temp dir, 4 logical
CPUs, a 200 MB object store), connects, and stops it at the end by killing the processes that
name its temp dir. For each env (plain CartPole-v1, and ``SlowCartPole``: CartPole sleeping
1 ms a step, from ``bench/subprocess_envs.py``) it times ``RunnerGroup.sample`` rounds of
``--batch`` steps (a new weights version each round, as in training: broadcast, every runner's
share sampled in parallel, fragments sent back and decoded) with ``--runners`` runners of
``--envs`` copies each, as processes and as Ray actors, alternately in the same run. Figure:
env steps/s of each (median of ``--repeats``) and the Ray/process ratio (target >= 0.9).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rlserve import PPOConfig
from subprocess_envs import SLEEP_S, SlowCartPole

ENVS: dict[str, Any] = {
    "CartPole-v1": "CartPole-v1",
    f"slow ({SLEEP_S * 1e3:g} ms/step)": SlowCartPole,
}
HEAD_IP = "127.0.0.2"


@contextlib.contextmanager
def ray_on_loopback() -> Iterator[Any]:
    """A one-node Ray cluster on 127.0.0.2, connected; stopped (its processes killed) after."""
    import ray

    temp_dir = tempfile.mkdtemp(prefix="rlray", dir="/tmp")
    with socket.socket() as sock:
        sock.bind((HEAD_IP, 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": os.pathsep.join(sys.path)}
    ray_cli = str(Path(sys.executable).parent / "ray")
    try:
        subprocess.run(
            [ray_cli, "start", "--head", f"--port={port}", f"--node-ip-address={HEAD_IP}",
             "--num-cpus=4", "--include-dashboard=false", f"--temp-dir={temp_dir}",
             f"--object-store-memory={200 * 1024 * 1024}", "--disable-usage-stats"],
            env=env, check=True, capture_output=True, timeout=120,
        )  # fmt: skip
        ray.init(address=f"{HEAD_IP}:{port}", _node_ip_address=HEAD_IP, logging_level="ERROR")
        yield ray
    finally:
        with contextlib.suppress(Exception):
            ray.shutdown()
        for entry in Path("/proc").iterdir():
            with contextlib.suppress(OSError):
                if entry.name.isdigit() and temp_dir.encode() in (entry / "cmdline").read_bytes():
                    os.kill(int(entry.name), signal.SIGKILL)
        shutil.rmtree(temp_dir, ignore_errors=True)


def sample_rate(env: Any, backend: str, runners: int, envs: int, batch: int, rounds: int) -> float:
    """Env steps/s of ``RunnerGroup.sample`` rounds, each with a new weights version."""
    config = (
        PPOConfig()
        .environment(env)
        .env_runners(
            num_env_runners=runners,
            num_envs_per_env_runner=envs,
            backend=backend,
            num_cpus_per_env_runner=1,
        )
        .training(train_batch_size=batch, min_env_steps_per_iteration=batch)
        .resources(device="cpu")
        .debugging(seed=0)
    )
    algo = config.build()
    try:
        assert algo.runners is not None
        packages = dict(algo._packages)
        algo.runners.sample(batch, packages)  # warm-up: the first resets
        start = time.perf_counter()
        steps = 0
        for version in range(rounds):
            packages = {
                pid: dataclasses.replace(p, version=p.version + version + 1)
                for pid, p in packages.items()
            }
            steps += algo.runners.sample(batch, packages).env_steps
        return steps / (time.perf_counter() - start)
    finally:
        algo.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--runners", type=int, default=2)
    parser.add_argument("--envs", type=int, default=2, help="env copies per runner")
    parser.add_argument("--batch", type=int, default=1024, help="steps per round")
    parser.add_argument("--quick", action="store_true", help="2 rounds per run, 1 repeat")
    args = parser.parse_args()
    rounds, repeats = (2, 1) if args.quick else (5, args.repeats)
    print(
        f"{args.runners} runners x {args.envs} copies, {args.batch} steps per round, {rounds} "
        f"rounds per run, median of {repeats}:"
    )
    with ray_on_loopback():
        for name, env in ENVS.items():
            rates: dict[str, list[float]] = {"process": [], "ray": []}
            for _ in range(repeats):
                for backend in rates:
                    rates[backend].append(
                        sample_rate(env, backend, args.runners, args.envs, args.batch, rounds)
                    )
            process, ray_rate = (statistics.median(rates[b]) for b in ("process", "ray"))
            print(f"  {name}:")
            print(f"    process runners: {process:10.0f} env steps/s")
            print(f"    Ray runners:     {ray_rate:10.0f} env steps/s")
            print(f"    Ray / process:   {ray_rate / process:10.2f}")


if __name__ == "__main__":
    main()
