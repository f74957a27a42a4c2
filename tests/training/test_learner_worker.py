"""An idle learner process sleeps on its socket: it wakes once per message, never on a timer.

The learner process is real (spawned as the server spawns it) with an empty experience log; the
test plays the server's end of its socket. Each time the loop goes idle it sends ``waiting``
before it blocks, so the ``waiting`` messages count its wake-ups: a loop that polled would send
one per poll.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from gymnasium import spaces
from learner_support import Learner

from rlserve.config.fields import to_table
from rlserve.learners.ppo import PPOSettings
from rlserve.protocol.codec import decode
from rlserve.protocol.spaces import describe
from rlserve.run.experience_log import ExperienceLog
from rlserve.server.policies import policy_paths
from rlserve.training.learner_worker import IPC_LIMITS

pytestmark = pytest.mark.timeout(120)

IDLE_S = 1.0
"""How long the test leaves the learner alone; a polling loop would wake many times in it."""


class _ServerEnd(Learner):
    """The server's end of a spawned learner's socket, read a message at a time."""

    def __init__(self, run: Path) -> None:
        ppo = PPOSettings(train_batch_size=32, minibatch_size=16, hidden=(8,), device="cpu")
        policy = {
            "policy_id": "default",
            "ppo": to_table(ppo),
            "observation_space": describe(spaces.Box(-1.0, 1.0, (3,), np.float32)),
            "action_space": describe(spaces.Discrete(2)),
            "frozen": False,
            "init_checkpoint": None,
            "checkpoint_dir": str(policy_paths(run, "default", flat=False).checkpoints),
        }
        super().__init__(run, [policy], published={})
        self.sock.settimeout(60.0)

    def read_until(self, kind: str, count: int) -> None:
        """Read until ``count`` messages of ``kind`` have arrived in all."""
        while sum(m["type"] == kind for m in self.messages) < count:
            self.read()

    def read(self) -> bool:
        """Read what the learner sent; False at its end."""
        data = self.sock.recv(1 << 20)
        for body in self.decoder.feed(data):
            message = decode(body, IPC_LIMITS)
            assert message["type"] != "failed", message["message"]
            self.messages.append(message)
        return bool(data)

    def drain(self) -> None:
        """Read everything sent so far (without waiting for more)."""
        self.sock.settimeout(0.0)
        try:
            while self.read():
                pass
        except BlockingIOError:
            pass
        finally:
            self.sock.settimeout(60.0)

    def wakeups(self) -> int:
        return sum(m["type"] == "waiting" for m in self.messages)


def test_an_idle_learner_blocks_until_a_message_comes(tmp_path: Path) -> None:
    log = ExperienceLog(tmp_path / "experience")
    log.open()
    server = _ServerEnd(tmp_path)
    try:
        server.read_until("ready", 1)
        server.read_until("waiting", 1)
        time.sleep(IDLE_S)
        server.drain()
        assert server.wakeups() == 1  # asleep since it said so
        for n in range(2, 5):  # a message with nothing new to read: one wake-up each
            server.send({"type": "available", "through": 0})
            server.read_until("waiting", n)
            time.sleep(IDLE_S / 3)
            server.drain()
            assert server.wakeups() == n
        server.send({"type": "stop"})
        while server.read():
            pass
        server.process.join(60)
        assert server.process.exitcode == 0
        assert server.wakeups() == 4
    finally:
        server.process.kill()
        server.process.join(10)
        server.sock.close()
        log.close()
