"""Helpers shared by the end-to-end tests (not a test module)."""

from __future__ import annotations

import json
import socket
import struct
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import msgpack

from rlserve import PolicyClient
from rlserve.protocol.codec import decode, encode

WORKER = Path(__file__).with_name("e2e_client_worker.py")


def small_ppo(
    *extra: str, hidden: tuple[int, ...] = (16,), fragment_length: int = 16
) -> tuple[str, ...]:
    """``rlserve serve`` flags for a PPO that updates every 64 steps with a tiny network.

    End-to-end tests check what crosses the wire, not what is learnt; ``extra`` are more
    ``--ppo-*`` flags.
    """
    return (
        "--ppo-train-batch-size",
        "64",
        "--ppo-minibatch-size",
        "32",
        "--ppo-num-epochs",
        "1",
        "--ppo-hidden",
        *(str(width) for width in hidden),
        *extra,
        "--fragment-length",
        str(fragment_length),
    )


"""A client script run as a separate process (see its docstring)."""


@dataclass
class EpisodeResult:
    episode_id: str
    episode_return: float
    length: int
    terminated: bool
    training_enabled: bool = True


def play_cartpole(
    client: PolicyClient,
    seed: int,
    *,
    training_enabled: bool = True,
    max_steps: int | None = None,
    episode_id: str | None = None,
) -> EpisodeResult:
    """Play one CartPole-v1 episode with actions from the server.

    With ``max_steps`` the episode is cut short after that many steps and ended with
    ``truncated=True`` (unless the pole fell at that very step).
    """
    env = gym.make("CartPole-v1")
    try:
        obs, _ = env.reset(seed=seed)
        eid = client.start_episode(episode_id, training_enabled=training_enabled)
        total, steps = 0.0, 0
        while True:
            action = client.get_action(eid, obs)
            assert env.action_space.contains(action), action
            obs, reward, terminated, truncated, _ = env.step(action)
            client.log_returns(eid, float(reward))
            total += float(reward)
            steps += 1
            cut = max_steps is not None and steps >= max_steps
            if terminated or truncated or cut:
                client.end_episode(eid, obs, truncated=not terminated)
                return EpisodeResult(eid, total, steps, bool(terminated), training_enabled)
    finally:
        env.close()


def run_worker(address: str, *args: str) -> subprocess.Popen[str]:
    """Start :data:`WORKER` as a separate process talking to ``address``."""
    return subprocess.Popen(
        [sys.executable, str(WORKER), address, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def worker_results(process: subprocess.Popen[str], timeout: float = 60.0) -> list[EpisodeResult]:
    out, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, f"worker failed ({process.returncode}):\n{err}"
    return [EpisodeResult(**row) for row in json.loads(out.strip().splitlines()[-1])]


def samples_total(metrics: dict[str, Any]) -> float:
    """Steps ever handed to the learner link: queued + sent + dropped."""
    return (
        metrics["samples/steps_queued"]
        + metrics["samples/steps_sent_to_learner"]
        + metrics["samples/steps_dropped_queue_full"]
    )


# -- raw binary carrier ---------------------------------------------------------------------


class RawSocket:
    """A bare TCP connection speaking frames, for tests that send what a client never would."""

    def __init__(self, address: str, timeout: float = 10.0):
        host, _, port = address.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout)
        self.sock.settimeout(timeout)
        self._buffer = bytearray()
        self.timeout = timeout

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_body(self, body: bytes) -> None:
        self.sock.sendall(struct.pack(">I", len(body)) + body)

    def send(self, message: dict[str, Any]) -> None:
        self.send_body(encode(message))

    def send_packed(self, value: Any) -> None:
        """Send any msgpack value (not necessarily a message) as one frame."""
        self.send_body(msgpack.packb(value, use_bin_type=True))

    def _read_exact(self, n: int, deadline: float) -> bytes | None:
        while len(self._buffer) < n:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no complete frame from the server in time")
            self.sock.settimeout(remaining)
            chunk = self.sock.recv(65536)
            if not chunk:
                return None
            self._buffer += chunk
        data = bytes(self._buffer[:n])
        del self._buffer[:n]
        return data

    def receive(self, timeout: float | None = None) -> dict[str, Any] | None:
        """The next reply, or None when the server closed the connection cleanly.

        Raises:
            TimeoutError: Nothing complete arrived within the timeout (a hang).
        """
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        try:
            header = self._read_exact(4, deadline)
            if header is None:
                return None
            body = self._read_exact(struct.unpack(">I", header)[0], deadline)
        except ConnectionResetError:
            return None
        if body is None:
            raise AssertionError("the server closed the connection in the middle of a frame")
        return decode(body)

    def request(self, message: dict[str, Any]) -> dict[str, Any]:
        self.send(message)
        reply = self.receive()
        assert reply is not None, f"connection closed instead of answering {message}"
        return reply

    def hello(self, token: str | None = None) -> dict[str, Any]:
        reply = self.request({"type": "hello", "id": 0, "protocol_version": 1, "token": token})
        assert reply["type"] == "welcome", reply
        return reply

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawSocket:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


LEARNER_MODULE = "rlserve.training.learner_worker"
"""What the learner process runs (``python -m ...``)."""


def learner_pid(server: Any) -> int:
    """The learner process of ``server`` (its child running the learner module)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if (
            int(stat.rsplit(")", 1)[1].split()[1]) == server.process.pid
            and LEARNER_MODULE in cmdline
        ):
            found.append(int(entry.name))
    assert len(found) == 1, found
    return found[0]
