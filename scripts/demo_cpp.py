"""``make demo-cpp``: the C++ CartPole trained to 475 through a real server, remote then local.

For each inference mode it starts ``rlserve serve`` on 127.0.0.1 (port 0) with the settings of
``clients/cpp/examples/cartpole_server.toml`` and a fresh run folder (a policy trained by the
first mode would make the second one trivial), runs ``cartpole_train`` (built from
``clients/cpp/examples/cartpole_train.cpp``) against it until the mean return of its last 100
episodes reaches 475, and stops the server. Exit status 0 when both modes reached the target.

Usage: ``python scripts/demo_cpp.py [--build clients/cpp/build] [--seed 0] [--modes remote local]``
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SERVER_CONFIG = ROOT / "clients" / "cpp" / "examples" / "cartpole_server.toml"
STARTUP_TIMEOUT = 90.0
"""Seconds the server may take to print its listening line."""

LISTENING = re.compile(r"rlserve listening on (?P<host>[^\s:]+):(?P<port>\d+) \(binary\)")

PRIVATE_ENV = ("RLSERVE_TOKEN", "RLSERVE_TLS_CA")
"""A developer's own token or CA: neither the server nor the program here uses them."""


def start_server(run_dir: Path, name: str, seed: int) -> tuple[subprocess.Popen[bytes], str]:
    """``rlserve serve`` with the demo's settings on 127.0.0.1, port 0: its process and address.

    Its output goes to ``run_dir/<name>.log``.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    log = run_dir / f"{name}.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    for key in PRIVATE_ENV:
        env.pop(key, None)
    command = [sys.executable, "-m", "rlserve.cli", "serve", "--config", str(SERVER_CONFIG)]
    command += ["--host", "127.0.0.1", "--port", "0", "--http-port", "-1", "--seed", str(seed)]
    command += ["--run-dir", str(run_dir), "--name", name]
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while time.monotonic() < deadline and process.poll() is None:
        match = LISTENING.search(log.read_text(errors="replace"))
        if match:
            return process, f"{match['host']}:{match['port']}"
        time.sleep(0.1)
    stop(process)
    raise SystemExit(f"demo-cpp: the server did not start (its output: {log}):\n{log.read_text()}")


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM (the server saves its run), then SIGKILL if it is still there after a minute."""
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def main() -> int:
    """Run the demo in each mode; 0 when every mode reached the target."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build", default=str(ROOT / "clients" / "cpp" / "build"))
    parser.add_argument("--run-dir", default="runs", help="Folder for the servers' run folders.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--max-env-steps", type=int, default=300_000)
    parser.add_argument(
        "--modes", nargs="+", choices=("remote", "local"), default=["remote", "local"]
    )
    args = parser.parse_args()
    program = Path(args.build) / "cartpole_train"
    if not program.exists():
        raise SystemExit(f"demo-cpp: {program} is missing; build it with 'make demo-cpp'")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    failed = []
    for mode in args.modes:
        name = f"cartpole-cpp-{mode}-seed{args.seed}-{stamp}"
        process, address = start_server(Path(args.run_dir), name, args.seed)
        print(f"demo-cpp: rlserve serve on {address}, run folder {args.run_dir}/{name}", flush=True)
        command = [str(program), address, "--clients", str(args.clients), "--seed", str(args.seed)]
        command += ["--max-env-steps", str(args.max_env_steps)]
        if mode == "local":
            command.append("--local")
        env = {k: v for k, v in os.environ.items() if k not in PRIVATE_ENV}
        try:
            rc = subprocess.run(command, env=env, check=False).returncode
        finally:
            stop(process)
        if rc != 0:
            failed.append(mode)
    if failed:
        print(f"demo-cpp: the target was not reached in {' and '.join(failed)} mode", flush=True)
        return 1
    print(f"demo-cpp: solved in {' and '.join(args.modes)} mode", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
