"""Recovery after kill -9: how soon a restarted server serves, and its clients are back.

``python bench/recovery.py [--repeats 3]`` trains a CartPole run from one remote-inference client
until the learner has published a few versions, kills the server with SIGKILL, and restarts it
with ``--resume`` on the same port while the client keeps playing (it reconnects by itself). It
prints, as medians over the repeats:

* the time from the kill to the new server's listening line (its start-up and recovery);
* the time from the listening line to the first action served to a *new* client (connect, hello,
  start_episode, get_action): the target is under 1 s, since the server loads its newest weights
  from the run folder instead of waiting for its learner;
* the time from the listening line to the first action the *running* client got after the
  restart (its reconnect back-off included): the target is under 5 s;
* whether the weights version after the restart is at least the one served before the kill.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import gymnasium as gym

from rlserve import PolicyClient
from rlserve.errors import RLServeError

LISTENING = re.compile(r"rlserve listening on \S+:(\d+) \(binary\) and \S+?:(\d+) \(HTTP\)")
SMALL_PPO = [
    "--ppo-train-batch-size",
    "256",
    "--ppo-minibatch-size",
    "128",
    "--ppo-num-epochs",
    "1",
]


def start(args: list[str]) -> tuple[subprocess.Popen[str], int, int, float]:
    """Start ``rlserve serve ARGS``; return the process, its ports and the seconds to listen."""
    command = [sys.executable, "-m", "rlserve.cli", "serve", "--no-progress", *args]
    started = time.perf_counter()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env
    )
    assert process.stdout is not None
    for line in process.stdout:
        match = LISTENING.search(line)
        if match:
            threading.Thread(target=process.stdout.read, daemon=True).start()
            return process, int(match[1]), int(match[2]), time.perf_counter() - started
    raise RuntimeError(f"the server exited ({process.wait()}) before listening")


def weights_version(http_port: int) -> int:
    """The version ``/v1/health`` reports."""
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v1/health", timeout=10) as reply:
        return int(json.load(reply)["weights_version"])


class Player(threading.Thread):
    """A remote-inference client that keeps playing and notes when each action came."""

    def __init__(self, port: int):
        super().__init__(daemon=True)
        self.client = PolicyClient(
            f"127.0.0.1:{port}", inference_mode="remote", timeout=30, reconnect_timeout=60
        )
        self.stop = threading.Event()
        self.last_action = 0.0

    def run(self) -> None:
        """Play episodes until stopped, starting a new one whenever the server lost the last."""
        env = gym.make("CartPole-v1")
        while not self.stop.is_set():
            try:
                obs, _ = env.reset()
                eid = self.client.start_episode()
                done = False
                while not done and not self.stop.is_set():
                    action = self.client.get_action(eid, obs)
                    self.last_action = time.perf_counter()
                    obs, reward, terminated, truncated, _ = env.step(action)
                    self.client.log_returns(eid, float(reward))
                    done = terminated or truncated
                self.client.end_episode(eid, obs, truncated=not done)
            except RLServeError:
                time.sleep(0.01)  # the episode died with the server: start another


def one_run(run_dir: Path, index: int) -> dict[str, float]:
    name = f"recovery{index}"
    process, port, http_port, _ = start(
        [
            "--spaces-from",
            "CartPole-v1",
            "--run-dir",
            str(run_dir),
            "--name",
            name,
            "--port",
            "0",
            "--http-port",
            "0",
            *SMALL_PPO,
        ]
    )
    player = Player(port)
    player.start()
    deadline = time.monotonic() + 120
    while weights_version(http_port) < 3:
        if time.monotonic() > deadline:
            raise RuntimeError("no learner updates within 120 s")
        time.sleep(0.2)
    before = weights_version(http_port)
    process.send_signal(signal.SIGKILL)
    process.wait()
    killed_at = time.perf_counter()
    process, _, http_port, _ = start(
        ["--resume", str(run_dir / name), "--port", str(port), "--http-port", "0"]
    )
    listening = time.perf_counter()
    with PolicyClient(f"127.0.0.1:{port}", inference_mode="remote", timeout=30) as fresh:
        eid = fresh.start_episode()
        fresh.get_action(eid, gym.make("CartPole-v1").reset(seed=0)[0])
    first_new = time.perf_counter() - listening
    while player.last_action < listening:
        if time.perf_counter() - listening > 60:
            raise RuntimeError("the running client did not come back within 60 s")
        time.sleep(0.005)
    back = player.last_action - listening
    after = weights_version(http_port)
    player.stop.set()
    player.join(30)
    player.client.close()
    process.send_signal(signal.SIGTERM)
    process.wait(30)
    return {
        "kill_to_listening_s": listening - killed_at,
        "first_action_new_client_s": first_new,
        "running_client_back_s": back,
        "versions_kept": float(after >= before),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        runs = [one_run(Path(tmp), i) for i in range(args.repeats)]
    print(f"recovery after kill -9 ({args.repeats} runs, medians)")
    targets = {"first_action_new_client_s": 1.0, "running_client_back_s": 5.0}
    for key in runs[0]:
        values = [r[key] for r in runs]
        median = statistics.median(values)
        verdict = ""
        if key in targets:
            verdict = "PASS" if median < targets[key] else "FAIL"
        if key == "versions_kept":
            verdict = "PASS" if min(values) == 1.0 else "FAIL"
        shown = ", ".join(f"{v:.3f}" for v in values)
        print(f"{key:<28}{median:>9.3f}  {verdict:<5} runs: {shown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
