"""What a remote step costs the client process alone: its CPU per step, and a cProfile of it.

One ``PolicyClient(..., inference_mode="remote")`` in this process plays fixed episodes of 200
steps against a real ``rlserve serve --spaces-from CartPole-v1`` (the learner idle: episodes are
started with ``training_enabled=False``): ``start_episode``, then per step ``get_action`` and
``log_returns`` (the reward rides along with the next ``get_action``), then ``end_episode``.
The observations are seeded random CartPole-like ``float32`` arrays made before the run, so no
simulator time is counted:

1. without a profiler, this process's CPU time (``time.process_time``: the client's Python and
   its socket system calls) over ``--steps`` steps, ``--repeats`` runs: the honest µs per step;
2. the client's Python alone: the same ``get_action`` + ``log_returns`` steps of one episode
   with the connection's socket swapped, after the welcome, for one that takes every frame and
   hands back the server's reply prepared beforehand (``action`` 0 for the next request id), so
   no system call and no server is counted: the µs per step that are the client's own work;
3. the first loop under ``cProfile``: Python calls per step (exact, unlike its inflated µs) and
   the functions they go to.

Run ``python bench/profile_client_step.py`` (about half a minute on 2 cores). To compare two
trees, run it with ``PYTHONPATH`` set to each one's ``src`` in turn: the script uses only the
public client API.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from _server import start_server

EPISODE_STEPS = 200


def play(address: str, steps: int) -> tuple[int, float]:
    """Play ``steps`` remote steps (whole episodes); return the steps and this process's CPU s."""
    from rlserve import PolicyClient

    rng = np.random.default_rng(0)
    observations = list(rng.uniform(-0.05, 0.05, (EPISODE_STEPS + 1, 4)).astype(np.float32))
    taken = 0
    with PolicyClient(address, inference_mode="remote", timeout=60) as client:
        started = time.process_time()
        while taken < steps:
            eid = client.start_episode(training_enabled=False)
            for obs in observations[:EPISODE_STEPS]:
                client.get_action(eid, obs)
                client.log_returns(eid, 1.0)
            client.end_episode(eid, observations[EPISODE_STEPS], truncated=True)
            taken += EPISODE_STEPS
        return taken, time.process_time() - started


class CannedSocket:
    """Stands in for the client's socket in part 2: replies prepared in advance, no I/O."""

    def __init__(self, first_id: int, count: int) -> None:
        from rlserve.protocol.codec import encode
        from rlserve.protocol.framing import frame

        replies = (frame(encode({"type": "action", "id": i, "action": 0})) for i in range(count))
        self._replies = list(replies)[first_id:]
        self._next = 0

    def sendall(self, data: bytes) -> None:
        """Take the request's frame (and drop it)."""

    def recv(self, size: int) -> bytes:
        """The reply to the next request."""
        reply = self._replies[self._next]
        self._next += 1
        return reply

    def close(self) -> None:
        """Nothing to close."""


def python_only(address: str, steps: int) -> float:
    """µs of this process's CPU per step with the socket swapped for :class:`CannedSocket`."""
    from rlserve import PolicyClient

    rng = np.random.default_rng(0)
    observations = list(rng.uniform(-0.05, 0.05, (EPISODE_STEPS, 4)).astype(np.float32))
    client = PolicyClient(address, inference_mode="remote", timeout=60)
    eid = client.start_episode(training_enabled=False)
    conn = client._conn
    real, conn._sock = conn._sock, CannedSocket(conn._next_id, conn._next_id + steps + 1)
    started = time.process_time()
    for i in range(steps):
        client.get_action(eid, observations[i % EPISODE_STEPS])
        client.log_returns(eid, 1.0)
    cpu = time.process_time() - started
    conn._sock = real
    client.close()
    return cpu / steps * 1e6


def report(profile: cProfile.Profile, steps: int, top: int) -> str:
    """The profile as a table of functions: share of profiled time and calls per step."""
    entries = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    rows = []
    total_time = 0.0
    total_calls = 0
    for (filename, line, name), (_, calls, tottime, _cum, _) in entries.items():
        if name in ("play", "<module>"):
            continue
        total_time += tottime
        total_calls += calls
        where = "~" if filename == "~" else f"{Path(filename).name}:{line}"
        rows.append((tottime, calls, f"{name} ({where})"))
    lines = ["| function | share | calls per step |", "|---|---|---|"]
    for tottime, calls, label in sorted(rows, reverse=True)[:top]:
        lines.append(f"| {label} | {tottime / total_time:.1%} | {calls / steps:.2f} |")
    lines.append("")
    lines.append(f"Python calls per step in the client: {total_calls / steps:.1f}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20_000, help="remote steps per run")
    parser.add_argument("--repeats", type=int, default=3, help="unprofiled runs (median)")
    parser.add_argument("--top", type=int, default=20, help="functions in the table")
    parser.add_argument("--no-profile", action="store_true", help="skip the cProfile run")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rlserve-client-profile-") as tmp:
        server = start_server(["--spaces-from", "CartPole-v1"], Path(tmp))
        try:
            play(server.address, 2 * EPISODE_STEPS)  # warm-up: connections, first weights
            print(f"load average before: {os.getloadavg()[0]:.2f} (1 min)")
            per_step = []
            for _ in range(args.repeats):
                taken, cpu = play(server.address, args.steps)
                per_step.append(cpu / taken * 1e6)
            print(
                f"client CPU per remote step: median {statistics.median(per_step):.1f} µs (runs: "
                + ", ".join(f"{v:.1f}" for v in per_step)
                + f"); load average after: {os.getloadavg()[0]:.2f}"
            )
            alone = [python_only(server.address, args.steps) for _ in range(args.repeats)]
            print(
                "client Python alone per step (no socket): median "
                f"{statistics.median(alone):.2f} µs (runs: "
                + ", ".join(f"{v:.2f}" for v in alone)
                + ")"
            )
            if not args.no_profile:
                profile = cProfile.Profile(time.process_time)  # waiting is not a cost
                taken = args.steps // 4
                profile.enable()
                taken, _ = play(server.address, taken)
                profile.disable()
                print()
                print(report(profile, taken, args.top))
        finally:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
