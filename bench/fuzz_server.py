"""Fuzz benchmark: mutated frames and HTTP requests at a live server while a real client trains.

What it does, on one command::

    .venv/bin/python bench/fuzz_server.py [--frames 100000] [--seed 0]

1. Starts a real ``rlserve serve --spaces-from CartPole-v1 --port 0 --http-port 0 --token ...``
   subprocess and waits for its first weights.
2. Starts a training client in its own process: a :class:`rlserve.PolicyClient` in remote mode
   stepping gymnasium's CartPole-v1 for the whole run. Any exception it raises is a failure.
3. Sends ``--frames`` mutated binary frames over ``--connections`` concurrent connections. Each
   frame starts from a valid request of a random type (``hello``, ``start_episode``, single and
   batched ``get_action``, ``log_action``, ``log_returns``, ``end_episode``, ``ping``,
   ``get_weights``, ``report_samples``) and is mutated: fields dropped, added or replaced by
   values of another type (arrays where maps go, maps where arrays go), extreme numbers (1e39,
   -1e30, 3e38, NaN, infinities, 2**64-1), also inside otherwise valid requests (fragments of
   ``report_samples`` with the newest weights version, so the values reach the learner),
   malformed ndarray extensions (wrong dtype codes,
   ndims, shapes, payload lengths), deep nesting, msgpack headers with oversized lengths, bit
   flips, truncations, insertions, random bytes; some frames are sent unmutated (they open
   episodes, so later mutations reach deep handler code), some split into many small writes.
   About 1 in 5 connections never says ``hello``; the others authenticate with the valid token.
   Each frame is followed by a ``ping`` probe on the same connection, and the replies are read:
   a frame must get exactly one reply and the probe its ``pong`` (or ``unauthorized`` before
   ``hello``) within ``--hang-timeout`` seconds. A connection may be closed by the server only
   after ``frame_too_large`` (a frame that breaks framing) or a failing ``hello``. A few frames
   break framing on purpose (an oversized length prefix; a prefix longer than what follows and
   then a close) and are only checked for the expected error and for the server surviving.
4. Meanwhile ``--http-requests`` mutated JSON requests go to ``POST /v1/<type>`` (bad JSON,
   deep nesting, huge numbers, NaN, type confusion, wrong or missing token and content type).
5. Prints a summary table: server crashes (the process exited), hangs, connections dropped
   without a reason, frames that got no or several replies, HTTP 5xx replies, the training
   client's errors, replies by type and error code, frames/s, server and learner memory (RSS)
   before and after, and the learner's guard counters. Each distinct failure is saved under
   ``--findings`` with a one-line repro (``--replay FILE`` starts a fresh server and sends that
   frame again). The exit status is 1 when crashes + hangs + client errors + protocol
   violations (dropped, unanswered or doubly answered frames, HTTP 5xx) > 0.

``--frames 2000`` is a quick check (well under a minute). Randomness comes from
``random.Random(--seed)`` (per connection: ``Random(seed * 1000 + connection)``); thread timing
still varies between runs, so counts of replies differ slightly.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import multiprocessing as mp
import queue
import random
import re
import socket
import struct
import sys
import tempfile
import threading
import time
import traceback
import uuid
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

from _server import BenchServer, start_server
from rlserve.protocol.codec import decode, pack_array

TOKEN = "fuzz-token-0123456789"
NEWEST_VERSION = [0]
"""The newest weights version, polled from ``/v1/health``: reported fragments use it (or one
before it) so that their values reach training instead of being dropped as stale."""
PROBE_ID_BASE = 1 << 50
"""Probe pings use ids from here up, far from the small ids of the mutated requests."""
CLOSING_CODES = ("frame_too_large",)
"""Error codes after which the server may close any connection."""
HELLO_CLOSING_CODES = ("unauthorized", "version_mismatch")
"""Error codes after which the server may close a connection whose frame was a ``hello``."""
REQUEST_TYPES = (
    "hello",
    "start_episode",
    "get_action",
    "get_action_batch",
    "log_action",
    "log_returns",
    "end_episode",
    "ping",
    "get_weights",
    "report_samples",
)

EXTREME_NUMBERS: tuple[Any, ...] = (
    1e39,
    -1e39,
    3e38,
    -3e38,
    1e38,
    -1e30,
    1e30,
    float("nan"),
    float("inf"),
    float("-inf"),
    5e-324,
    -0.0,
    2**63,
    2**64 - 1,
    -(2**63),
    -1,
    0,
    1 << 40,
)


# -- what was sent and what came back --------------------------------------------------------


@dataclass
class Case:
    """One frame to send and how it was made."""

    msg_type: str
    mutation: str
    description: str
    wire: bytes
    """Everything written to the socket for this case (length prefix included)."""
    framing: str = "ok"
    """``ok``: a well-framed frame; ``oversized``: length prefix over the limit; ``desync``:
    a prefix longer than the bytes that follow, then the client closes."""
    split: bool = False
    is_hello: bool = False


@dataclass
class Outcome:
    """What the server did with one case."""

    status: str
    """``ok``, ``closed_allowed``, ``dropped``, ``hang``, ``unanswered``, ``extra_replies``,
    ``bad_reply``, ``sent`` (desync: nothing to check)."""
    replies: list[dict[str, Any]] = field(default_factory=list)
    detail: str = ""
    at: float = field(default_factory=time.monotonic)


FAILURE_STATUSES = ("dropped", "hang", "unanswered", "extra_replies", "bad_reply")


@dataclass
class Tally:
    """Counts shared by every fuzzing thread (guarded by ``lock``)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    frames: int = 0
    by_mutation: Counter[str] = field(default_factory=Counter)
    by_status: Counter[str] = field(default_factory=Counter)
    replies: Counter[str] = field(default_factory=Counter)
    http_status: Counter[str] = field(default_factory=Counter)
    http_requests: int = 0
    failures: dict[str, list[tuple[Case, Outcome]]] = field(default_factory=dict)
    recent: dict[int, list[Case]] = field(default_factory=dict)
    generator_errors: list[str] = field(default_factory=list)
    accepted_reports: list[Case] = field(default_factory=list)

    def record(self, worker: int, case: Case, outcome: Outcome) -> None:
        """Count one case's outcome; keep failures and each worker's last cases."""
        with self.lock:
            self.frames += 1
            self.by_mutation[case.mutation] += 1
            self.by_status[outcome.status] += 1
            for reply in outcome.replies:
                kind = str(reply.get("type"))
                if kind == "error":
                    kind = f"error:{reply.get('code')}"
                self.replies[kind] += 1
            if any(r.get("type") == "samples_accepted" for r in outcome.replies):
                self.accepted_reports.append(case)
                del self.accepted_reports[:-3]
            recent = self.recent.setdefault(worker, [])
            recent.append(case)
            del recent[:-4]
            if outcome.status in FAILURE_STATUSES:
                key = signature(case, outcome.status)
                self.failures.setdefault(key, []).append((case, outcome))


def _fields_touched(ops: str) -> str:
    names = set()
    for op in ops.split(";"):
        op = op.strip().removeprefix("drop ").removeprefix("wrap ")
        if op.startswith("add a field"):
            names.add("<added field>")
        else:
            names.add(re.split(r"[ .\[]", op, maxsplit=1)[0])
    return ",".join(sorted(names))


def signature(case: Case, status: str) -> str:
    """What makes two failures the same kind: the outcome, the request and what was mutated."""
    what = case.description.split(": ", 1)[-1]
    if case.mutation == "http":
        if ":=" in what or what.startswith(("drop ", "wrap ", "add ")):
            what = "value mutation"
        return f"http {status} | {re.sub(r'[0-9]+', 'N', what)}"
    if case.mutation in ("value", "raw"):
        return f"{status} | {case.msg_type} | {case.mutation} of {_fields_touched(what)}"
    return f"{status} | {case.msg_type} | {case.mutation}"


# -- valid requests ---------------------------------------------------------------------------


@dataclass
class ConnState:
    """What one connection knows: its episodes and the newest weights version seen."""

    episodes: list[str] = field(default_factory=list)
    version: int = 0
    next_id: int = 1


def _obs(rng: random.Random) -> np.ndarray:
    return np.array([rng.uniform(-2, 2), rng.uniform(-3, 3), rng.uniform(-0.2, 0.2), 0.1], "f4")


def _episode(rng: random.Random, state: ConnState) -> str:
    if state.episodes and rng.random() < 0.85:
        return rng.choice(state.episodes)
    return f"fz-{rng.getrandbits(48):012x}"


def _version(rng: random.Random, state: ConnState) -> int:
    newest = max(state.version, NEWEST_VERSION[0])
    return max(newest - rng.choice([0, 0, 0, 1, 5]), 0)


def _fragment(rng: random.Random, state: ConnState) -> dict[str, Any]:
    steps = rng.randint(1, 16)
    return {
        "episode_id": f"fzl-{rng.getrandbits(48):012x}",
        "obs": np.stack([_obs(rng) for _ in range(steps + 1)]),
        "actions": np.array([rng.randint(0, 1) for _ in range(steps)], "i8"),
        "rewards": np.ones(steps, "f4"),
        "behaviour_logp": np.full(steps, -0.69, "f4"),
        "policy_chosen": np.ones(steps, bool),
        "weights_version": np.full(steps, _version(rng, state), "i8"),
        "terminated": rng.random() < 0.3,
        "truncated": False,
    }


def valid_request(rng: random.Random, state: ConnState, kind: str) -> dict[str, Any]:
    """A well-formed request of ``kind`` for CartPole (its episode may or may not exist)."""
    msg: dict[str, Any]
    if kind == "hello":
        msg = {"type": "hello", "protocol_version": 1, "token": TOKEN, "client_name": "fuzz"}
        msg["inference_mode"] = rng.choice(["remote", "local"])
    elif kind == "start_episode":
        msg = {"type": "start_episode", "episode_id": f"fz-{rng.getrandbits(48):012x}"}
        msg |= {"training_enabled": rng.random() < 0.7, "policy_id": "default"}
    elif kind == "get_action":
        msg = {"type": "get_action", "episode_id": _episode(rng, state), "observation": _obs(rng)}
        msg["reward"] = 1.0
    elif kind == "get_action_batch":
        ids = list(dict.fromkeys(_episode(rng, state) for _ in range(rng.randint(1, 4))))
        msg = {"type": "get_action", "episode_ids": ids}
        msg |= {"observations": np.stack([_obs(rng) for _ in ids]), "rewards": [1.0] * len(ids)}
    elif kind == "log_action":
        msg = {"type": "log_action", "episode_id": _episode(rng, state), "observation": _obs(rng)}
        msg |= {"action": rng.randint(0, 1), "reward": 0.5}
    elif kind == "log_returns":
        msg = {"type": "log_returns", "episode_id": _episode(rng, state), "reward": 1.0}
        msg["info"] = {"note": "fuzz"}
    elif kind == "end_episode":
        msg = {"type": "end_episode", "episode_id": _episode(rng, state), "observation": _obs(rng)}
        msg |= {"truncated": rng.random() < 0.5, "reward": 1.0}
    elif kind == "ping":
        msg = {"type": "ping"}
    elif kind == "get_weights":
        msg = {"type": "get_weights", "policy_id": "default", "have_version": state.version}
    else:
        fragments = [_fragment(rng, state) for _ in range(rng.randint(1, 3))]
        summaries = [{"episode_id": "fzl-1", "return": 10.0, "length": 10, "reason": "truncated"}]
        msg = {"type": "report_samples", "batch_id": uuid.UUID(int=rng.getrandbits(128)).hex}
        msg |= {"policy_id": "default", "fragments": fragments, "episodes": summaries}
    msg["id"] = state.next_id
    state.next_id += 1
    return msg


# -- mutations --------------------------------------------------------------------------------


def _ext(code: int, ndim: int, dims: list[int], payload: bytes) -> msgpack.ExtType:
    return msgpack.ExtType(
        1, bytes([code & 255, ndim & 255]) + struct.pack(f"<{len(dims)}I", *dims) + payload
    )


def weird_array(rng: random.Random) -> tuple[Any, str]:
    """An ndarray value that is wrong in dtype, shape, contents or header."""
    pick = rng.randrange(9)
    if pick == 0:
        value = rng.choice([1e39, -1e39, float("nan"), float("inf")])
        return np.full(4, value, "f8"), f"f8[4] of {value}"
    if pick == 1:
        value = rng.choice([3e38, -3e38, 1e38, -1e30, float("nan"), float("-inf")])
        return np.full(rng.choice([4, 8, 1]), value, "f4"), f"f4 of {value}"
    if pick == 2:
        dtype = rng.choice(["bool", "u1", "i8", "f2", "u8", "i1"])
        shape = rng.choice([(4,), (2, 2), (1, 4), (4, 1), (0,), (5,), (), (0, 4), (3, 17)])
        return np.zeros(shape, dtype), f"{dtype}{list(shape)}"
    if pick == 3:
        array = np.full((rng.randint(1, 9), 4), 0.1, "f4")
        array[rng.randrange(array.shape[0]), rng.randrange(4)] = rng.choice(EXTREME_NUMBERS[:10])
        return array, "f4 matrix with one extreme element"
    if pick == 4:  # header code outside the table
        return _ext(rng.choice([12, 13, 99, 255]), 1, [4], b"\0" * 16), "unknown dtype code"
    if pick == 5:  # too many dimensions
        ndim = rng.choice([9, 32, 255])
        return _ext(10, ndim, [1] * min(ndim, 64), b"\0" * 4), f"ndim {ndim}"
    if pick == 6:  # dims whose product is huge (or overflows 32/64 bits)
        dims = rng.choice([[2**32 - 1], [2**32 - 1, 2**32 - 1], [65536, 65536, 65536], [4_000_001]])
        return _ext(10, len(dims), dims, b"\0" * 16), f"dims {dims}"
    if pick == 7:  # payload length does not match the shape
        return _ext(10, 1, [4], b"\0" * rng.choice([0, 3, 15, 17, 64])), "payload length wrong"
    return _ext(10, rng.randint(0, 3), [], b""), "header cut short"


def weird_value(rng: random.Random) -> tuple[Any, str]:
    """A value of a random wrong kind: type confusion, extremes, long or odd strings."""
    pick = rng.randrange(12)
    if pick < 3:
        value = rng.choice(EXTREME_NUMBERS)
        return value, repr(value)
    if pick == 3:
        return rng.choice([None, True, False]), "bool/None"
    if pick == 4:
        return rng.choice(["", "x" * 129, "x" * 70_000, "\u00e9\u0000\ud7ff", "default"]), "odd str"
    if pick == 5:
        return rng.choice([b"", b"\x00\xff", bytes(200)]), "bin"
    if pick == 6:
        return rng.choice(
            [[], [1, 2, 3], [[0.1] * 4], [None], ["a", {}]]
        ), "list (array where a scalar/map goes)"
    if pick == 7:
        return rng.choice(
            [{}, {"a": 1}, {"episode_id": 5}, {1: 2}]
        ), "map (map where a scalar/array goes)"
    if pick == 8:
        return list(range(rng.choice([70_000, 5000]))), "long list"
    if pick == 9:
        return msgpack.ExtType(rng.choice([0, 2, 5, 127]), b"\x00\x01"), "foreign ext type"
    array, what = weird_array(rng)
    return array, f"ndarray {what}"


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, child in value.items():
            out += _paths(child, (*prefix, key))
    elif isinstance(value, list):
        for i, child in enumerate(value):
            out += _paths(child, (*prefix, i))
    return out


def _get(root: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        root = root[key]
    return root


def mutate_message(rng: random.Random, msg: dict[str, Any]) -> list[str]:
    """Apply 1 to 3 value-level mutations in place; return what was done."""
    done: list[str] = []
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        paths = _paths(msg)
        if not paths:
            msg["id"] = None
            paths = [("id",)]
        path = rng.choice(paths)
        parent = _get(msg, path[:-1]) if len(path) > 1 else msg
        key = path[-1]
        where = ".".join(str(p) for p in path)
        op = rng.randrange(8)
        if op == 0 and isinstance(parent, dict):
            parent.pop(key, None)
            done.append(f"drop {where}")
        elif op == 1:
            parent[key] = [parent[key]] if rng.random() < 0.5 else {"v": parent[key]}
            done.append(f"wrap {where} in a container")
        elif op == 2:
            old = parent[key]
            if isinstance(old, np.ndarray) and old.size and old.dtype.kind == "f":
                new = old.copy()
                value = rng.choice(EXTREME_NUMBERS[:10])
                new.flat[rng.randrange(new.size)] = value
                parent[key] = new
                done.append(f"{where}[one element] := {value}")
            else:
                value = rng.choice(EXTREME_NUMBERS)
                parent[key] = value
                done.append(f"{where} := {value}")
        elif op == 3:
            array, what = weird_array(rng)
            parent[key] = array
            done.append(f"{where} := ndarray {what}")
        elif op == 4 and isinstance(parent, dict):
            msg["type"] = rng.choice(
                [*REQUEST_TYPES[:3], *REQUEST_TYPES[4:], "welcome", "nope", ""]
            )
            done.append(f"type := {msg['type']}")
        elif op == 5 and isinstance(parent, dict):
            value, what = weird_value(rng)
            parent[rng.choice(["extra", "episodes", "fragments", "info", "id", "x" * 300])] = value
            done.append(f"add a field := {what}")
        else:
            value, what = weird_value(rng)
            parent[key] = value
            done.append(f"{where} := {what}")
    return done


def poison(rng: random.Random, msg: dict[str, Any]) -> str:
    """Put extreme numbers into a well-typed request, leaving its structure valid.

    Finite float64 values that are infinite as float32, huge float32 values, -1e30
    log-probabilities: the values of issue finding 1.
    """
    value = rng.choice([1e39, -1e39, 3e38, -3e38, 1e38, -1e30, 1e30, 1e20])
    if msg["type"] == "report_samples":
        fragment = rng.choice(msg["fragments"])
        name = rng.choice(["rewards", "obs", "behaviour_logp", "rewards", "behaviour_logp"])
        array = fragment[name].astype(np.float64 if abs(value) > 3.4e38 else np.float32)
        if rng.random() < 0.5:
            array[...] = value
        else:
            array.flat[rng.randrange(array.size)] = value
        fragment[name] = array
        return f"fragments.{name} holds {value} ({array.dtype})"
    if "observation" in msg and rng.random() < 0.5:
        obs = msg["observation"].astype(np.float64)
        obs[rng.randrange(4)] = value
        msg["observation"] = obs
        return f"observation holds {value} (float64)"
    msg["reward"] = value
    return f"reward := {value}"


def _pack(value: Any) -> bytes:
    def default(obj: Any) -> Any:
        if isinstance(obj, np.ndarray):
            return pack_array(obj)
        raise TypeError(type(obj).__name__)

    return msgpack.packb(value, default=default, use_bin_type=True)


def _map_header(n: int) -> bytes:
    if n < 16:
        return bytes([0x80 | n])
    return b"\xde" + struct.pack(">H", n)


def with_raw_field(msg: dict[str, Any], key: str, raw: bytes) -> bytes:
    """Encode ``msg`` with one more field whose value is the raw msgpack bytes ``raw``."""
    items = [(k, v) for k, v in msg.items() if k != key]
    body = _map_header(len(items) + 1)
    for k, v in items:
        body += _pack(k) + _pack(v)
    return body + _pack(key) + raw


def raw_special(rng: random.Random) -> tuple[bytes, str]:
    """Raw msgpack for a value no encoder would write: deep nesting, oversized lengths."""
    pick = rng.randrange(6)
    depth = rng.choice([100, 1000, 20_000])
    if pick == 0:
        return b"\x91" * depth + b"\xc0", f"arrays nested {depth} deep"
    if pick == 1:
        return b"\x81\xa1k" * depth + b"\xc0", f"maps nested {depth} deep"
    big = rng.choice([2**31, 2**32 - 1, 70_000])
    if pick == 2 and rng.random() < 0.2:
        return b"\xd6\xff\x00\x00\x00\x01", "msgpack timestamp (extension -1)"
    if pick == 2:
        return b"\xdd" + struct.pack(">I", big) + b"\x01\x02", f"array32 header claiming {big}"
    if pick == 3:
        return b"\xdf" + struct.pack(">I", big) + b"\xa1a\x01", f"map32 header claiming {big}"
    if pick == 4:
        return b"\xdb" + struct.pack(">I", big) + b"abc", f"str32 header claiming {big} bytes"
    return b"\xc9" + struct.pack(">I", big) + b"\x01\x0a", f"ext32 header claiming {big} bytes"


def mutate_bytes(rng: random.Random, body: bytes) -> tuple[bytes, str]:
    """A byte-level mutation of an encoded body."""
    data = bytearray(body)
    pick = rng.randrange(7)
    if pick == 0 and data:
        flips = rng.randint(1, 8)
        for _ in range(flips):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        return bytes(data), f"{flips} bit flips"
    if pick == 1 and data:
        cut = rng.randrange(len(data))
        return bytes(data[:cut]), f"truncated to {cut} of {len(data)} bytes"
    if pick == 2:
        at = rng.randrange(len(data) + 1)
        data[at:at] = rng.randbytes(rng.randint(1, 16))
        return bytes(data), "random bytes inserted"
    if pick == 3 and data:
        at = rng.randrange(len(data))
        del data[at : at + rng.randint(1, 16)]
        return bytes(data), "bytes deleted"
    if pick == 4:
        return body + rng.randbytes(rng.randint(1, 8)), "trailing garbage"
    if pick == 5:
        return rng.randbytes(rng.randint(0, 300)), "random bytes"
    return b"", "empty body"


def frame(body: bytes) -> bytes:
    """Prefix a body with its big-endian length."""
    return struct.pack(">I", len(body)) + body


def _decoded_type(body: bytes) -> Any:
    with contextlib.suppress(Exception):
        value = msgpack.unpackb(body, raw=False, strict_map_key=False, ext_hook=lambda c, d: None)
        if isinstance(value, dict):
            return value.get("type")
    return None


def make_case(rng: random.Random, state: ConnState, max_frame_bytes: int) -> Case:
    """Draw one case: a valid request of a random type, mutated one way or another."""
    kind = rng.choice(REQUEST_TYPES)
    msg = valid_request(rng, state, kind)
    roll = rng.random()
    if roll < 0.10:
        mutation, what, body = "none", "valid request", _pack(msg)
    elif roll < 0.18:
        kind = rng.choice(
            ["report_samples", "get_action", "log_action", "log_returns", "end_episode"]
        )
        msg = valid_request(rng, state, kind)
        mutation, what, body = "extreme", poison(rng, msg), _pack(msg)
    elif roll < 0.55:
        done = mutate_message(rng, msg)
        mutation, what = "value", "; ".join(done)
        try:
            body = _pack(msg)
        except (TypeError, ValueError, OverflowError) as exc:
            body, more = mutate_bytes(rng, _pack(valid_request(rng, state, kind)))
            mutation, what = "bytes", f"{more} (value mutation not encodable: {exc})"
    elif roll < 0.62:
        raw, what = raw_special(rng)
        key = rng.choice([k for k in msg if k != "type"] or ["extra"])
        mutation, what, body = "raw", f"{key} := {what}", with_raw_field(msg, key, raw)
    elif roll < 0.94:
        body, what = mutate_bytes(rng, _pack(msg))
        mutation = "bytes"
    elif roll < 0.97:
        length = rng.choice([max_frame_bytes + 1, 2**31, 2**32 - 1])
        wire = struct.pack(">I", length) + _pack(msg)[:64]
        return Case(kind, "oversized", f"length prefix {length}", wire, framing="oversized")
    else:
        body = _pack(msg)
        cut = rng.randrange(len(body))
        wire = struct.pack(">I", len(body) + rng.randint(1, 1000)) + body[:cut]
        return Case(kind, "desync", "prefix longer than the body, then close", wire, "desync")
    is_hello = _decoded_type(body) == "hello"
    split = rng.random() < 0.05
    return Case(kind, mutation, f"{kind}: {what}", frame(body), split=split, is_hello=is_hello)


# -- talking to the server --------------------------------------------------------------------


class Link:
    """One raw binary connection with a reply buffer."""

    def __init__(self, address: str, timeout: float):
        host, _, port = address.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = bytearray()
        self.timeout = timeout

    def close(self) -> None:
        """Close the socket (errors ignored)."""
        with contextlib.suppress(OSError):
            self.sock.close()

    def send(self, data: bytes, split: bool = False) -> bool:
        """Write ``data``; False when the server has already closed."""
        try:
            if split:
                for i in range(0, len(data), 3):
                    self.sock.sendall(data[i : i + 3])
            else:
                self.sock.sendall(data)
        except OSError:
            return False
        return True

    def read_reply(self, deadline: float) -> dict[str, Any] | str:
        """The next reply, or ``eof``/``timeout``/``bad: ...``."""
        while True:
            if len(self.buffer) >= 4:
                (length,) = struct.unpack_from(">I", self.buffer)
                if len(self.buffer) >= 4 + length:
                    body = bytes(self.buffer[4 : 4 + length])
                    del self.buffer[: 4 + length]
                    try:
                        return decode(body)
                    except Exception as exc:
                        return f"bad: undecodable reply ({exc})"
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return "timeout"
            self.sock.settimeout(remaining)
            try:
                chunk = self.sock.recv(1 << 16)
            except TimeoutError:
                return "timeout"
            except OSError:
                return "eof"
            if not chunk:
                return "eof"
            self.buffer += chunk


def run_case(link: Link, case: Case, probe_id: int, hang_timeout: float) -> Outcome:
    """Send one case (and a probe) and classify what the server did."""
    if case.framing == "desync":
        link.send(case.wire)
        link.close()
        return Outcome("sent")
    if case.framing == "oversized":
        link.send(case.wire)
        deadline = time.monotonic() + hang_timeout
        replies: list[dict[str, Any]] = []
        while True:
            reply = link.read_reply(deadline)
            if reply == "eof":
                ok = any(r.get("code") == "frame_too_large" for r in replies)
                return Outcome("closed_allowed", replies, "" if ok else "closed without an error")
            if reply == "timeout":
                return Outcome("hang", replies, "no close after an oversized length prefix")
            if isinstance(reply, str):
                return Outcome("bad_reply", replies, reply)
            replies.append(reply)
    probe = frame(_pack({"type": "ping", "id": probe_id}))
    if case.split:
        sent = link.send(case.wire, split=True) and link.send(probe)
    else:
        sent = link.send(case.wire + probe)
    deadline = time.monotonic() + hang_timeout
    replies = []
    while True:
        reply = link.read_reply(deadline)
        if isinstance(reply, dict):
            if reply.get("id") == probe_id and reply.get("type") in ("pong", "error"):
                if len(replies) == 1:
                    return Outcome("ok", replies)
                status = "unanswered" if not replies else "extra_replies"
                return Outcome(status, replies, f"{len(replies)} replies before the probe's")
            replies.append(reply)
            continue
        if reply == "eof" or not sent:
            codes = {r.get("code") for r in replies if r.get("type") == "error"}
            if codes & set(CLOSING_CODES) or (case.is_hello and codes & set(HELLO_CLOSING_CODES)):
                return Outcome("closed_allowed", replies)
            return Outcome("dropped", replies, f"closed after replies {_brief(replies)}")
        if reply == "timeout":
            return Outcome(
                "hang", replies, f"no probe reply in {hang_timeout} s; got {_brief(replies)}"
            )
        return Outcome("bad_reply", replies, reply)


def _brief(replies: list[dict[str, Any]]) -> str:
    return str([r.get("code") or r.get("type") for r in replies])


def server_gone(server: BenchServer) -> bool:
    """Whether the server process has exited (waiting a moment: a failure may precede it)."""
    if not server.alive():
        return True
    time.sleep(0.5)
    return not server.alive()


def hello(link: Link, state: ConnState, hang_timeout: float) -> bool:
    """Authenticate with the valid token; True on ``welcome``."""
    link.send(frame(_pack({"type": "hello", "id": 0, "protocol_version": 1, "token": TOKEN})))
    reply = link.read_reply(time.monotonic() + hang_timeout)
    return isinstance(reply, dict) and reply.get("type") == "welcome"


def _learn(state: ConnState, outcome: Outcome) -> None:
    for reply in outcome.replies:
        if reply.get("type") == "episode_started":
            state.episodes.append(str(reply.get("episode_id")))
            del state.episodes[:-32]
        for key in ("weights_version", "version"):
            value = reply.get(key)
            if type(value) is int and reply.get("type") in ("weights", "samples_accepted"):
                state.version = max(state.version, value)


def fuzz_worker(
    worker: int,
    args: argparse.Namespace,
    server: BenchServer,
    tally: Tally,
    budget: Any,
    stop: threading.Event,
) -> None:
    """Send cases on one connection at a time until the shared frame budget is spent."""
    rng = random.Random(args.seed * 1000 + worker)
    state = ConnState()
    link: Link | None = None
    probe = PROBE_ID_BASE + worker * (1 << 32)
    while not stop.is_set():
        with tally.lock:
            if budget[0] <= 0:
                break
            budget[0] -= 1
        try:
            if link is None:
                link = Link(server.address, args.hang_timeout)
                if rng.random() < 0.8 and not hello(link, state, args.hang_timeout):
                    tally.record(
                        worker,
                        Case("hello", "none", "valid hello", b""),
                        Outcome("bad_reply", [], "valid hello refused"),
                    )
                    link.close()
                    link = None
                    continue
            try:
                case = make_case(rng, state, args.max_frame_bytes)
            except Exception:  # a bug of this benchmark, not of the server: say so, go on
                with tally.lock:
                    tally.generator_errors.append(traceback.format_exc()[-800:])
                continue
            probe += 1
            outcome = run_case(link, case, probe, args.hang_timeout)
        except OSError as exc:
            case = Case("connect", "none", "open a connection", b"")
            outcome = Outcome("dropped", [], f"connection failed: {exc!r}")
            link = None
        if outcome.status in FAILURE_STATUSES and server_gone(server):
            stop.set()  # the crash is the finding; what fails after it is its consequence
            break
        tally.record(worker, case, outcome)
        _learn(state, outcome)
        if outcome.status not in ("ok",) and link is not None:
            link.close()
            link = None
    if link is not None:
        link.close()


# -- HTTP ---------------------------------------------------------------------------------------


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, bytes | msgpack.ExtType):
        return repr(value)
    return value


def http_case(rng: random.Random, state: ConnState) -> tuple[str, str, bytes, dict[str, str], str]:
    """Method, path, body, headers and a description of one mutated HTTP request."""
    kind = rng.choice(REQUEST_TYPES)
    msg = valid_request(rng, state, kind)
    path = "/v1/" + str(msg.pop("type"))
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    roll = rng.random()
    what = "valid"
    if roll < 0.5:
        what = "; ".join(mutate_message(rng, msg))
        msg.pop("type", None)
    body = json.dumps(_jsonable(msg)).encode()
    if 0.5 <= roll < 0.75:
        pick = rng.randrange(6)
        if pick == 0:
            depth = rng.choice([100, 1000, 100_000])
            body, what = b'{"reward": ' + b"[" * depth + b"]" * depth + b"}", f"nested {depth} deep"
        elif pick == 1:
            body, what = body.replace(b"1.0", b"1" + b"0" * 400, 1), "integer over a double"
        elif pick == 2:
            body, what = (
                body.replace(b"1.0", rng.choice([b"1e400", b"NaN", b"-Infinity"]), 1),
                "non-finite literal",
            )
        elif pick == 3:
            body, what = body[: rng.randrange(len(body) + 1)], "truncated JSON"
        elif pick == 4:
            body, what = rng.randbytes(rng.randint(0, 200)), "random bytes"
        else:
            body, what = b"[" + body + b"]", "array instead of an object"
    elif roll >= 0.75:
        pick = rng.randrange(4)
        if pick == 0:
            headers.pop("Authorization")
            what = "no token"
        elif pick == 1:
            headers["Content-Type"] = "text/plain"
            what = "text/plain"
        elif pick == 2:
            path, what = "/v1/" + rng.choice(["nope", "welcome", "", "hello/x"]), "unknown path"
        else:
            headers["Authorization"] = "Bearer wrong"
            what = "wrong token"
    return "POST", path, body, headers, f"{path}: {what}"


def http_worker(
    worker: int,
    args: argparse.Namespace,
    server: BenchServer,
    tally: Tally,
    count: int,
    stop: threading.Event,
) -> None:
    """Send ``count`` mutated HTTP requests on a keep-alive connection."""
    rng = random.Random(args.seed * 1000 + 500 + worker)
    state = ConnState()
    conn: http.client.HTTPConnection | None = None
    for _ in range(count):
        if stop.is_set():
            break
        try:
            method, path, body, headers, what = http_case(rng, state)
        except Exception:  # a bug of this benchmark, not of the server: say so, go on
            with tally.lock:
                tally.generator_errors.append(traceback.format_exc()[-800:])
            continue
        status = "dropped"
        for attempt in range(2):
            reused = conn is not None
            try:
                if conn is None:
                    conn = http.client.HTTPConnection(
                        "127.0.0.1", server.http_port, timeout=args.hang_timeout
                    )
                conn.request(method, path, body=body, headers=headers)
                reply = conn.getresponse()
                reply.read()
                status = f"{reply.status}"
                if reply.getheader("connection", "").lower() == "close":
                    conn.close()
                    conn = None
                break
            except TimeoutError:
                status = "hang"
            except (OSError, http.client.HTTPException) as exc:
                status = f"dropped ({type(exc).__name__})"
            if conn is not None:
                conn.close()
                conn = None
            if status == "hang" or not reused or attempt:
                break
            # A kept-alive connection the server had closed after the previous request (which
            # that request's outcome already counts): send this one again on a fresh one.
        case = Case(path, "http", what, body)
        if not status[0].isdigit() and server_gone(server):
            stop.set()
            break
        with tally.lock:
            tally.http_requests += 1
            tally.http_status[status] += 1
            if status == "hang" or status.startswith("5") or status.startswith("dropped"):
                key = signature(case, status)
                tally.failures.setdefault(key, []).append((case, Outcome(status, [], what)))
    if conn is not None:
        conn.close()


# -- the training client ------------------------------------------------------------------------


def trainer_process(address: str, seed: int, stop: Any, results: Any) -> None:
    """A real remote-mode PolicyClient stepping CartPole-v1 until ``stop`` is set."""
    import gymnasium as gym

    from rlserve import PolicyClient

    env = gym.make("CartPole-v1")
    errors: list[str] = []
    returns: list[float] = []
    steps = 0
    client: Any = None
    while not stop.is_set():
        try:
            if client is None:
                client = PolicyClient(
                    address, inference_mode="remote", token=TOKEN, client_name="fuzz-trainer"
                )
            obs, _ = env.reset(seed=seed + len(returns))
            eid = client.start_episode()
            total = 0.0
            while True:
                action = client.get_action(eid, obs)
                obs, reward, terminated, truncated, _ = env.step(action)
                client.log_returns(eid, float(reward))
                total += float(reward)
                steps += 1
                if terminated or truncated or stop.is_set():
                    client.end_episode(eid, obs, truncated=not terminated)
                    break
            returns.append(total)
        except Exception:
            errors.append(traceback.format_exc()[-1500:])
            if client is not None:
                with contextlib.suppress(Exception):
                    client.close()
            client = None
            time.sleep(0.5)
    if client is not None:
        with contextlib.suppress(Exception):
            client.close()
    results.put({"errors": errors, "episodes": len(returns), "steps": steps, "returns": returns})


# -- the run ------------------------------------------------------------------------------------


def _mib(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**20:.0f} MiB"


def save_findings(
    tally: Tally, folder: Path, recent_on_crash: list[Case]
) -> list[tuple[str, int, Path, str]]:
    """Write the first example of each distinct failure; return (key, count, file, example)."""
    folder.mkdir(parents=True, exist_ok=True)
    for old in [*folder.glob("finding-*.json"), *folder.glob("crash-suspect-*.json")]:
        old.unlink()
    saved = []
    items = sorted(tally.failures.items(), key=lambda kv: -len(kv[1]))
    for n, (key, examples) in enumerate(items):
        case, outcome = examples[0]
        path = folder / f"finding-{n:02d}.json"
        path.write_text(
            json.dumps(
                {
                    "failure": key,
                    "description": case.description,
                    "detail": outcome.detail,
                    "framing": case.framing,
                    "http": case.mutation == "http",
                    "path": case.msg_type,
                    "wire_hex": case.wire[:200_000].hex(),
                    "count": len(examples),
                },
                indent=1,
            )
        )
        saved.append((key, len(examples), path, case.description))
    for n, case in enumerate(recent_on_crash):
        path = folder / f"crash-suspect-{n:02d}.json"
        path.write_text(
            json.dumps(
                {
                    "failure": "crash suspect",
                    "description": case.description,
                    "framing": case.framing,
                    "http": False,
                    "path": case.msg_type,
                    "wire_hex": case.wire.hex(),
                }
            )
        )
        saved.append(("crash suspect", 1, path, case.description))
    return saved


def replay(args: argparse.Namespace) -> int:
    """Start a fresh server, send one saved finding after a valid hello, and say what happened."""
    finding = json.loads(Path(args.replay).read_text())
    wire = bytes.fromhex(finding["wire_hex"])
    with tempfile.TemporaryDirectory(prefix="rlserve-fuzz-") as tmp:
        server = start_server(_server_flags(args), Path(tmp))
        try:
            server.wait_for_weights()
            print(f"finding: {finding['failure']}\n  {finding['description']}")
            if finding.get("http"):
                conn = http.client.HTTPConnection(
                    "127.0.0.1", server.http_port, timeout=args.hang_timeout
                )
                headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
                conn.request("POST", finding["path"], body=wire, headers=headers)
                reply = conn.getresponse()
                print(f"HTTP {reply.status}: {reply.read()[:300]!r}")
            else:
                link = Link(server.address, args.hang_timeout)
                hello(link, ConnState(), args.hang_timeout)
                case = Case(
                    finding["path"],
                    "replay",
                    finding["description"],
                    wire,
                    framing=finding["framing"],
                )
                case.is_hello = _decoded_type(wire[4:]) == "hello"
                outcome = run_case(link, case, PROBE_ID_BASE, args.hang_timeout)
                print(
                    f"outcome: {outcome.status} {outcome.detail} replies {_brief(outcome.replies)}"
                )
                for reply in outcome.replies:
                    print(f"  {str(reply)[:300]}")
            time.sleep(1.0)
            print(f"server alive: {server.alive()}")
            if not server.alive() or "Traceback" in server.log():
                print("server log (tail):\n" + server.log()[-3000:])
        finally:
            server.stop()
    return 0


def _server_flags(args: argparse.Namespace) -> list[str]:
    return [
        "--spaces-from", "CartPole-v1",
        "--token", TOKEN,
        "--max-frame-bytes", str(args.max_frame_bytes),
        "--ppo-device", "cpu",
        "--seed", str(args.seed),
    ]  # fmt: skip


def run(args: argparse.Namespace) -> int:
    """The whole benchmark; returns the exit status."""
    findings = Path(args.findings)
    tmp = tempfile.TemporaryDirectory(prefix="rlserve-fuzz-")
    server = start_server(_server_flags(args), Path(tmp.name))
    ctx = mp.get_context("spawn")
    stop_trainer = ctx.Event()
    results = ctx.Queue()
    trainer = ctx.Process(
        target=trainer_process, args=(server.address, args.seed, stop_trainer, results)
    )
    tally = Tally()
    stop = threading.Event()
    crash: dict[str, Any] = {}
    client: dict[str, Any] | None = None
    try:
        server.wait_for_weights()
        trainer.start()
        time.sleep(args.warmup)
        rss_before = server.rss()
        budget = [args.frames]
        threads = [
            threading.Thread(
                target=fuzz_worker, args=(i, args, server, tally, budget, stop), daemon=True
            )
            for i in range(args.connections)
        ]
        per_http = -(-args.http_requests // max(args.http_connections, 1))
        threads += [
            threading.Thread(
                target=http_worker, args=(i, args, server, tally, per_http, stop), daemon=True
            )
            for i in range(args.http_connections if args.http_requests else 0)
        ]
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        last_report = started
        while any(t.is_alive() for t in threads):
            time.sleep(0.2)
            if not server.alive():
                crash = {"at_frame": tally.frames, "code": server.process.returncode}
                with tally.lock:
                    crash["recent"] = [c for cases in tally.recent.values() for c in cases[-1:]]
                crash["recent"] += tally.accepted_reports
                crash["seen_at"] = time.monotonic()
                stop.set()
                break
            with contextlib.suppress(OSError, ValueError):
                NEWEST_VERSION[0] = int(server.get_json("/v1/health", timeout=2)["weights_version"])
            if time.perf_counter() - last_report > 10:
                last_report = time.perf_counter()
                print(
                    f"  ... {tally.frames} frames, {tally.http_requests} HTTP requests", flush=True
                )
        for thread in threads:
            thread.join(args.hang_timeout + 5)
        elapsed = time.perf_counter() - started
        if not crash and not server.alive():
            crash = {"at_frame": tally.frames, "code": server.process.returncode}
            with tally.lock:
                crash["recent"] = [c for cases in tally.recent.values() for c in cases[-1:]]
                crash["recent"] += tally.accepted_reports
                crash["seen_at"] = time.monotonic()
        rss_after = server.rss()
        learner: dict[str, Any] = {}
        if server.alive():
            with contextlib.suppress(OSError, ValueError):
                metrics = server.get_json("/v1/metrics", token=TOKEN)
                learner = {k: v for k, v in metrics.items() if k.startswith("learner/")}
        stop_trainer.set()
        trainer.join(60)
        try:
            client = results.get(timeout=10)
        except queue.Empty:
            client = None
    finally:
        stop.set()
        stop_trainer.set()
        if trainer.is_alive():
            trainer.terminate()
        t0 = time.monotonic()
        exit_code = server.stop(timeout=30)
        stop_seconds = time.monotonic() - t0
    log = server.log()
    if client is None:
        client = {
            "errors": ["the training client process did not report (it died)"],
            "episodes": 0,
            "steps": 0,
            "returns": [],
        }
    tmp.cleanup()

    if crash:
        # A crashing server closes its connections a moment before its process is seen to exit:
        # failures from then on are the crash's consequences, not findings of their own.
        cutoff = crash["seen_at"] - 5.0
        after = sum(1 for v in tally.failures.values() for _, o in v if o.at >= cutoff)
        tally.failures = {
            k: kept
            for k, v in tally.failures.items()
            if (kept := [x for x in v if x[1].at < cutoff])
        }
        print(f"({after} failures in the 5 s before the crash was seen are not counted)")
    saved = save_findings(tally, findings, crash.get("recent", []))
    found = Counter(key.split(" | ")[0] for key, v in tally.failures.items() for _ in v)
    failures = {
        "server crashes (process exited)": 1 if crash else 0,
        "hangs (no reply within the hang timeout)": found["hang"] + found["http hang"],
        "training client errors": len(client["errors"]),
        "connections dropped without a reason": found["dropped"],
        "frames answered 0 or 2+ times": found["unanswered"] + found["extra_replies"],
        "undecodable replies": found["bad_reply"],
        "HTTP 5xx or dropped": sum(
            v for k, v in found.items() if k.startswith(("http 5", "http d"))
        ),
    }
    mean_return = float(np.mean(client["returns"][-20:])) if client["returns"] else float("nan")
    rows = [
        ("binary frames sent", f"{tally.frames} over {args.connections} connections"),
        ("  by mutation", ", ".join(f"{k} {v}" for k, v in tally.by_mutation.most_common())),
        ("  outcomes", ", ".join(f"{k} {v}" for k, v in tally.by_status.most_common())),
        ("  replies", ", ".join(f"{k} {v}" for k, v in tally.replies.most_common())),
        ("HTTP requests sent", str(tally.http_requests)),
        ("  by status", ", ".join(f"{k} {v}" for k, v in tally.http_status.most_common())),
        (
            "frames/s (binary + HTTP)",
            f"{(tally.frames + tally.http_requests) / max(elapsed, 1e-9):,.0f}"
            f" over {elapsed:.1f} s",
        ),
        (
            "server RSS before -> after",
            f"{_mib(rss_before.get('server'))} -> {_mib(rss_after.get('server'))}",
        ),
        (
            "learner RSS before -> after",
            f"{_mib(rss_before.get('learner'))} -> {_mib(rss_after.get('learner'))}",
        ),
        (
            "training client",
            f"{client['episodes']} episodes, {client['steps']} steps, "
            f"mean return of the last 20 {mean_return:.1f}",
        ),
        (
            "learner counters",
            ", ".join(
                f"{k.removeprefix('learner/')} {v:g}"
                for k, v in sorted(learner.items())
                if any(w in k for w in ("updates", "excluded", "skipped", "steps_trained"))
            )
            or "-",
        ),
        ("benchmark's own errors (cases not sent)", str(len(tally.generator_errors))),
        ("server stop (SIGTERM)", f"exit code {exit_code} after {stop_seconds:.1f} s"),
        ("tracebacks in the server log", str(log.count("Traceback"))),
    ]
    print()
    print("rlserve fuzz benchmark" + f" (--frames {args.frames} --seed {args.seed})")
    width = max([len(r[0]) for r in rows] + [len(k) + 2 for k in failures]) + 2
    for label, value in rows:
        print(f"{label:<{width}}{value}")
    print("failures (target 0 each):")
    for label, value in failures.items():
        print(f"  {label:<{width - 2}}{value}")
    if crash:
        print(
            f"the server exited with code {crash['code']} after about "
            f"{crash['at_frame']} frames; log tail:"
        )
        lines = [
            line[:200]
            for line in log.splitlines()
            if re.search(r"Error|Exception|Traceback|rlserve|failed", line)
        ]
        print("\n".join(lines[-15:]))
    for error in client["errors"][:3]:
        print("training client error:\n" + error)
    if saved:
        print(f"distinct failures ({len(saved)}), first example of each saved; repro with:")
        for key, count, path, example in saved:
            print(f"  [{count:>5}x] {key}\n          e.g. {example[:150]}")
            print(f"          {sys.executable} {Path(__file__)} --replay {path}")
    raised = Counter(
        re.sub(r"[0-9]+", "N", m.group(0))[:140]
        for m in re.finditer(r"^\w+(?:Error|Exception): .*$", log, re.MULTILINE)
    )
    if raised:
        print("exceptions in the server log (by kind):")
        for line, count in raised.most_common(12):
            print(f"  [{count:>5}x] {line}")
    for error in tally.generator_errors[:2]:
        print("benchmark error (not the server's):\n" + error)
    total = sum(failures.values())
    print(f"RESULT: {'FAIL' if total else 'PASS'} ({total} failures)")
    return 1 if total else 0


def main(argv: list[str] | None = None) -> int:
    """Parse the flags and run the benchmark (or one replay)."""
    # Extreme values are cast to float32 on purpose.
    np.seterr(all="ignore")
    warnings.filterwarnings("ignore", category=RuntimeWarning)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=100_000, help="mutated binary frames to send")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--connections", type=int, default=16, help="concurrent fuzzing connections"
    )
    parser.add_argument(
        "--http-requests",
        type=int,
        default=None,
        help="mutated HTTP requests (default: frames / 20)",
    )
    parser.add_argument("--http-connections", type=int, default=2)
    parser.add_argument(
        "--hang-timeout", type=float, default=10.0, help="seconds before a missing reply is a hang"
    )
    parser.add_argument(
        "--max-frame-bytes", type=int, default=1 << 20, help="the server's frame limit"
    )
    parser.add_argument(
        "--warmup", type=float, default=2.0, help="seconds the client trains before fuzzing"
    )
    parser.add_argument("--findings", default="fuzz-findings", help="folder for the failing cases")
    parser.add_argument("--replay", help="a saved finding: start a server and send it again")
    args = parser.parse_args(argv)
    if args.http_requests is None:
        args.http_requests = args.frames // 20
    if args.replay:
        return replay(args)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
