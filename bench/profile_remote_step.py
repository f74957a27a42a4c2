"""Where a remote step's time goes in the serving process: its CPU per step, and a cProfile.

One client process steps CartPole-v1 through ``PolicyClient(..., inference_mode="remote")``
against a real ``rlserve serve`` (binary carrier, learner idle unless ``--training``):

1. without a profiler, the serving process's CPU time (user + system, from ``/proc``; the learner
   is another process and is not counted) over ``--steps`` steps: the honest µs per step;
2. in this process, without a server: the µs of the request's codec work alone (the frame split,
   the msgpack decode, the parse and the observation check of a ``get_action`` as the server runs
   them, and the encode of its ``action`` reply), by ``timeit``: the most that a compiled
   decode-check-encode step could take off the first figure;
3. the same run with the serving process under ``python -m cProfile``: calls per step, and where
   the (profiler-inflated) time goes, by part of the code (rlserve's packages, msgpack, numpy,
   asyncio and the rest of the standard library) and by function.

The profile's absolute µs are inflated by the profiler (every Python call costs it); read its
shares and call counts, and the first figure for the real cost. Run
``python bench/profile_remote_step.py`` (about a minute on 2 cores); ``--training`` lets the
learner train on the steps meanwhile.
"""

from __future__ import annotations

import argparse
import os
import pstats
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

LISTENING = re.compile(r"rlserve listening on (\S+):(\d+)")

STARTUP = "imports (start-up)"
"""Import machinery: the process's start, not a step; left out of the shares."""

_IMPORTING = {
    "<built-in method builtins.compile>",
    "<built-in method marshal.loads>",
    "<built-in method builtins.exec>",
    "<built-in method _imp.create_dynamic>",
    "<built-in method _imp.exec_dynamic>",
}

_TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime + stime


def _start(command: list[str], run_dir: Path) -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=run_dir
    )
    assert process.stdout is not None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        match = LISTENING.search(line)
        if match:
            return process, f"{match.group(1)}:{match.group(2)}"
        if not line and process.poll() is not None:
            break
    process.kill()
    raise RuntimeError("rlserve serve did not start")


def _play(address: str, steps: int, training: bool) -> tuple[int, float, float]:
    """Step CartPole remotely for ``steps`` steps: the steps taken, wall and CPU seconds."""
    import gymnasium as gym

    from rlserve import PolicyClient

    env = gym.make("CartPole-v1")
    taken, episode = 0, 0
    with PolicyClient(address, inference_mode="remote", timeout=60) as client:
        started, cpu = time.perf_counter(), time.process_time()
        while taken < steps:
            eid = client.start_episode(training_enabled=training)
            obs, _ = env.reset(seed=episode)
            episode += 1
            done = False
            while not done:
                action = client.get_action(eid, obs)
                obs, reward, terminated, truncated, _ = env.step(action)
                client.log_returns(eid, float(reward))
                taken += 1
                done = terminated or truncated
            client.end_episode(eid, obs, truncated=truncated and not terminated)
        return taken, time.perf_counter() - started, time.process_time() - cpu


def _env_only_cpu_s(steps: int) -> float:
    """CPU seconds per step of the same CartPole loop without rlserve (to subtract)."""
    import gymnasium as gym

    env = gym.make("CartPole-v1")
    taken, episode = 0, 0
    started = time.process_time()
    while taken < steps:
        env.reset(seed=episode)
        episode += 1
        done = False
        while not done:
            _, _, terminated, truncated, _ = env.step(taken % 2)
            taken += 1
            done = terminated or truncated
    return (time.process_time() - started) / taken


_PROFILED = """
import cProfile, runpy, sys, time
profile = cProfile.Profile(time.process_time)  # CPU time: waiting for a client is not a cost
sys.argv = ["rlserve", *sys.argv[2:]]
profile.enable()
try:
    runpy.run_module("rlserve.cli", run_name="__main__")
except SystemExit:
    pass
finally:
    profile.disable()
    profile.dump_stats(OUT)
"""


def codec_us(repeats: int = 5, number: int = 20_000) -> dict[str, float]:
    """µs per call of each codec stage of a remote step, as the serving process runs them.

    A ``get_action`` frame as ``PolicyClient`` sends it (episode id, float32 CartPole
    observation, ``seq``, reward, ``id``) goes through the frame split, the decode, the parse and
    the observation check; the ``action`` reply through the encode and the frame. Best of
    ``repeats`` ``timeit`` runs of ``number`` calls each (the least disturbed by other work).
    """
    import timeit

    import gymnasium as gym
    import numpy as np

    from rlserve.protocol.codec import decode, encode
    from rlserve.protocol.framing import FrameDecoder, frame
    from rlserve.protocol.limits import DEFAULT_LIMITS
    from rlserve.protocol.messages import parse_request
    from rlserve.protocol.replies import action_reply
    from rlserve.protocol.spaces import check_one

    space = gym.make("CartPole-v1").observation_space
    request = {
        "type": "get_action",
        "episode_id": "3f2b8c1e9a7d4f60b5e2c8a1d9f3e7b4",
        "observation": np.array([0.01, -0.02, 0.03, -0.04], np.float32),
        "seq": 17,
        "reward": 1.0,
        "id": 42,
    }
    wire = frame(encode(request))
    frames = FrameDecoder(DEFAULT_LIMITS.max_frame_bytes)
    body = frames.feed(wire)[0]
    raw = decode(body, DEFAULT_LIMITS)
    parsed = parse_request(raw, DEFAULT_LIMITS)
    observation = parsed.observations[0]  # type: ignore[attr-defined]
    stages = {
        "frame split": lambda: frames.feed(wire),
        "decode": lambda: decode(body, DEFAULT_LIMITS),
        "parse": lambda: parse_request(raw, DEFAULT_LIMITS),
        "observation check": lambda: check_one(space, observation, "observation"),
        "reply encode": lambda: frame(encode(action_reply(42, 1))),
    }
    return {
        name: min(timeit.repeat(call, number=number, repeat=repeats)) / number * 1e6
        for name, call in stages.items()
    }


def _serve_command(run_dir: Path, profile: Path | None) -> list[str]:
    python = [sys.executable]
    if profile is not None:
        python += ["-c", _PROFILED.replace("OUT", repr(str(profile))), "profile"]
    else:
        python += ["-m", "rlserve.cli"]
    return [
        *python,
        "serve",
        "--spaces-from",
        "CartPole-v1",
        "--port",
        "0",
        "--http-port",
        "-1",
        "--run-dir",
        str(run_dir),
        "--no-progress",
        "--log-level",
        "warning",
    ]


def _run(
    run_dir: Path, steps: int, training: bool, profile: Path | None
) -> tuple[int, int, float, float, float]:
    """Serve a warm-up, then ``steps`` steps.

    Returns:
        The warm-up's steps, the measured steps, the serving process's CPU seconds over the
        measured ones, and the client loop's wall and CPU seconds.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    process, address = _start(_serve_command(run_dir, profile), run_dir)
    try:
        warm, _, _ = _play(address, min(2000, steps // 5), training)  # connections, weights
        before = _cpu_s(process.pid)
        taken, wall, client_cpu = _play(address, steps, training)
        cpu = _cpu_s(process.pid) - before
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(60)
    return warm, taken, cpu, wall, client_cpu


def _part(filename: str) -> str:
    path = filename.replace("\\", "/")
    if "/rlserve/" in path:
        return "rlserve." + path.rpartition("/rlserve/")[2].split("/")[0].removesuffix(".py")
    for name in ("msgpack", "numpy", "uvloop", "gymnasium", "torch"):
        if f"/{name}/" in path:
            return name
    if "/asyncio/" in path:
        return "asyncio"
    if filename.startswith("<frozen") or "importlib" in path:
        return STARTUP
    if "/asyncio/runners.py" in path or "/asyncio/base_events.py" in path:
        return "event loop: uvloop's C code, socket I/O"
    if filename.startswith("~") or filename == "":
        return "builtins (C)"
    return "other Python"


def report(profile: Path, steps: int, top: int) -> str:
    """The profile as two tables: by part of the code and by function, per step.

    ``steps``: every step the profiled process served (warm-up included); its start-up (imports,
    module bodies) is left out.
    """
    stats = pstats.Stats(str(profile))
    entries = stats.stats  # type: ignore[attr-defined]
    by_part: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    rows = []
    total = 0.0
    for (filename, line, name), (_, calls, tottime, _cum, _) in entries.items():
        part = _part(filename)
        if part == STARTUP or name == "<module>" or name in _IMPORTING:
            continue
        by_part[part][0] += tottime
        by_part[part][1] += calls
        total += tottime
        rows.append((tottime, calls, f"{part}: {name} ({Path(filename).name}:{line})"))
    lines = ["| part of the code | share of profiled time | calls per step |", "|---|---|---|"]
    for part, (tottime, calls) in sorted(by_part.items(), key=lambda kv: -kv[1][0]):
        lines.append(f"| {part} | {tottime / total:.1%} | {calls / steps:.1f} |")
    lines += ["", "| function | share | calls per step |", "|---|---|---|"]
    for tottime, calls, label in sorted(rows, reverse=True)[:top]:
        lines.append(f"| {label} | {tottime / total:.1%} | {calls / steps:.2f} |")
    calls_total = sum(calls for _, calls, _ in rows)
    lines.append("")
    lines.append(f"Python calls per step in the serving process: {calls_total / steps:.0f}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20_000, help="remote steps per run")
    parser.add_argument("--training", action="store_true", help="the learner trains meanwhile")
    parser.add_argument("--repeats", type=int, default=3, help="unprofiled runs (median)")
    parser.add_argument("--top", type=int, default=25, help="functions in the second table")
    parser.add_argument(
        "--keep-profile", type=Path, help="also copy the serving process's cProfile data here"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rlserve-profile-") as tmp:
        folder = Path(tmp)
        print(f"load average before: {os.getloadavg()[0]:.2f} (1 min; 2 cores here)")
        per_step, clients, rates = [], [], []
        env_cpu = _env_only_cpu_s(args.steps)
        for i in range(args.repeats):
            _, taken, cpu, wall, client_cpu = _run(
                folder / f"plain{i}", args.steps, args.training, None
            )
            per_step.append(cpu / taken * 1e6)
            clients.append((client_cpu / taken - env_cpu) * 1e6)
            rates.append(taken / wall)
        per_step.sort()
        clients.sort()
        rates.sort()
        print(
            f"client CPU per remote step (PolicyClient calls; CartPole's own "
            f"{env_cpu * 1e6:.0f} µs subtracted): median {clients[len(clients) // 2]:.0f} µs; "
            f"steps/s: median {rates[len(rates) // 2]:,.0f}"
        )
        print(
            "serving process CPU per remote step, no profiler: median "
            f"{per_step[len(per_step) // 2]:.0f} µs (runs: "
            + ", ".join(f"{v:.0f}" for v in per_step)
            + f"; learner {'training' if args.training else 'idle'})"
        )
        stages = codec_us()
        print(
            f"of which the codec work of a step, in process (timeit, best of 5): "
            f"{sum(stages.values()):.1f} µs ("
            + ", ".join(f"{name} {us:.1f}" for name, us in stages.items())
            + ")"
        )
        profile = folder / "serve.prof"
        warm, taken, cpu, _, _ = _run(folder / "profiled", args.steps, args.training, profile)
        print(f"under cProfile: {cpu / taken * 1e6:.0f} µs per step (inflated by the profiler)\n")
        if args.keep_profile is not None:
            shutil.copyfile(profile, args.keep_profile)
        print(report(profile, warm + taken, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
