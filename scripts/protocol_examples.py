"""Regenerate the worked examples of docs/protocol.md section 12 from a live server.

Run from the repository root::

    .venv/bin/python scripts/protocol_examples.py           # rewrite the doc and the vectors
    .venv/bin/python scripts/protocol_examples.py --check   # compare only; exit 1 with a diff

It starts two real servers (``rlserve serve`` on 127.0.0.1, port 0, seed 0, torch on the CPU, in
a temporary run folder), talks to them with raw sockets and plain HTTP requests, and replaces
every block between ``<!-- generated:KEY -->`` and ``<!-- /generated -->`` in docs/protocol.md
with what was sent and received; the prose around the markers stays as written. It also writes
the test vectors of docs/protocol-vectors/ (see :mod:`protocol_vectors`).

Two values are random on every server start and are normalised before anything is shown: the
``instance_id`` of ``welcome`` and the episode ids the server makes up, each replaced by a fixed
string of the same length (so every msgpack header stays the same). Everything else comes out the
same on every run on one machine: the ids, batch ids and observations are fixed, and the seeded
server samples the same actions from the same initial weights.

Between machines, float32 results differ in their last digits (CPU, BLAS and LAPACK kernels): the
server's initial weights (a float32 QR factorisation, torch's orthogonal initialisation), the
client's logits and log-probability, the forward-pass vectors. So that the doc and the vectors do
not change with the machine that runs this, what was committed is kept where today's numbers
agree with it within tolerance (:class:`Committed`): the weights and the log-probability, which
also travel as bytes, are replaced by the committed values before anything is rendered, and a
generated block or vector file whose only differences are real numbers within
``protocol_vectors.RTOL``/``ATOL`` of the committed ones (:func:`same_within_tolerance`) stays as
committed. ``--check`` then compares exactly.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import http.client
import json
import os
import re
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlserve.policy.model_spec import ModelSpec
from rlserve.policy.numpy_policy import NumpyPolicy
from rlserve.policy.weights import WeightsPackage
from rlserve.protocol.codec import decode, encode, encode_json

sys.path.insert(0, str(Path(__file__).resolve().parent))

import protocol_vectors
from protocol_render import byte_walk, compact_json, hexdump, notation
from protocol_vectors import close, from_tagged, json_text

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "protocol.md"

BINARY_PORT_FIELD = re.compile(r'"binary_port":\d+')
"""The health reply's port field, shown with the default port 9900."""

INSTANCE_PLACEHOLDER = "0123456789abcdef0123456789abcdef"
"""Shown instead of the random ``instance_id`` of each server start."""

EPISODE_PLACEHOLDER = "00000000000000000000000000000001"
"""Shown instead of an episode id the server made up."""

OBS = np.array([0.015625, -0.25, 0.03125, 0.5], dtype=np.float32)
OBS2 = np.array([-0.015625, 0.25, -0.03125, -0.5], dtype=np.float32)
LOCAL_OBS = np.array(
    [
        [0.015625, -0.25, 0.03125, 0.5],
        [0.0234375, -0.0625, 0.0390625, 0.25],
        [0.0234375, -0.25, 0.04296875, 0.5],
    ],
    dtype=np.float32,
)
BATCH_ID = "6d87a8560c3a43bdb590a1d6229f1a64"
CLIENT_ID = "5f0c8e1d2a6b4c3e9d7f1a2b3c4d5e6f"
SERVER_FLAGS = (
    "--spaces-from",
    "CartPole-v1",
    "--port",
    "0",
    "--http-port",
    "0",
    "--no-progress",
    "--seed",
    "0",
    "--ppo-device",
    "cpu",
)
TOKEN_FLAGS = ("--token", "s3cret", "--max-episodes-per-client", "1")
LISTENING = re.compile(
    r"rlserve listening on (\S+):(\d+) \(binary\) and http://(\S+):(\d+) \(HTTP\)"
)
MARKER = re.compile(
    r"(<!-- generated:(?P<key>[\w.-]+) -->)(?P<body>.*?)(<!-- /generated -->)", re.S
)
TIMEOUT = 60.0
PING = "curl -sS -i -X POST http://localhost:9901/v1/ping"
WEIGHTS_RTOL = 1e-5
WEIGHTS_ATOL = 1e-5
"""How far the server's initial weights may be from the committed ones and still be shown as
committed. They come from torch's orthogonal initialisation, a float32 QR factorisation of up to
64 x 64, whose elements differed by up to 1.9e-6 between MKL code paths (``MKL_CBWR=COMPATIBLE``
or ``AVX2``, ``ATEN_CPU_CAPABILITY=default``) on weights of up to 0.66: more than the forward-pass
tolerance allows a value near 0, hence an ``atol`` of 1e-5."""
REAL = re.compile(r"(?<![\w.])-?\d+\.\d+(?:[eE][-+]?\d+)?(?![\w.])")
"""A real number as Python writes one (a decimal point, perhaps an exponent), not inside a word."""


# -- servers ----------------------------------------------------------------------------------


@dataclass
class Server:
    """A running ``rlserve serve`` process."""

    process: subprocess.Popen[str]
    port: int = 0
    http_port: int = 0


@contextlib.contextmanager
def servers(run_dir: Path, *flag_sets: tuple[str, ...]) -> Iterator[list[Server]]:
    """Start one server per flag set (all at once, so their start-ups overlap), stop them after."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env.pop("RLSERVE_TOKEN", None)
    started: list[Server] = []
    try:
        for i, flags in enumerate(flag_sets):
            command = [
                sys.executable,
                "-m",
                "rlserve.cli",
                "serve",
                *SERVER_FLAGS,
                *flags,
                "--run-dir",
                str(run_dir),
                "--name",
                f"doc{i + 1}",
            ]
            process = subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
            )
            started.append(Server(process))
        deadline = time.monotonic() + TIMEOUT
        for server in started:
            assert server.process.stdout is not None
            seen = []
            while time.monotonic() < deadline:
                line = server.process.stdout.readline()
                if not line:
                    raise RuntimeError("the server exited before listening:\n" + "".join(seen))
                seen.append(line)
                match = LISTENING.search(line)
                if match:
                    server.port, server.http_port = int(match[2]), int(match[4])
                    break
            else:
                raise RuntimeError("the server did not listen in time:\n" + "".join(seen))
        for server in started:
            wait_for_weights(server, deadline)
        yield started
    finally:
        for server in started:
            with contextlib.suppress(ProcessLookupError):
                server.process.terminate()
        for server in started:
            try:
                server.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.process.kill()
                server.process.wait()
            if server.process.stdout is not None:
                server.process.stdout.close()


def wait_for_weights(server: Server, deadline: float) -> None:
    """Wait until the server's learner has published its first weights (the examples show them)."""
    while time.monotonic() < deadline:
        conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=TIMEOUT)
        try:
            conn.request("GET", "/v1/health", headers={"Host": "localhost"})
            if json.loads(conn.getresponse().read()).get("weights_version", -1) >= 0:
                return
        finally:
            conn.close()
        time.sleep(0.1)
    raise RuntimeError("the server published no weights in time")


# -- normalisation of random values -----------------------------------------------------------


def same_within_tolerance(old: str, new: str) -> bool:
    """Whether ``new`` is ``old`` but for real numbers within the forward-pass tolerance.

    Everything else (text, integers, hex bytes) must be the same.
    """
    if REAL.split(old) != REAL.split(new):
        return False
    return close([float(v) for v in REAL.findall(new)], [float(v) for v in REAL.findall(old)])


@dataclass
class Committed:
    """The committed float values that stand for today's where they agree within tolerance.

    Read from docs/protocol-vectors/messages.json: the first server's initial weights (the
    ``weights`` vector) and the log-probability the client reports (``report_samples``).
    """

    weights: dict[str, np.ndarray] = field(default_factory=dict)
    logp: np.float32 | None = None

    @classmethod
    def load(cls, path: Path = protocol_vectors.FOLDER / "messages.json") -> Committed:
        """The committed values (none when the file is missing)."""
        if not path.exists():
            return cls()
        vectors = {v["name"]: v["value"] for v in json.loads(path.read_text())["vectors"]}
        out = cls()
        if "weights" in vectors:
            out.weights = from_tagged(vectors["weights"])["arrays"]
        if "report_samples" in vectors:
            report = from_tagged(vectors["report_samples"])
            out.logp = np.float32(report["fragments"][0]["behaviour_logp"][0])
        return out

    def arrays(self, live: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The committed weights if every array of ``live`` is within tolerance of them."""
        old = self.weights
        if old.keys() == live.keys() and all(
            old[k].dtype == live[k].dtype
            and old[k].shape == live[k].shape
            and close(live[k], old[k], WEIGHTS_RTOL, WEIGHTS_ATOL)
            for k in live
        ):
            return old
        return live

    def log_probability(self, live: np.float32) -> np.float32:
        """The committed log-probability if ``live`` is within the forward-pass tolerance."""
        return self.logp if self.logp is not None and close(live, self.logp) else live


@dataclass
class Normaliser:
    """Replaces what differs between runs and machines before anything is shown.

    Random strings the servers send become fixed ones of the same length; weights that differ
    from the committed ones in their last digits only become the committed ones.
    """

    pairs: dict[str, str] = field(default_factory=dict)
    committed: Committed = field(default_factory=Committed)

    def learn(self, reply: dict[str, Any], request: dict[str, Any] | None = None) -> None:
        """Note the random values ``reply`` introduces."""
        if reply.get("type") == "welcome":
            self.pairs[reply["instance_id"]] = INSTANCE_PLACEHOLDER
        if (
            reply.get("type") == "episode_started"
            and request is not None
            and not request.get("episode_id")
        ):
            self.pairs[reply["episode_id"]] = EPISODE_PLACEHOLDER

    def bytes(self, data: bytes) -> bytes:
        """``data`` with every known random string replaced."""
        for old, new in self.pairs.items():
            data = data.replace(old.encode(), new.encode())
        return data

    def weights(self, reply: dict[str, Any]) -> dict[str, Any]:
        """``reply`` with the committed weights when it is a ``weights`` reply within tolerance."""
        if reply.get("type") != "weights" or "arrays" not in reply:
            return reply
        arrays = self.committed.arrays(reply["arrays"])
        return reply if arrays is reply["arrays"] else {**reply, "arrays": arrays}

    def weights_json(self, text: str) -> str:
        """An HTTP ``weights`` reply's JSON with the committed weights, as :meth:`weights` does.

        Only when the server's JSON is what :func:`encode_json` writes for the decoded reply, so
        that the replaced text is what the server would have sent for those weights.
        """
        reply = json.loads(text)
        if not isinstance(reply, dict) or not isinstance(reply.get("arrays"), dict):
            return text
        reply["arrays"] = {k: np.array(v, np.float32) for k, v in reply["arrays"].items()}
        if encode_json(reply).decode() != text:
            return text
        return encode_json(self.weights(reply)).decode()


# -- the binary carrier -----------------------------------------------------------------------


@dataclass
class Exchange:
    """One request and its reply as they travelled (frames include the length prefix)."""

    request: dict[str, Any] | None
    request_frame: bytes
    reply: dict[str, Any] | None
    reply_frame: bytes


def framed(message: dict[str, Any]) -> bytes:
    """The frame the reference encoder writes for ``message``."""
    body = encode(message)
    return struct.pack(">I", len(body)) + body


class Conn:
    """A raw TCP connection that records every frame."""

    def __init__(self, port: int, norm: Normaliser, log: list[Exchange]):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = b""
        self.norm = norm
        self.log = log

    def close(self) -> None:
        """Close the socket."""
        self.sock.close()

    def send_raw(self, data: bytes) -> None:
        """Write bytes as they are."""
        self.sock.sendall(data)

    def receive(self, request: dict[str, Any] | None = None) -> tuple[dict[str, Any] | None, bytes]:
        """The next reply (to ``request``) and its frame, normalised; ``(None, b"")`` at the end."""
        while True:
            if len(self.buffer) >= 4:
                (length,) = struct.unpack_from(">I", self.buffer)
                if len(self.buffer) >= 4 + length:
                    data, self.buffer = self.buffer[: 4 + length], self.buffer[4 + length :]
                    reply = decode(data[4:])
                    self.norm.learn(reply, request)
                    data = self.norm.bytes(data)
                    reply = decode(data[4:])
                    shown = self.norm.weights(reply)
                    if shown is not reply and encode(reply) == data[4:]:
                        reply, data = shown, framed(shown)
                    return reply, data
            chunk = self.sock.recv(65536)
            if not chunk:
                return None, b""
            self.buffer += chunk

    def call(self, message: dict[str, Any]) -> Exchange:
        """Send one request and read its reply."""
        return self.pipeline([message])[0]

    def pipeline(self, messages: list[dict[str, Any]]) -> list[Exchange]:
        """Write all requests in one ``send``, then read one reply per request."""
        frames = [framed(m) for m in messages]
        self.sock.sendall(b"".join(frames))
        out = []
        for message, frame_bytes in zip(messages, frames, strict=True):
            reply, reply_frame = self.receive(message)
            out.append(Exchange(message, frame_bytes, reply, reply_frame))
        self.log.extend(out)
        return out


def fence(text: str, lang: str = "") -> str:
    """``text`` as a fenced code block."""
    return f"```{lang}\n{text}\n```"


def code(value: Any, **kw: Any) -> str:
    """Inline code of a value's notation."""
    return f"`{notation(value, **kw)}`"


def transcript(*exchanges: Exchange, full: bool = False) -> str:
    """``request:``/``reply:`` lines in notation, a blank line between pairs."""
    blocks = []
    for ex in exchanges:
        blocks.append(f"request: {notation(ex.request)}\nreply:   {notation(ex.reply)}")
        if full:
            blocks[-1] += "\n" + hexdump(ex.reply_frame)
    return fence("\n\n".join(blocks))


# -- section 12.1 -----------------------------------------------------------------------------


def binary_examples(
    main: Server, token: Server, norm: Normaliser, log: list[Exchange]
) -> tuple[dict[str, str], dict[str, Any]]:
    """Run the sessions of 12.1 and return the generated blocks (and facts for 12.2)."""
    g: dict[str, str] = {}
    c = Conn(main.port, norm, log)

    # 12.1.1
    hello = c.call(
        {
            "type": "hello",
            "id": 1,
            "protocol_version": 1,
            "client_name": "doc-example",
            "inference_mode": "remote",
        }
    )
    g["12.1.1-request"] = (
        f"Request {code(hello.request)} ({len(hello.request_frame)} bytes):\n\n"
        + fence(hexdump(hello.request_frame))
    )
    g["12.1.1-reply"] = (
        f"Reply (`welcome`, {len(hello.reply_frame)} bytes; "
        "the middle of the dump is left out):\n\n"
        + fence(hexdump(hello.reply_frame, head=10, tail=2))
        + "\n\nDecoded, the reply is:\n\n"
        + fence(notation(hello.reply))
    )
    welcome_frame = hello.reply_frame
    low = welcome_frame.find(b"\xa3low")
    last_int = welcome_frame.rfind(b"\xce")
    limit_bytes = welcome_frame[last_int : last_int + 5]
    g["12.1.1-offsets"] = (
        f"In the dump, the key `low` (`a3 6c 6f 77`) starts at offset {low:#x} and is followed by "
        f"`{welcome_frame[low + 4]:02x}`\n(array of 4 items), "
        f"`{welcome_frame[low + 5 : low + 14].hex(' ')}` (`float 64` "
        f"{struct.unpack('>d', welcome_frame[low + 6 : low + 14])[0]!r}, big-endian as\nalways "
        f"in msgpack) and `c0` at {low + 14:#x} (nil: unbounded), and so on. The limits at the "
        f"end use the\nshortest integer formats, e.g. `{limit_bytes.hex(' ')}` "
        f"(from {last_int:#x}) is `uint 32` {int.from_bytes(limit_bytes[1:], 'big')}."
    )

    # 12.1.2
    start = c.call(
        {"type": "start_episode", "id": 2, "episode_id": "ep-1", "training_enabled": True}
    )
    anon = c.call({"type": "start_episode", "id": 9})
    g["12.1.2"] = (
        f"Request {code(start.request)}:\n\n{fence(hexdump(start.request_frame))}\n\n"
        f"Reply {code(start.reply)}:\n\n{fence(hexdump(start.reply_frame))}\n\n"
        f"With no `episode_id`, the server assigns one. Request {code(anon.request)}:\n\n"
        f"{fence(hexdump(anon.request_frame))}\n\n"
        f"Reply {code(anon.reply)} (the 32-character id is a `str 8`, `d9 20`; here, as everywhere "
        f"in this section, a made-up id is shown as `{EPISODE_PLACEHOLDER}`):\n\n"
        f"{fence(hexdump(anon.reply_frame))}"
    )

    # 12.1.3
    step1 = c.call({"type": "get_action", "id": 3, "episode_id": "ep-1", "observation": OBS})
    g["12.1.3-request"] = (
        f"Request\n{code(step1.request)}\n({len(step1.request_frame)} bytes):\n\n"
        + fence(hexdump(step1.request_frame))
    )
    g["12.1.3-walk"] = fence(byte_walk(step1.request_frame))
    g["12.1.3-reply"] = (
        f"Reply {code(step1.reply)}\n({len(step1.reply_frame)} bytes):\n\n"
        f"{fence(hexdump(step1.reply_frame))}\n\n{fence(byte_walk(step1.reply_frame))}"
    )

    # 12.1.4
    step2 = c.call(
        {"type": "get_action", "id": 4, "episode_id": "ep-1", "observation": OBS, "reward": 1.0}
    )
    g["12.1.4-request"] = f"Request {code(step2.request)}:\n\n" + fence(
        hexdump(step2.request_frame)
    )
    g["12.1.4-walk"] = fence(byte_walk(step2.request_frame))
    g["12.1.4-reply"] = f"Reply {code(step2.reply)}:\n\n" + fence(hexdump(step2.reply_frame))

    def pair(ex: Exchange, request_note: str = "") -> str:
        return (
            f"Request {code(ex.request)}{request_note}:\n\n{fence(hexdump(ex.request_frame))}\n\n"
            f"Reply {code(ex.reply)}:\n\n{fence(hexdump(ex.reply_frame))}"
        )

    # 12.1.5 - 12.1.8
    g["12.1.5"] = pair(
        c.call({"type": "log_returns", "id": 5, "episode_id": "ep-1", "reward": 0.5}),
        " (adds 0.5 to the reward of the action just received)",
    )
    logged = c.call(
        {
            "type": "log_action",
            "id": 6,
            "episode_id": "ep-1",
            "observation": OBS,
            "action": 1,
            "reward": 0.5,
        }
    )
    g["12.1.6-request"] = f"Request {code(logged.request)}."
    g["12.1.6"] = (
        f"{fence(hexdump(logged.request_frame))}\n\n"
        f"Reply {code(logged.reply)}:\n\n{fence(hexdump(logged.reply_frame))}"
    )
    g["12.1.7"] = pair(
        c.call(
            {
                "type": "end_episode",
                "id": 7,
                "episode_id": "ep-1",
                "observation": OBS,
                "truncated": False,
                "reward": 1.0,
            }
        ),
        " (`truncated` is `c2`, false: the episode terminated)",
    )
    ping = c.call({"type": "ping", "id": 8})
    g["12.1.8"] = (
        f"Request {code(ping.request)}:\n\n{fence(hexdump(ping.request_frame))}\n\n"
        f"{fence(byte_walk(ping.request_frame))}\n\n"
        f"Reply {code(ping.reply)}:\n\n{fence(hexdump(ping.reply_frame))}"
    )

    # 12.1.9
    c.pipeline(
        [
            {"type": "start_episode", "id": 10, "episode_id": "ep-2"},
            {"type": "start_episode", "id": 11, "episode_id": "ep-3"},
        ]
    )
    both = np.stack([OBS, OBS2])
    batch = c.call(
        {
            "type": "get_action",
            "id": 12,
            "episode_ids": ["ep-2", "ep-3"],
            "observations": both,
            "rewards": [0.0, 0.0],
        }
    )
    g["12.1.9"] = (
        f"Request\n{code(batch.request)}:\n\n{fence(hexdump(batch.request_frame))}\n\n"
        f"{fence(byte_walk(batch.request_frame))}\n\n"
        f"Reply {code(batch.reply)} — the actions come back as an int64 ndarray, in\n"
        f"the order of `episode_ids`:\n\n{fence(hexdump(batch.reply_frame))}\n\n"
        f"{fence(byte_walk(batch.reply_frame))}"
    )

    # 12.1.10
    piped = c.pipeline(
        [
            {
                "type": "get_action",
                "id": 13,
                "episode_ids": ["ep-2", "ep-3"],
                "observations": both,
                "rewards": [1.0, 1.0],
            },
            {
                "type": "end_episode",
                "id": 14,
                "episode_id": "ep-2",
                "observation": OBS,
                "truncated": True,
                "reward": 1.0,
            },
            {
                "type": "end_episode",
                "id": 15,
                "episode_id": "ep-3",
                "observation": OBS,
                "reward": 1.0,
            },
        ]
    )
    g["12.1.10"] = (
        "\n\n".join(f"{code(ex.request)}\n\n{fence(hexdump(ex.request_frame))}" for ex in piped)
        + "\n\nReplies, in this order:\n\n"
        + "\n\n".join(f"{code(ex.reply)}\n\n{fence(hexdump(ex.reply_frame))}" for ex in piped)
    )

    # 12.1.11
    early = c.pipeline(
        [
            {"type": "start_episode", "id": 16, "episode_id": "ep-4"},
            {
                "type": "get_action",
                "id": 17,
                "episode_id": "ep-4",
                "observation": OBS,
                "reward": 1.0,
            },
        ]
    )[1]
    g["12.1.11-early"] = transcript(early) + "\n\n" + fence(hexdump(early.reply_frame))
    g["12.1.11-episodes"] = transcript(
        c.call({"type": "start_episode", "id": 18, "episode_id": "ep-1"}),
        c.call({"type": "get_action", "id": 19, "episode_id": "ep-1", "observation": OBS}),
        c.call({"type": "get_action", "id": 20, "episode_id": "nope", "observation": OBS}),
    )
    g["12.1.11-values"] = transcript(
        c.call(
            {
                "type": "get_action",
                "id": 21,
                "episode_id": "ep-4",
                "observation": np.zeros(3, np.float32),
            }
        ),
        c.call(
            {
                "type": "get_action",
                "id": 22,
                "episode_id": "ep-4",
                "observation": np.array([9.0, 0, 0, 0], np.float32),
            }
        ),
        c.call(
            {"type": "log_action", "id": 23, "episode_id": "ep-4", "observation": OBS, "action": 2}
        ),
    )
    malformed = [
        c.call({"type": "jump", "id": 24}),
        c.call({"type": "log_returns", "id": 25, "episode_id": "ep-4"}),
        c.call({"type": "start_episode", "id": 26, "episode_id": "x" * 129}),
    ]
    text = transcript(*malformed)
    g["12.1.11-malformed"] = text.replace('x"}', 'x"}  (episode_id of 129 "x")', 1)
    not_msgpack = b"\x00\x00\x00\x01\xc1"
    c.send_raw(not_msgpack)
    bad_reply, bad_frame = c.receive()
    log.append(Exchange(None, not_msgpack, bad_reply, bad_frame))
    g["12.1.11-raw"] = fence(
        f"REQUEST raw\n{hexdump(not_msgpack)}\nREPLY {notation(bad_reply)}\n{hexdump(bad_frame)}"
    )
    ext2 = encode({"type": "get_action", "id": 27, "episode_id": "ep-4", "observation": 0})
    ext2 = ext2[:-1] + b"\xd4\x02\x00"
    c.send_raw(struct.pack(">I", len(ext2)) + ext2)
    ext_reply, _ = c.receive()
    g["12.1.11-ext"] = fence(
        f"REQUEST raw\n{hexdump(struct.pack('>I', len(ext2)) + ext2)}\nREPLY {notation(ext_reply)}"
    )
    last = c.call({"type": "ping", "id": 28})
    g["12.1.11-ping"] = f"{code(last.request)} →\n{code(last.reply)}"
    c.close()

    # 12.1.12
    fresh = Conn(main.port, norm, log)
    before = fresh.call({"type": "ping", "id": 1})
    fresh.call({"type": "hello", "id": 2, "protocol_version": 1})
    fresh.close()
    g["12.1.12-before"] = transcript(before) + "\n\n" + fence(hexdump(before.reply_frame))
    fresh = Conn(main.port, norm, log)
    wrong = fresh.call(
        {"type": "hello", "id": 1, "protocol_version": 2, "client_name": "doc-example"}
    )
    closed, _ = fresh.receive()
    fresh.close()
    g["12.1.12-version"] = (
        (
            transcript(wrong)
            + "\n\nThe request's bytes, then the reply's:\n\n"
            + fence(hexdump(wrong.request_frame))
            + "\n\n"
            + fence(hexdump(wrong.reply_frame))
        )
        if closed is None
        else "the server did not close the connection"
    )
    fresh = Conn(main.port, norm, log)
    mode = fresh.call(
        {"type": "hello", "id": 1, "protocol_version": 1, "inference_mode": "onboard"}
    )
    fresh.close()
    g["12.1.12-mode"] = transcript(mode)
    fresh = Conn(main.port, norm, log)
    fresh.send_raw(b"\x01\x00\x00\x01")
    big_reply, big_frame = fresh.receive()
    after, _ = fresh.receive()
    fresh.close()
    g["12.1.12-frame"] = fence(
        f"REQUEST header only 01 00 00 01\nREPLY {notation(big_reply)}\n{hexdump(big_frame)}\n"
        f"after frame_too_large: {'end of stream' if after is None else notation(after)}"
    )

    # 12.1.13
    lines: list[str] = []

    def req(conn: Conn, message: dict[str, Any], dump: bool = False) -> None:
        ex = conn.call(message)
        lines.append(f"REQ {notation(message)}")
        if dump:
            lines.append(hexdump(ex.request_frame))
        reply = ex.reply
        if reply is not None and reply.get("type") == "welcome":
            lines.append(f'REP {{"type": "welcome", "id": {reply["id"]}, …}}')
        else:
            lines.append(f"REP {notation(reply)}")

    def closed_after(conn: Conn) -> None:
        reply, _ = conn.receive()
        lines.append("closed? " + ("yes (end of stream)" if reply is None else notation(reply)))
        conn.close()

    a = Conn(token.port, norm, log)
    req(a, {"type": "hello", "id": 1, "protocol_version": 1, "token": "s3cret"}, dump=True)
    req(a, {"type": "start_episode", "id": 2, "episode_id": "b-1"})
    req(a, {"type": "start_episode", "id": 3, "episode_id": "b-2"})
    for bad in ({"token": "wrong"}, {}):
        x = Conn(token.port, norm, log)
        req(x, {"type": "hello", "id": 1, "protocol_version": 1, **bad})
        closed_after(x)
    b = Conn(token.port, norm, log)
    req(b, {"type": "hello", "id": 1, "protocol_version": 1, "token": "s3cret"})
    req(b, {"type": "start_episode", "id": 2, "episode_id": "b-3"})
    lines.append("-- B acts in A's episode b-1")
    req(b, {"type": "get_action", "id": 3, "episode_id": "b-1", "observation": OBS.tolist()})
    req(b, {"type": "start_episode", "id": 4, "episode_id": "b-4"})
    lines.append("-- C and D: two connections of one client identity share its limit")
    c2 = Conn(token.port, norm, log)
    req(
        c2,
        {
            "type": "hello",
            "id": 1,
            "protocol_version": 1,
            "token": "s3cret",
            "client_id": CLIENT_ID,
        },
    )
    req(c2, {"type": "start_episode", "id": 2, "episode_id": "b-5"})
    d = Conn(token.port, norm, log)
    req(
        d,
        {
            "type": "hello",
            "id": 1,
            "protocol_version": 1,
            "token": "s3cret",
            "client_id": CLIENT_ID,
        },
    )
    req(d, {"type": "start_episode", "id": 2, "episode_id": "b-6"})
    req(d, {"type": "end_episode", "id": 3, "episode_id": "b-5", "observation": OBS.tolist()})
    req(d, {"type": "start_episode", "id": 4, "episode_id": "b-6"})
    lines.append("-- second hello with wrong token on authenticated connection")
    req(d, {"type": "hello", "id": 5, "protocol_version": 1, "token": "bad"})
    closed_after(d)
    for conn in (a, b, c2):
        conn.close()
    g["12.1.13"] = fence("\n".join(lines))

    facts = local_binary_examples(main, norm, log, g)
    return g, facts


def local_binary_examples(
    main: Server, norm: Normaliser, log: list[Exchange], g: dict[str, str]
) -> dict[str, Any]:
    """12.1.14-12.1.16: weights, a report byte by byte, a re-sent and refused reports."""
    c = Conn(main.port, norm, log)
    hello = c.call(
        {
            "type": "hello",
            "id": 1,
            "protocol_version": 1,
            "client_name": "doc-local",
            "inference_mode": "local",
        }
    )
    walk = byte_walk(hello.request_frame).splitlines()
    mode_at = next(i for i, line in enumerate(walk) if '"inference_mode"' in line) - 1
    g["12.1.14-hello"] = (
        f"Request {code(hello.request)} ({len(hello.request_frame)} bytes):\n\n"
        + fence(hexdump(hello.request_frame))
        + "\n\nIt differs from the `hello` of 12.1.1 in `client_name` and in the value of "
        "`inference_mode`:\n\n"
        + fence("\n".join(walk[mode_at:]))
        + f"\n\nThe reply is the same `welcome` as in 12.1.1 ({len(hello.reply_frame)} bytes; "
        '`inference_modes` is\n`["remote", "local"]`).'
    )
    weights = c.call({"type": "get_weights", "id": 2, "policy_id": "default"})
    assert weights.reply is not None
    g["12.1.14-weights"] = (
        f"Request {code(weights.request)} ({len(weights.request_frame)} bytes):\n\n"
        + fence(hexdump(weights.request_frame))
        + f"\n\nReply ({len(weights.reply_frame)} bytes), decoded; `…` stands for array elements "
        "left out here:\n\n"
        + fence(notation(weights.reply, elide_over=16))
        + "\n\nThe start of the reply, and its end:\n\n"
        + fence(hexdump(weights.reply_frame, head=12, tail=1))
    )
    g["12.1.14-walk"] = fence(byte_walk(weights.reply_frame, keep_elements=2))
    again = c.call({"type": "get_weights", "id": 3, "policy_id": "default", "have_version": 0})
    g["12.1.14-again"] = (
        f"Request\n{code(again.request)}:\n\n{fence(hexdump(again.request_frame))}\n\n"
        f"Reply {code(again.reply)} ({len(again.reply_frame)} bytes, no `model`, no `arrays`):\n\n"
        f"{fence(hexdump(again.reply_frame))}\n\n{fence(byte_walk(again.reply_frame))}"
    )

    # The client's own first action, as section 14.4 computes it.
    spec = ModelSpec.from_wire(weights.reply["model"])
    policy = NumpyPolicy(spec, weights.reply["arrays"], weights.reply["version"], seed=0)
    logits = policy.forward(OBS[None, :])[0]
    probs = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    chosen = policy.compute_actions(OBS[None, :])
    action, logp = int(chosen.actions[0]), np.float32(chosen.logp[0])
    logp = norm.committed.log_probability(logp)  # the same to the forward-pass tolerance
    g["12.1.15-forward"] = (
        f"For the observation `{notation(OBS.tolist())}` the forward pass gave the logits\n"
        f"`{notation([float(v) for v in logits])}`, i.e. the probabilities "
        f"`{notation([float(v) for v in probs])}`; the sampled choice was\n`{action}` and its "
        f"log-probability `{float(logp)!r}` (as float32: bytes `{logp.tobytes().hex(' ')}`)."
    )
    fragment = {
        "episode_id": "loc-1",
        "obs": LOCAL_OBS,
        "actions": np.array([action, 0], np.int64),
        "rewards": np.array([1.0, 1.0], np.float32),
        "behaviour_logp": np.array([logp, np.nan], np.float32),
        "policy_chosen": np.array([True, False]),
        "weights_version": np.array([0, 0], np.int64),
        "terminated": True,
        "truncated": False,
    }
    summary = {"episode_id": "loc-1", "return": 2.0, "length": 2, "reason": "terminated"}
    report = c.call(
        {
            "type": "report_samples",
            "id": 4,
            "batch_id": BATCH_ID,
            "policy_id": "default",
            "fragments": [fragment],
            "episodes": [summary],
        }
    )
    g["12.1.15-request"] = (
        f"Request\n{code(report.request)} ({len(report.request_frame)} bytes):\n\n"
        + fence(hexdump(report.request_frame))
    )
    g["12.1.15-walk"] = fence(byte_walk(report.request_frame))
    g["12.1.15-reply"] = (
        f"{code(report.reply)} ({len(report.reply_frame)} bytes):\n\n"
        f"{fence(hexdump(report.reply_frame))}\n\n{fence(byte_walk(report.reply_frame))}"
    )

    resent = c.call({**report.request, "id": 5})  # type: ignore[dict-item]
    g["12.1.16-resent"] = f"Reply\n{code(resent.reply)} ({len(resent.reply_frame)} bytes"
    g["12.1.16-resent-dump"] = fence(hexdump(resent.reply_frame))
    unpublished = {**fragment, "weights_version": np.array([0, 7], np.int64)}
    refused = c.call(
        {
            "type": "report_samples",
            "id": 6,
            "batch_id": "9c684e1d99e644fa8464b58fdc33764f",
            "policy_id": "default",
            "fragments": [unpublished],
        }
    )
    g["12.1.16-refused"] = transcript(refused) + "\n\n" + fence(hexdump(refused.reply_frame))
    cases = [
        (
            "behaviour_logp [NaN, NaN]: NaN for a step the policy chose",
            {"behaviour_logp": np.array([np.nan, np.nan], np.float32)},
        ),
        (
            "actions [2, 0]: 2 is not a choice index of Discrete(2)",
            {"actions": np.array([2, 0], np.int64)},
        ),
        (
            "obs with only 2 rows for 2 steps (the observation after the last action is missing)",
            {"obs": LOCAL_OBS[:2]},
        ),
        ("terminated and truncated both true", {"truncated": True}),
    ]
    out = []
    for i, (note, change) in enumerate(cases, start=1):
        ex = c.call(
            {
                "type": "report_samples",
                "id": 6 + i,
                "batch_id": f"doc-err-{i}",
                "fragments": [{**fragment, **change}],
            }
        )
        out.append(f"# {note}\nreply:   {notation(ex.reply)}")
    empty = c.call({"type": "report_samples", "id": 11, "batch_id": "doc-err-5", "fragments": []})
    out.append(f"# fragments: [] and no episodes\nreply:   {notation(empty.reply)}")
    pilot = c.call({"type": "get_weights", "id": 12, "policy_id": "pilot"})
    out.append(
        f"# a get_weights for a policy the server does not have\nreply:   {notation(pilot.reply)}"
    )
    pong = c.call({"type": "ping", "id": 13})
    assert pong.reply is not None and pong.reply["type"] == "pong", pong.reply
    g["12.1.16-more"] = fence("\n\n".join(out))
    c.close()
    return {"weights": weights.reply, "fragment": fragment, "summary": summary, "logp": logp}


# -- section 12.2 -----------------------------------------------------------------------------


@dataclass
class HttpExchange:
    """One HTTP request as curl would send it, and the response."""

    method: str
    path: str
    headers: list[tuple[str, str]]
    body: str | None
    status: int
    reason: str
    reply_headers: list[tuple[str, str]]
    reply_body: str


class Http:
    """Plain HTTP/1.1 requests to one server, shown as curl commands."""

    def __init__(self, server: Server, norm: Normaliser, log: list[HttpExchange]):
        self.port = server.http_port
        self.norm = norm
        self.log = log

    def send(
        self,
        method: str,
        path: str,
        body: str | None = None,
        headers: tuple[tuple[str, str], ...] = (("X-RLServe-Client", "sim-7"),),
        json_type: bool = True,
    ) -> HttpExchange:
        """Send one request (``Content-Type: application/json`` first unless ``json_type`` off)."""
        sent = [("Content-Type", "application/json")] if json_type and method == "POST" else []
        sent += list(headers)
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=TIMEOUT)
        try:
            all_headers = dict(sent)
            all_headers.setdefault("Host", f"localhost:{self.port}")
            conn.request(
                method, path, body=None if body is None else body.encode(), headers=all_headers
            )
            response = conn.getresponse()
            data = response.read()
            reply_headers = [(k.lower(), v) for k, v in response.getheaders()]
        finally:
            conn.close()
        with contextlib.suppress(ValueError):
            self.norm.learn(json.loads(data), json.loads(body) if body else {})
        # The binary port is picked at random (port 0): shown as the default port.
        text = BINARY_PORT_FIELD.sub('"binary_port":9900', self.norm.bytes(data).decode())
        if path == "/v1/get_weights" and response.status == 200:
            text = self.norm.weights_json(text)
        if text != data.decode():
            reply_headers = [
                (k, str(len(text.encode())) if k == "content-length" else v)
                for k, v in reply_headers
            ]
        ex = HttpExchange(
            method, path, sent, body, response.status, response.reason, reply_headers, text
        )
        self.log.append(ex)
        return ex


def curl(ex: HttpExchange, show: bool) -> str:
    """The curl command that sends what ``ex`` sent (the default HTTP port in its URL)."""
    flags = "-sS -i" if show else "-sS"
    method = "" if ex.method == "GET" else " -X POST"
    parts = [f"curl {flags}{method} http://localhost:9901{ex.path}"]
    parts += [f"-H '{k}: {v}'" for k, v in ex.headers]
    if ex.body is not None:
        parts.append(f"-d '{ex.body}'")
    return " \\\n  ".join(parts)


def response(ex: HttpExchange, show: bool, keep: tuple[str, ...] = ("content-type",)) -> str:
    """The reply as curl prints it; with ``show``, the status line and the ``keep`` headers."""
    if not show:
        return ex.reply_body
    head = [f"HTTP/1.1 {ex.status} {ex.reason}"]
    head += [f"{k}: {v}" for k, v in ex.reply_headers if k in keep]
    return "\n".join(head) + "\n\n" + ex.reply_body


def shown(ex: HttpExchange, show: bool = False, **kw: Any) -> str:
    """Command and reply as two code blocks."""
    return fence(curl(ex, show)) + "\n\n" + fence(response(ex, show, **kw))


def body(**fields: Any) -> str:
    """A compact JSON body (``NaN`` written as the bare token)."""
    from rlserve.protocol.codec import to_jsonable

    return json.dumps(to_jsonable(fields), separators=(",", ":"))


def http_examples(
    main: Server, token: Server, norm: Normaliser, log: list[HttpExchange], facts: dict[str, Any]
) -> dict[str, str]:
    """Run the requests of 12.2 and return the generated blocks."""
    g: dict[str, str] = {}
    h = Http(main, norm, log)
    obs = OBS.tolist()
    both = [OBS.tolist(), OBS2.tolist()]
    g["12.2.1"] = shown(h.send("GET", "/v1/health", headers=()))
    hello = h.send("POST", "/v1/hello", body(id=1, protocol_version=1, client_name="doc-example"))
    g["12.2.2"] = (
        shown(hello, True)
        + "\n\nThe same body, indented:\n\n"
        + fence(indented_json(json.loads(hello.reply_body)), "json")
    )
    g["12.2.3"] = (
        shown(h.send("POST", "/v1/start_episode", body(id=2, episode_id="http-ep-1")))
        + "\n\nWithout an `episode_id`:\n\n"
        + shown(h.send("POST", "/v1/start_episode", body(id=9)))
    )
    g["12.2.4"] = (
        shown(
            h.send("POST", "/v1/get_action", body(id=3, episode_id="http-ep-1", observation=obs)),
            True,
        )
        + "\n\nNext step, with the reward of the first action:\n\n"
        + shown(
            h.send(
                "POST",
                "/v1/get_action",
                body(id=4, episode_id="http-ep-1", observation=obs, reward=1.0),
            )
        )
    )
    g["12.2.5"] = shown(
        h.send("POST", "/v1/log_returns", body(id=5, episode_id="http-ep-1", reward=0.5))
    )
    g["12.2.6"] = shown(
        h.send(
            "POST",
            "/v1/log_action",
            body(id=6, episode_id="http-ep-1", observation=obs, action=1, reward=0.5),
        )
    )
    g["12.2.7"] = shown(
        h.send(
            "POST",
            "/v1/end_episode",
            body(id=7, episode_id="http-ep-1", observation=obs, truncated=False, reward=1.0),
        )
    )
    g["12.2.8"] = (
        shown(h.send("POST", "/v1/ping", body(id=8)))
        + "\n\nWith no body at all the `id` defaults to 0 (the `Content-Type` header is still "
        "required):\n\n" + shown(h.send("POST", "/v1/ping"))
    )
    for i in (2, 3):
        h.send("POST", "/v1/start_episode", body(id=8 + i, episode_id=f"http-ep-{i}"))
    ids = ["http-ep-2", "http-ep-3"]
    g["12.2.9"] = (
        shown(
            h.send(
                "POST",
                "/v1/get_action",
                body(id=12, episode_ids=ids, observations=both, rewards=[0.0, 0.0]),
            )
        )
        + "\n\nSecond step, with both rewards:\n\n"
        + shown(
            h.send(
                "POST",
                "/v1/get_action",
                body(id=13, episode_ids=ids, observations=both, rewards=[1.0, 1.0]),
            )
        )
        + "\n\nEnding them, one cut short and one terminated:\n\n"
        + shown(
            h.send(
                "POST",
                "/v1/end_episode",
                body(id=14, episode_id="http-ep-2", observation=obs, truncated=True, reward=1.0),
            )
        )
        + "\n\n"
        + shown(
            h.send(
                "POST",
                "/v1/end_episode",
                body(id=15, episode_id="http-ep-3", observation=obs, reward=1.0),
            )
        )
    )
    g["12.2.10-version"] = shown(h.send("POST", "/v1/hello", body(id=16, protocol_version=2)), True)
    g["12.2.10-episodes"] = (
        shown(h.send("POST", "/v1/start_episode", body(id=17, episode_id="http-ep-1")), True)
        + "\n\n"
        + shown(
            h.send("POST", "/v1/get_action", body(id=18, episode_id="http-ep-1", observation=obs)),
            True,
        )
    )
    h.send("POST", "/v1/start_episode", body(id=19, episode_id="http-ep-4"))
    g["12.2.10-early"] = shown(
        h.send("POST", "/v1/log_returns", body(id=20, episode_id="http-ep-4", reward=1.0)), True
    )
    g["12.2.10-values"] = (
        shown(
            h.send(
                "POST", "/v1/get_action", '{"id":21,"episode_id":"http-ep-4","observation":[0,0,0]}'
            ),
            True,
        )
        + "\n\n"
        + shown(
            h.send(
                "POST",
                "/v1/log_action",
                body(id=22, episode_id="http-ep-4", observation=obs, action=2),
            ),
            True,
        )
    )
    g["12.2.10-malformed"] = "\n\n".join(
        [
            shown(h.send("POST", "/v1/log_returns", body(id=23, episode_id="http-ep-4")), True),
            shown(h.send("POST", "/v1/get_action", "not json"), True),
            shown(h.send("POST", "/v1/jump", "{}"), True),
            shown(h.send("POST", "/v1/start_episode", body(id=24, episode_id="x" * 129)), True),
        ]
    )
    wrong_method = h.send("GET", "/v1/ping", headers=())
    g["12.2.10-method"] = shown(wrong_method, True, keep=("allow", "content-type"))
    plain = h.send(
        "POST", "/v1/ping", "{}", headers=(("Content-Type", "text/plain"),), json_type=False
    )
    origin = h.send("POST", "/v1/ping", "{}", headers=(("Origin", "https://evil.example"),))
    host = h.send("POST", "/v1/ping", "{}", headers=(("Host", "attacker.example"),))
    g["12.2.10-browser"] = (
        fence(
            f"{PING} -H 'Content-Type: text/plain' -d '{{}}'\n"
            f"{PING} -H 'Content-Type: application/json' \\\n"
            "  -H 'Origin: https://evil.example' -d '{}'\n"
            f"{PING} -H 'Content-Type: application/json' \\\n"
            "  -H 'Host: attacker.example' -d '{}'"
        )
        + "\n\n"
        + fence(
            "\n\n".join(
                f"HTTP/1.1 {ex.status} {ex.reason}\n{ex.reply_body}" for ex in (plain, origin, host)
            )
        )
    )
    huge = h.send(
        "POST", "/v1/log_returns", '{"id":25,"episode_id":"http-ep-1","reward":-1e39}', headers=()
    )
    g["12.2.10-range"] = (
        fence(
            "curl -sS -i -X POST http://localhost:9901/v1/log_returns "
            "-H 'Content-Type: application/json' \\\n"
            f"  -d '{huge.body}'"
        )
        + "\n\n"
        + fence(f"HTTP/1.1 {huge.status} {huge.reason}\n{huge.reply_body}")
    )

    t = Http(token, norm, log)
    auth = ("Authorization", "Bearer s3cret")
    g["12.2.11-token"] = "\n\n".join(
        [
            shown(t.send("POST", "/v1/ping", body(id=1), headers=()), True),
            shown(
                t.send(
                    "POST", "/v1/ping", body(id=2), headers=(("Authorization", "Bearer wrong"),)
                ),
                True,
            ),
            shown(t.send("POST", "/v1/ping", body(id=3), headers=(auth,)), True),
        ]
    )
    g["12.2.11-capacity"] = "\n\n".join(
        [
            shown(
                t.send(
                    "POST",
                    "/v1/start_episode",
                    body(id=4, episode_id="cap-1"),
                    headers=(auth, ("X-RLServe-Client", "sim-7")),
                )
            ),
            shown(
                t.send(
                    "POST",
                    "/v1/start_episode",
                    body(id=5, episode_id="cap-2"),
                    headers=(auth, ("X-RLServe-Client", "sim-7")),
                ),
                True,
            ),
            shown(
                t.send(
                    "POST",
                    "/v1/start_episode",
                    body(id=6, episode_id="cap-3"),
                    headers=(auth, ("X-RLServe-Client", "sim-8")),
                )
            ),
        ]
    )
    g["12.2.11-health"] = (
        shown(t.send("GET", "/v1/health", headers=()))
        + "\n\n"
        + shown(t.send("GET", "/v1/metrics", headers=()), True)
    )

    weights = h.send("POST", "/v1/get_weights", body(id=2, policy_id="default"))
    parsed = json.loads(weights.reply_body)
    g["12.2.12-weights"] = (
        fence(curl(weights, True))
        + f"\n\nThe reply, {len(weights.reply_body.encode()):,} bytes of JSON on one line; here "
        "every long array is cut short (a list of rows after its first 2 rows, a list of numbers "
        "after its first 4), `…` marking what was left out:\n\n"
        + fence(
            f"HTTP/1.1 {weights.status} {weights.reason}\ncontent-type: application/json\n\n"
            + compact_json(parsed, cut=True)
        )
    )
    first = np.float32(facts["weights"]["arrays"]["actor.0.weight"][0, 0])
    g["12.2.12-first"] = (
        f"(`{first.tobytes().hex(' ')}` is {parsed['arrays']['actor.0.weight'][0][0]!r})"
    )
    g["12.2.12-again"] = shown(
        h.send("POST", "/v1/get_weights", body(id=3, policy_id="default", have_version=0))
    )

    fragment = {**facts["fragment"], "episode_id": "http-loc-1"}
    summary = {**facts["summary"], "episode_id": "http-loc-1"}
    report = body(id=4, batch_id="http-batch-0001", fragments=[fragment], episodes=[summary])
    g["12.2.13-report"] = (
        shown(h.send("POST", "/v1/report_samples", report), True)
        + "\n\nSent again unchanged except for the request `id`:\n\n"
        + shown(h.send("POST", "/v1/report_samples", report.replace('"id":4', '"id":5', 1)))
    )
    nan_logp = body(id=6, batch_id="http-batch-0002", fragments=[fragment])
    logp_text = json.dumps(float(facts["logp"]))
    null_body = nan_logp.replace(f"[{logp_text},NaN]", f"[{logp_text},null]")
    string_body = nan_logp.replace(f"[{logp_text},NaN]", f'[{logp_text},"NaN"]').replace(
        '"id":6,"batch_id":"http-batch-0002"', '"id":7,"batch_id":"http-batch-0003"'
    )
    g["12.2.13-nan"] = (
        shown(h.send("POST", "/v1/report_samples", null_body), True)
        + "\n\n"
        + shown(h.send("POST", "/v1/report_samples", string_body), True)
    )
    finite = body(
        id=8,
        batch_id="http-batch-0004",
        fragments=[
            {**fragment, "behaviour_logp": np.array([facts["logp"], facts["logp"]], np.float32)}
        ],
    )
    g["12.2.13-finite"] = shown(h.send("POST", "/v1/report_samples", finite), True)
    seven = body(
        id=9,
        batch_id="http-batch-0005",
        fragments=[{**fragment, "weights_version": np.array([0, 7], np.int64)}],
    )
    no_id = body(id=10, fragments=[fragment])
    g["12.2.13-refused"] = (
        shown(h.send("POST", "/v1/report_samples", seven), True)
        + "\n\n"
        + shown(h.send("POST", "/v1/report_samples", no_id), True)
    )
    return g


def indented_json(value: Any, indent: int = 0) -> str:
    """JSON indented by 2, with lists of scalars kept on one line."""
    pad = " " * indent
    if isinstance(value, dict):
        items = [
            f"{pad}  {json.dumps(k)}: {indented_json(v, indent + 2).lstrip()}"
            for k, v in value.items()
        ]
        return pad + "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(value, list) and all(not isinstance(v, dict | list) for v in value):
        return pad + "[" + ", ".join(json.dumps(v) for v in value) + "]"
    return pad + json.dumps(value)


# -- multi-agent episodes (12.1.17, 12.2.14, 15.8) --------------------------------------------

AGENT_OBS = np.stack([OBS, OBS2, OBS])
"""The observations of the agents ``p1``, ``p2`` and ``p3``."""


def agent_examples(
    main: Server, norm: Normaliser, log: list[Exchange], http_log: list[HttpExchange]
) -> dict[str, str]:
    """12.1.17 and 12.2.14: a multi-agent episode on the one-policy server, on both carriers.

    Run after every other example of the first server, so the actions sampled there (the
    server's random stream) stay as they were.
    """
    g: dict[str, str] = {}
    c = Conn(main.port, norm, log)
    hello = c.call({"type": "hello", "id": 1, "protocol_version": 1, "client_name": "doc-agents"})
    assert hello.reply is not None
    frame = hello.reply_frame
    mapping_at = frame.find(b"\xa7mapping")
    multi_at = frame.find(b"\xabmulti_agent")
    welcome = hello.reply
    g["12.1.17-hello"] = (
        f"Request {code(hello.request)}.\nThe reply is the `welcome` of 12.1.1 "
        f"({len(frame)} bytes); its multi-agent fields, decoded:\n\n"
        + fence(
            notation(
                {
                    "mapping": welcome["mapping"],
                    "multi_agent": welcome["multi_agent"],
                    "limits": {
                        k: v for k, v in welcome["limits"].items() if k.startswith("max_agents")
                    },
                }
            )
        )
        + f"\n\nIn the bytes, the key `mapping` (`a7` and 7 characters) starts at offset "
        f"{mapping_at:#x} and is\nfollowed by `{frame[mapping_at + 8]:02x}` (an empty array: this "
        f"server has no rules), and the key `multi_agent` (`ab` and\n11 characters) at "
        f"{multi_at:#x} by `{frame[multi_at + 12]:02x}` (false):\n\n"
        + fence(
            "\n".join(hexdump(frame).splitlines()[mapping_at // 16 : (multi_at + 12) // 16 + 1])
        )
    )
    c.call({"type": "start_episode", "id": 2, "episode_id": "ma-1"})
    first = c.call(
        {
            "type": "get_action",
            "id": 3,
            "episode_id": "ma-1",
            "agent_ids": ["p1", "p2"],
            "observations": AGENT_OBS[:2],
            "seq": 1,
        }
    )
    g["12.1.17-get_action"] = (
        f"Request\n{code(first.request)}\n({len(first.request_frame)} bytes):\n\n"
        + fence(hexdump(first.request_frame))
        + "\n\n"
        + fence(byte_walk(first.request_frame))
        + f"\n\nReply {code(first.reply)}: one action per agent, in the order of `agent_ids`, "
        "as the\npolicy's batched form (an int64 ndarray for a Discrete action space):\n\n"
        + fence(hexdump(first.reply_frame))
        + "\n\n"
        + fence(byte_walk(first.reply_frame))
    )
    second = c.call(
        {
            "type": "get_action",
            "id": 4,
            "episode_id": "ma-1",
            "agent_ids": ["p1", "p2", "p3"],
            "observations": [AGENT_OBS[0], AGENT_OBS[1], AGENT_OBS[2].tolist()],
            "rewards": [1.0, 0.5, 0.0],
            "seq": 2,
        }
    )
    logged = c.call(
        {
            "type": "log_action",
            "id": 5,
            "episode_id": "ma-1",
            "agent_ids": ["p1"],
            "observations": AGENT_OBS[:1],
            "actions": [1],
            "rewards": [1.0],
            "seq": 3,
        }
    )
    g["12.1.17-step"] = (
        "Second step: `p3` joins (its reward is `0.0`: it has not acted yet), `observations` is a "
        "list\nthis time (two ndarray values and a plain array of numbers):\n\n"
        + transcript(second)
        + "\n\n"
        + fence(hexdump(second.request_frame))
        + "\n\nThen `p1`'s next action is taken by someone else:\n\n"
        + transcript(logged)
        + "\n\n"
        + fence(hexdump(logged.request_frame))
    )
    done = c.call(
        {
            "type": "log_returns",
            "id": 6,
            "episode_id": "ma-1",
            "agent_ids": ["p1", "p2"],
            "rewards": [1.0, 2.0],
            "terminated_agents": ["p2"],
            "seq": 4,
        }
    )
    g["12.1.17-log_returns"] = (
        f"Request {code(done.request)}: `p1`'s and `p2`'s rewards, and `p2` terminated:\n\n"
        + fence(hexdump(done.request_frame))
        + "\n\n"
        + fence(byte_walk(done.request_frame))
        + f"\n\nReply {code(done.reply)}:\n\n"
        + fence(hexdump(done.reply_frame))
    )
    refused = c.call(
        {
            "type": "get_action",
            "id": 7,
            "episode_id": "ma-1",
            "agent_ids": ["p2"],
            "observations": AGENT_OBS[1:2],
            "seq": 5,
        }
    )
    g["12.1.17-refused"] = transcript(refused) + "\n\n" + fence(hexdump(refused.reply_frame))
    mistakes = [
        c.call(
            {
                "type": "log_returns",
                "id": 8,
                "episode_id": "ma-1",
                "agent_ids": ["p4"],
                "rewards": [1.0],
                "seq": 5,
            }
        ),
        c.call(
            {
                "type": "get_action",
                "id": 9,
                "episode_id": "ma-1",
                "agent_ids": ["p1", "p3"],
                "observations": [OBS, np.zeros(3, np.float32)],
                "seq": 5,
            }
        ),
        c.call(
            {
                "type": "get_action",
                "id": 10,
                "episode_id": "ma-1",
                "agent_ids": ["p1", "p1"],
                "observations": AGENT_OBS[:2],
                "seq": 5,
            }
        ),
        c.call({"type": "get_action", "id": 11, "episode_id": "ma-1", "observation": OBS}),
    ]
    many = [f"x{i}" for i in range(4097)]
    crowd = c.call(
        {
            "type": "get_action",
            "id": 12,
            "episode_id": "ma-1",
            "agent_ids": many,
            "observations": np.tile(OBS, (len(many), 1)),
            "seq": 5,
        }
    )
    crowd_text = notation(crowd.request, elide_over=16).replace(
        notation(many), '["x0", "x1", …, "x4096"]'
    )
    g["12.1.17-mistakes"] = (
        transcript(*mistakes)
        + "\n\n"
        + fence(f"request: {crowd_text}\nreply:   {notation(crowd.reply)}")
    )
    c.call({"type": "start_episode", "id": 13, "episode_id": "ma-2"})
    c.call({"type": "get_action", "id": 14, "episode_id": "ma-2", "observation": OBS})
    mixed = c.call(
        {
            "type": "get_action",
            "id": 15,
            "episode_id": "ma-2",
            "agent_ids": ["p1"],
            "observations": AGENT_OBS[:1],
        }
    )
    g["12.1.17-mixed"] = transcript(mixed)
    end = c.call(
        {
            "type": "end_episode",
            "id": 16,
            "episode_id": "ma-1",
            "agent_ids": ["p1"],
            "observations": AGENT_OBS[:1],
            "rewards": [1.0],
            "truncated": False,
            "seq": 5,
        }
    )
    g["12.1.17-end"] = (
        f"Request {code(end.request)}:\n\n"
        + fence(hexdump(end.request_frame))
        + f"\n\nReply {code(end.reply)}. Sent again (a lost reply), it is answered `ok` again "
        "and changes nothing:\n\n" + transcript(c.call({**end.request, "id": 17}))  # type: ignore[dict-item]
    )
    c.close()

    h = Http(main, norm, http_log)
    h.send("POST", "/v1/start_episode", body(id=1, episode_id="http-ma-1"))
    rows = AGENT_OBS[:2].tolist()
    g["12.2.14"] = "\n\n".join(
        [
            shown(
                h.send(
                    "POST",
                    "/v1/get_action",
                    body(
                        id=2,
                        episode_id="http-ma-1",
                        agent_ids=["p1", "p2"],
                        observations=rows,
                        seq=1,
                    ),
                ),
                True,
            ),
            "`p1` is rewarded; `p2` was cut short (a time limit of its own):",
            shown(
                h.send(
                    "POST",
                    "/v1/log_returns",
                    body(
                        id=3,
                        episode_id="http-ma-1",
                        agent_ids=["p1"],
                        rewards=[1.0],
                        truncated_agents=["p2"],
                        seq=2,
                    ),
                )
            ),
            "`p2` may not act again:",
            shown(
                h.send(
                    "POST",
                    "/v1/get_action",
                    body(
                        id=4, episode_id="http-ma-1", agent_ids=["p2"], observations=rows[1:], seq=3
                    ),
                ),
                True,
            ),
            "The episode ends, cut short, with `p1`'s final observation:",
            shown(
                h.send(
                    "POST",
                    "/v1/end_episode",
                    body(
                        id=5,
                        episode_id="http-ma-1",
                        agent_ids=["p1"],
                        observations=rows[:1],
                        rewards=[0.5],
                        truncated=True,
                        seq=3,
                    ),
                )
            ),
        ]
    )
    return g


def _tiny_policy(obs_dim: int, distribution: str, action_dim: int, seed: int) -> WeightsPackage:
    """Fixed small weights for the in-process example of 15.8.

    On a 1/64 grid, with ``relu`` and a standard deviation of exactly 1, every float32 operation
    of the forward pass and the sampling is exact, so the actions shown are the same on every
    machine (``tanh`` and ``exp`` may differ in the last bit between math libraries).
    """
    rng = np.random.default_rng(seed)
    gaussian = distribution == "gaussian"
    spec = ModelSpec(
        obs_dim=obs_dim,
        actor_layers=("actor.0", "actor.2"),
        activation="relu",
        distribution=distribution,
        action_dim=action_dim,
        action_low=(-1.0,) * action_dim if gaussian else (),
        action_high=(1.0,) * action_dim if gaussian else (),
    )
    arrays = {
        "actor.0.weight": np.round(rng.uniform(-1, 1, (4, obs_dim)) * 64) / 64,
        "actor.0.bias": np.round(rng.uniform(-0.5, 0.5, 4) * 64) / 64,
        "actor.2.weight": np.round(rng.uniform(-1, 1, (action_dim, 4)) * 64) / 64,
        "actor.2.bias": np.round(rng.uniform(-0.5, 0.5, action_dim) * 64) / 64,
    }
    if gaussian:
        arrays["log_std"] = np.zeros(action_dim)  # std 1: exact float32 arithmetic everywhere
    return WeightsPackage(0, spec, {k: (v + 0.0).astype(np.float32) for k, v in arrays.items()})


async def _served(service: Any, session: Any, message: dict[str, Any]) -> Exchange:
    """The exchange of one message handled by ``service`` in ``session``, as it crosses the wire."""
    import asyncio

    from rlserve.protocol.messages import parse_request

    replies: list[dict[str, Any]] = []
    service.handle(parse_request(decode(encode(message))), session, replies.append)
    for _ in range(5):  # let the scheduled forward pass run
        if replies:
            break
        await asyncio.sleep(0)
    (reply,) = replies
    if reply["type"] == "welcome":
        reply["instance_id"] = INSTANCE_PLACEHOLDER
    reply = decode(encode(reply))
    return Exchange(message, framed(message), reply, framed(reply))


def two_policy_example(log: list[Exchange]) -> dict[str, str]:
    """15.8: the request handler of a server with two policies and a mapping, in process.

    To keep the weights small and fixed (a served policy starts from random ones), this runs the
    server's own request handler (:class:`rlserve.server.service.Service`) with two policies;
    the messages are encoded as the binary carrier encodes them.
    """
    import asyncio

    import gymnasium as gym

    from rlserve.protocol.limits import Limits
    from rlserve.protocol.mapping import PolicyMapping
    from rlserve.server.service import Service, Session
    from rlserve.server.stats import ServerStats

    class Sink:
        def add(self, fragment: Any) -> None:
            pass

        def add_batch(self, fragments: Any, batch_id: str, on_done: Any) -> None:
            on_done(0)

    box4 = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    box2 = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    policies: dict[str, tuple[gym.Space[Any], gym.Space[Any]]] = {
        "red": (box4, gym.spaces.Discrete(3)),
        "blue": (box2, gym.spaces.Box(-1.0, 1.0, (2,), np.float32)),
    }
    rules = [("red_*", "red"), ("blue_*", "blue"), ("red_boss", "blue")]
    service = Service(
        policies, Limits(), None, 200, Sink(), ServerStats(), mapping=PolicyMapping(rules, policies)
    )
    session = Session()
    exchanges: list[Exchange] = []

    async def run() -> None:
        service.set_weights("red", _tiny_policy(4, "categorical", 3, seed=11))
        service.set_weights("blue", _tiny_policy(2, "gaussian", 2, seed=12))
        for message in (
            {"type": "hello", "id": 1, "protocol_version": 1, "client_name": "doc-teams"},
            {"type": "start_episode", "id": 2, "episode_id": "teams-1"},
            {
                "type": "get_action",
                "id": 3,
                "episode_id": "teams-1",
                "agent_ids": ["red_1", "blue_1", "red_boss"],
                "observations": [OBS, np.array([0.5, -0.5], np.float32), np.zeros(2, np.float32)],
                "seq": 1,
            },
            {
                "type": "get_action",
                "id": 4,
                "episode_id": "teams-1",
                "agent_ids": ["red_1", "red_2"],
                "observations": np.stack([OBS, OBS2]),
                "rewards": [1.0, 0.0],
                "seq": 2,
            },
            {
                "type": "get_action",
                "id": 5,
                "episode_id": "teams-1",
                "agent_ids": ["green_1"],
                "observations": [np.zeros(2, np.float32)],
                "seq": 3,
            },
            {
                "type": "get_action",
                "id": 6,
                "episode_id": "teams-1",
                "agent_ids": ["green_1"],
                "observations": [np.zeros(2, np.float32)],
                "policy_ids": ["blue"],
                "seq": 3,
            },
        ):
            exchanges.append(await _served(service, session, message))

    asyncio.run(run())
    log.extend(exchanges)
    hello, _, mixed, shared, unmapped, named = exchanges
    assert hello.reply is not None
    welcome = {k: hello.reply[k] for k in ("policies", "mapping", "multi_agent")}
    return {
        "15.8-welcome": fence(indented_json(json.loads(json_text(welcome))), "json"),
        "15.8-calls": (
            "Agents of both policies in one call: the reply is a list, one action per agent in "
            "the order of\n`agent_ids`, each in its policy's own form (an integer for `red`'s "
            "Discrete(3), a float32 array\nfor `blue`'s Box):\n\n"
            + transcript(mixed)
            + f"\n\nAs JSON (HTTP): `{json_text(mixed.reply)}`\n\n"
            "Agents of one policy only: the reply is that policy's batched form again:\n\n"
            + transcript(shared)
            + "\n\nAn agent no rule maps, then the same call naming its policy:\n\n"
            + transcript(unmapped, named)
        ),
    }


def mapping_fn_example(log: list[Exchange]) -> dict[str, str]:
    """7.12: a server that maps agents with a function, in process (the handler of 15.8).

    The function (``red*`` -> ``red``, the others -> ``blue``; ``bad*`` raises) runs in the
    server; the rule ``boss`` -> ``red`` is sent in ``welcome.mapping``.
    """
    import asyncio

    import gymnasium as gym

    from rlserve.protocol.limits import Limits
    from rlserve.protocol.mapping import PolicyMapping
    from rlserve.server.service import Service, Session
    from rlserve.server.stats import ServerStats

    class Sink:
        def add(self, fragment: Any) -> None:
            pass

        def add_batch(self, fragments: Any, batch_id: str, on_done: Any) -> None:
            on_done(0)

    def policy_mapping_fn(agent_id: str, episode: Any, **kwargs: Any) -> str:
        if agent_id.startswith("bad"):
            raise ValueError("no policy for bad agents")
        return "red" if agent_id.startswith("red") else "blue"

    box4 = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    box2 = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    policies: dict[str, tuple[gym.Space[Any], gym.Space[Any]]] = {
        "red": (box4, gym.spaces.Discrete(3)),
        "blue": (box2, gym.spaces.Box(-1.0, 1.0, (2,), np.float32)),
    }
    service = Service(
        policies,
        Limits(),
        None,
        200,
        Sink(),
        ServerStats(),
        mapping=PolicyMapping([("boss", "red")], policies),
        mapping_fn=policy_mapping_fn,
    )
    exchanges: list[Exchange] = []

    async def run() -> None:
        service.set_weights("red", _tiny_policy(4, "categorical", 3, seed=11))
        service.set_weights("blue", _tiny_policy(2, "gaussian", 2, seed=12))
        hello = {"type": "hello", "id": 1, "protocol_version": 1, "inference_mode": "local"}
        sessions = [Session(), Session(), Session()]
        for session, message in (
            (sessions[0], hello),
            (sessions[1], {**hello, "map_agents": True}),
            (
                sessions[1],
                {
                    "type": "map_agents",
                    "id": 2,
                    "episode_id": "local-7",
                    "agent_ids": ["red_1", "blue_1", "boss"],
                },
            ),
            (
                sessions[1],
                {"type": "map_agents", "id": 3, "episode_id": "local-7", "agent_ids": ["bad_1"]},
            ),
            (sessions[2], {"type": "hello", "id": 1, "protocol_version": 1}),
            (sessions[2], {"type": "start_episode", "id": 2, "episode_id": "teams-2"}),
            (
                sessions[2],
                {
                    "type": "get_action",
                    "id": 3,
                    "episode_id": "teams-2",
                    "agent_ids": ["red_1", "blue_1"],
                    "observations": [OBS, np.array([0.5, -0.5], np.float32)],
                    "seq": 1,
                },
            ),
        ):
            exchanges.append(await _served(service, session, message))

    asyncio.run(run())
    log.extend(exchanges)
    refused, admitted, mapped, failed, _, _, remote = exchanges
    assert admitted.reply is not None
    welcome = {k: admitted.reply[k] for k in ("mapping", "multi_agent", "map_agents")}
    return {
        "7.12-calls": (
            "A local-inference `hello` without `map_agents`, then with it (the welcome's "
            "`mapping`,\n`multi_agent` and `map_agents` shown; the other fields as in "
            "15.8):\n\n"
            + transcript(refused)
            + "\n\n"
            + fence(
                "request: "
                + notation(admitted.request)
                + '\nreply:   {"type": "welcome", "id": 1, …, '
                + notation(welcome)[1:]
            )
            + "\n\nThe agents of an episode, `boss` by its rule, the others by the function; "
            "then an agent the\nfunction fails for:\n\n"
            + transcript(mapped, failed)
            + "\n\nRemote inference needs no `map_agents`: the server asks the function about "
            "`red_1` and\n`blue_1` when they first appear (the welcome and `episode_started` "
            "left out):\n\n" + transcript(remote)
        ),
    }


# -- the doc ----------------------------------------------------------------------------------


def generate() -> tuple[dict[str, str], list[Exchange], list[HttpExchange]]:
    """Start the servers, run every example, return the blocks and what travelled."""
    norm = Normaliser(committed=Committed.load())
    frames: list[Exchange] = []
    requests: list[HttpExchange] = []
    with (
        tempfile.TemporaryDirectory(prefix="rlserve-docgen-") as tmp,
        servers(Path(tmp), (), TOKEN_FLAGS) as (main, token),
    ):
        blocks, facts = binary_examples(main, token, norm, frames)
        blocks.update(http_examples(main, token, norm, requests, facts))
        blocks.update(agent_examples(main, norm, frames, requests))
    blocks.update(two_policy_example(frames))
    blocks.update(mapping_fn_example(frames))
    blocks["14.4-vector"] = forward_pass_vector()
    return blocks, frames, requests


def forward_pass_vector() -> str:
    """Section 14.4's complete tiny vectors, from docs/protocol-vectors/forward-pass.json."""
    out = []
    for case in protocol_vectors.tiny_policies():
        lines = [f"model: {json.dumps(case['model'])}"]
        for name, tagged in case["arrays"].items():
            array = protocol_vectors.from_tagged(tagged)
            lines.append(f"{name} {list(array.shape)}: {notation(array.tolist())}")
        for key, value in case.items():
            if key not in ("name", "model", "arrays"):
                lines.append(f"{key}: {notation(value)}")
        out.append(f"`{case['name']}`:\n\n" + fence("\n".join(lines)))
    return "\n\n".join(out)


def splice(doc: str, blocks: dict[str, str]) -> str:
    """``doc`` with every generated block replaced.

    Raises:
        KeyError: A marker names a block the generator does not make, or a block has no marker.
    """
    used: set[str] = set()

    def replace(match: re.Match[str]) -> str:
        key = match["key"]
        if key not in blocks:
            raise KeyError(f"docs/protocol.md has a marker for '{key}', which is not generated")
        used.add(key)
        text = blocks[key].strip("\n")
        inner = f"\n{text}\n" if match["body"].startswith("\n") else text
        return f"{match[1]}{inner}{match[4]}"

    result = MARKER.sub(replace, doc)
    missing = sorted(set(blocks) - used)
    if missing:
        raise KeyError(f"generated blocks without a marker in docs/protocol.md: {missing}")
    return result


def main(argv: list[str] | None = None) -> int:
    """Regenerate (or with ``--check`` compare) the examples and the vectors."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare only; exit 1 on a difference")
    args = parser.parse_args(argv)
    blocks, frames, requests = generate()
    doc = DOC.read_text()
    committed = {m["key"]: m["body"].strip("\n") for m in MARKER.finditer(doc)}
    for key, text in blocks.items():
        if key in committed and same_within_tolerance(committed[key], text.strip("\n")):
            blocks[key] = committed[key]  # only last digits differ: keep what was committed
    outputs = {DOC: splice(doc, blocks)}
    outputs.update(protocol_vectors.vector_files(frames, requests))
    differences = []
    for path, text in outputs.items():
        old = path.read_text() if path.exists() else ""
        if old == text or same_within_tolerance(old, text):
            continue
        if args.check:
            differences.extend(
                difflib.unified_diff(
                    old.splitlines(keepends=True),
                    text.splitlines(keepends=True),
                    fromfile=f"{path.relative_to(ROOT)} (committed)",
                    tofile=f"{path.relative_to(ROOT)} (what the server sends today)",
                )
            )
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    if args.check and differences:
        sys.stdout.writelines(differences)
        print("\nthe generated parts differ; run: .venv/bin/python scripts/protocol_examples.py")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
