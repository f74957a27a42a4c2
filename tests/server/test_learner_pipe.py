"""The learner's end of its socket: ordered frames, flushed on close, newest weights only."""

from __future__ import annotations

import socket
import time
from typing import Any

import numpy as np

from rlserve.protocol.codec import decode
from rlserve.protocol.framing import FrameDecoder
from rlserve.training.learner_worker import IPC_LIMITS, LearnerPipe


def read_all(sock: socket.socket) -> list[dict[str, Any]]:
    decoder = FrameDecoder(IPC_LIMITS.max_frame_bytes)
    messages = []
    sock.settimeout(30)
    while True:
        data = sock.recv(1 << 20)
        if not data:
            return messages
        messages.extend(decode(body, IPC_LIMITS) for body in decoder.feed(data))


def test_messages_arrive_in_order_and_close_flushes_them() -> None:
    ours, theirs = socket.socketpair()
    pipe = LearnerPipe(ours)
    for i in range(200):
        pipe.send({"type": "consumed", "through": i})
    pipe.close()
    ours.close()
    assert [m["through"] for m in read_all(theirs)] == list(range(200))


def test_unsent_weights_are_replaced_by_newer_ones() -> None:
    ours, theirs = socket.socketpair()
    pipe = LearnerPipe(ours)
    big = np.zeros(4_000_000, np.float32)  # far over the socket buffer: the writer blocks on it
    pipe.send({"type": "weights", "version": 1, "arrays": big})
    while pipe._outbox:  # the writer has taken it and is blocked sending it
        time.sleep(0.001)
    for version in (2, 3):
        pipe.send({"type": "weights", "version": version})
    pipe.send({"type": "consumed", "through": 7})
    pipe.close(timeout=0.0)
    messages = []
    decoder = FrameDecoder(IPC_LIMITS.max_frame_bytes)
    while len(messages) < 3:
        messages.extend(decode(b, IPC_LIMITS) for b in decoder.feed(theirs.recv(1 << 20)))
    assert [(m["type"], m.get("version")) for m in messages] == [
        ("weights", 1),
        ("weights", 3),
        ("consumed", None),
    ]
