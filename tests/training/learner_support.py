"""The server's end of a real learner process, shared by the learner-process tests (not a test
module)."""

from __future__ import annotations

import multiprocessing as mp
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlserve.protocol.codec import decode, encode
from rlserve.protocol.framing import FrameDecoder, frame
from rlserve.training.learner_worker import IPC_LIMITS, run_learner


class Learner:
    """A learner process and the server's end of its socket."""

    def __init__(self, run: Path, policies: list[dict[str, Any]], published: dict[str, int]):
        setup = {
            "policies": policies,
            "run_dir": str(run),
            "checkpoint_every": 1,
            "keep_checkpoints": 2,
            "max_queue_steps": 1_000_000,
            "published_versions": published,
        }
        self.sock, child = socket.socketpair()
        self.process = mp.get_context("spawn").Process(
            target=run_learner, args=(child, setup), daemon=True
        )
        self.process.start()
        child.close()
        self.decoder = FrameDecoder(IPC_LIMITS.max_frame_bytes)
        self.messages: list[dict[str, Any]] = []

    def send(self, message: dict[str, Any]) -> None:
        self.sock.sendall(frame(encode(message)))

    def wait_for(
        self, predicate: Callable[[dict[str, Any]], bool], what: str, timeout: float = 120.0
    ) -> dict[str, Any]:
        """The first message so far, or arriving within ``timeout``, for which ``predicate``."""
        deadline = time.monotonic() + timeout
        seen = 0
        while True:
            for message in self.messages[seen:]:
                if predicate(message):
                    return message
            seen = len(self.messages)
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no {what} in time; got {[m['type'] for m in self.messages]}"
            self.sock.settimeout(remaining)
            data = self.sock.recv(1 << 20)
            assert data, f"the learner exited before {what}: {self.messages[-1:]}"
            for body in self.decoder.feed(data):
                message = decode(body, IPC_LIMITS)
                assert message["type"] != "failed", message["message"]
                self.messages.append(message)

    def of(self, kind: str, policy_id: str) -> list[dict[str, Any]]:
        return [m for m in self.messages if m["type"] == kind and m.get("policy_id") == policy_id]

    def latest_metrics(self, policy_id: str) -> dict[str, float]:
        """A policy's metrics as the server keeps them: each message updates the last."""
        merged: dict[str, float] = {}
        for message in self.messages:
            if message.get("policy_id") == policy_id and "metrics" in message:
                merged.update(message["metrics"])
        return merged

    def kill(self) -> None:
        self.process.kill()
        self.process.join(10)
        self.sock.close()

    def stop(self) -> None:
        self.send({"type": "stop"})
        self.process.join(60)
        self.sock.close()
