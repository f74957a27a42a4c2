"""Build rlserve's wheel, install it into a fresh venv without the server extra, and use it.

``make wheel-check`` (part of ``make test``) runs it with the project's .venv, which has ``build``
and the server. It checks what the wheel promises a simulator's machine:

- every file under ``src/rlserve`` (modules, ``py.typed``, any shipped asset) is in the wheel;
- the wheel requires Python >= 3.10 and asks for torch only through the ``server`` extra;
- installed alone it imports without torch, ``rlserve --version`` answers, and a server command
  says which extra to install instead of a traceback;
- its ``PolicyClient`` plays an episode against a real ``rlserve serve`` on 127.0.0.1 (the
  server runs from this interpreter's environment, the client from the wheel's venv).

Everything happens in a temporary folder, removed at the end. Exit status 0 when all holds.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "rlserve"
STARTUP_TIMEOUT = 90.0
"""Seconds the server may take to print its listening line."""

SERVE_FLAGS = (
    "--host",
    "127.0.0.1",
    "--port",
    "0",
    "--http-port",
    "0",
    "--spaces-from",
    "CartPole-v1",
)

PRIVATE_ENV = ("RLSERVE_TOKEN", "RLSERVE_TLS_CA")
"""A developer's own token or CA: neither the server nor the client here uses them."""

LISTENING = re.compile(r"rlserve listening on (?P<host>[^\s:]+):(?P<port>\d+) \(binary\)")

CLIENT_SMOKE = """
import sys
from pathlib import Path

import gymnasium as gym
import rlserve
from rlserve import PolicyClient

assert Path(rlserve.__file__).resolve().is_relative_to(Path(sys.prefix).resolve()), (
    f"rlserve imported from {rlserve.__file__}, not from the wheel's venv {sys.prefix}"
)
env = gym.make("CartPole-v1")
for mode in ("remote", "local"):
    client = PolicyClient(sys.argv[1], inference_mode=mode, timeout=30)
    episode_id = client.start_episode()
    obs, _ = env.reset(seed=0)
    steps, done = 0, False
    while not done and steps < 20:
        obs, reward, terminated, truncated, _ = env.step(client.get_action(episode_id, obs))
        client.log_returns(episode_id, float(reward))
        done, steps = terminated or truncated, steps + 1
    client.end_episode(episode_id, obs)
    client.close()
    print(f"{mode} inference from the wheel: {steps} steps against {sys.argv[1]}")
assert "torch" not in sys.modules, "the client imported torch"
"""


def run(
    command: list[str],
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``command``; on failure, stop with its output so the reader sees why."""
    result = subprocess.run(
        command, capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout, check=False
    )
    if result.returncode != 0:
        raise SystemExit(
            f"wheel check: {' '.join(command)} exited {result.returncode}\n"
            f"{result.stdout}{result.stderr}"
        )
    return result


def expected_files() -> set[str]:
    """Paths, inside the wheel, of every file of the package's source tree."""
    return {
        f"rlserve/{path.relative_to(PACKAGE).as_posix()}"
        for path in PACKAGE.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    }


def check_contents(wheel: Path) -> None:
    """Every source file is inside; the metadata asks for Python >= 3.10 and no torch."""
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        metadata_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = archive.read(metadata_name).decode()
    missing = sorted(expected_files() - names)
    if missing:
        raise SystemExit(
            f"wheel check: {wheel.name} lacks {missing}: add their pattern to "
            "[tool.setuptools.package-data] in pyproject.toml"
        )
    if "Requires-Python: >=3.10" not in metadata:
        raise SystemExit(f"wheel check: {wheel.name} does not say Requires-Python: >=3.10")
    torch_lines = [
        line for line in metadata.splitlines() if line.startswith("Requires-Dist: torch")
    ]
    if not torch_lines or any('extra == "server"' not in line for line in torch_lines):
        raise SystemExit(
            f"wheel check: torch must be required by the server extra only: {torch_lines}"
        )


def start_server(folder: Path) -> tuple[subprocess.Popen[str], str]:
    """``rlserve serve`` for CartPole on 127.0.0.1, port 0; its process and binary address."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    for name in PRIVATE_ENV:
        env.pop(name, None)
    process = subprocess.Popen(
        [sys.executable, "-m", "rlserve.cli", "serve", *SERVE_FLAGS],
        cwd=folder,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert process.stdout is not None
    deadline = time.monotonic() + STARTUP_TIMEOUT
    seen = []
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        seen.append(line)
        match = LISTENING.search(line)
        if match:
            return process, f"{match['host']}:{match['port']}"
    stop(process)
    raise SystemExit("wheel check: the server did not start:\n" + "".join(seen))


def stop(process: subprocess.Popen[str]) -> None:
    """SIGTERM, then SIGKILL if the server is still there after a minute."""
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def check_installed(wheel: Path, folder: Path) -> None:
    """Install the wheel alone into a new venv and use it from outside the source tree."""
    # A PYTHONPATH to the source tree would let pip and Python find rlserve there instead.
    clean_env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", *PRIVATE_ENV}}
    venv = folder / "venv"
    run([sys.executable, "-m", "venv", str(venv)], env=clean_env)
    run([str(venv / "bin" / "pip"), "install", "--quiet", str(wheel)], env=clean_env)
    python, script = str(venv / "bin" / "python"), str(venv / "bin" / "rlserve")
    version = run([script, "--version"], cwd=folder, env=clean_env).stdout.strip()
    print(f"rlserve --version from the wheel: {version}")
    refused = subprocess.run(
        [script, "serve", "--port", "0"], cwd=folder, env=clean_env, capture_output=True, text=True
    )
    if refused.returncode != 2 or "needs the server extra" not in refused.stderr:
        raise SystemExit(
            "wheel check: 'rlserve serve' without the server extra should name the extra to "
            f"install, exit 2; got {refused.returncode}:\n{refused.stderr}"
        )
    process, address = start_server(folder)
    try:
        smoke = run([python, "-c", CLIENT_SMOKE, address], cwd=folder, env=clean_env, timeout=120)
        print(smoke.stdout.strip())
    finally:
        stop(process)


def main() -> int:
    """Build, inspect, install and use the wheel; 0 when everything holds."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="rlserve-wheel-") as tmp:
        folder = Path(tmp)
        # The sdist first, then the wheel from it, as `python -m build` does for a user: no stale
        # build/ folder of the checkout can slip into the wheel.
        run([sys.executable, "-m", "build", "--outdir", str(folder / "dist"), str(ROOT)])
        (wheel,) = (folder / "dist").glob("rlserve-*.whl")
        check_contents(wheel)
        print(f"{wheel.name}: {len(expected_files())} package files inside")
        check_installed(wheel, folder)
    print(f"wheel check: OK in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
