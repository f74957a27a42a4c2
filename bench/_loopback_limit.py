"""The bare loopback limit of remote inference: one msgpack round trip per step to an echo server.

``bench/remote_inference.py`` runs its client loop against this as well as against rlserve, in
the same run, so each rlserve figure can be read as a share of what the machine allows:

* :class:`EchoClient` has the four calls the benchmark's loop makes (``start_episode``,
  ``get_action``, ``log_returns``, ``end_episode``). Per step it sends one frame with the bytes
  rlserve's :class:`~rlserve.PolicyClient` sends for a single-episode ``get_action``
  (``docs/protocol.md`` sections 3.1 and 7.3: a 4-byte big-endian length, then a msgpack map
  ``type``, ``episode_id`` (32 hex characters), ``observation`` (an ndarray extension, type 1),
  ``seq``, ``reward`` (from an episode's second step) and ``id``: 128 bytes for CartPole) and
  reads one ``action`` reply (29 bytes). Starting and ending an episode costs no round trip.
* The echo server (this file run as a script) is a minimal asyncio protocol, on uvloop when it is
  installed as rlserve's server is: it cuts frames, decodes each body with ``msgpack.unpackb``
  and answers ``{"type": "action", "id": <the request's id>, "action": 0}``. No policy, no
  validation, no episode state.
* With ``--policy`` (``bench/remote_inference.py --limit-policy``) the server is the floor of a
  Python and numpy policy server instead: it batches the requests of one event-loop pass as
  rlserve's does, reads each observation from its ndarray extension, runs one forward pass of
  an MLP of rlserve's default shape (two hidden layers of 64, tanh) over the batch, samples each
  action from the softmax and answers. Still no validation, no episode state, no experience log,
  no learner: what any Python server that runs a numpy policy per step cannot avoid.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import signal
import socket
import struct
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

from _launch import ListeningProcess
from _proc_cpu import rss_kib

HEADER = struct.Struct(">I")
"""The frame length prefix (``docs/protocol.md`` section 3.1)."""

NDARRAY_EXT = 1
"""msgpack extension type of an ndarray (``docs/protocol.md`` section 5.3)."""

FIXED_ACTION = 0
"""The action every echo reply carries."""

_FLOAT32_HEADERS: dict[tuple[int, ...], bytes] = {}
"""ndarray payload headers by shape: dtype code 10 (float32), ndim, little-endian u32 dims."""


def _float32_header(shape: tuple[int, ...]) -> bytes:
    header = _FLOAT32_HEADERS.get(shape)
    if header is None:
        header = bytes([10, len(shape)]) + struct.pack(f"<{len(shape)}I", *shape)
        _FLOAT32_HEADERS[shape] = header
    return header


def float32_ext(observation: Any) -> msgpack.ExtType:
    """``observation`` as a float32 ndarray extension value (``docs/protocol.md`` section 5.3)."""
    obs = np.asarray(observation, dtype="<f4")
    return msgpack.ExtType(NDARRAY_EXT, _float32_header(obs.shape) + obs.tobytes())


LISTENING = re.compile(r"echo listening on (\S+):(\d+)")


# -- the server ---------------------------------------------------------------------------------


def _action_frame(request_id: int, action: int) -> bytes:
    """The framed ``action`` reply to request ``request_id``."""
    body = msgpack.packb({"type": "action", "id": request_id, "action": action})
    return HEADER.pack(len(body)) + body


class FramedProtocol(asyncio.Protocol):
    """Cut the bytes of a connection into frames and hand each read's requests to :meth:`handle`."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Keep the transport to write replies to."""
        self._transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        """Cut frames and decode each; keep a partial frame for the next read."""
        buffer = self._buffer
        buffer += data
        offset, requests = 0, []
        while len(buffer) - offset >= 4:
            (length,) = HEADER.unpack_from(buffer, offset)
            end = offset + 4 + length
            if len(buffer) < end:
                break
            requests.append(msgpack.unpackb(bytes(buffer[offset + 4 : end])))
            offset = end
        del buffer[:offset]
        if requests:
            self.handle(requests)

    def handle(self, requests: list[dict[str, Any]]) -> None:
        """Answer the requests of one read."""
        raise NotImplementedError

    def write(self, data: bytes) -> None:
        """Write reply bytes, unless the connection is gone."""
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(data)


class EchoProtocol(FramedProtocol):
    """Answer every complete frame with a fixed ``action`` reply carrying the request's id."""

    def handle(self, requests: list[dict[str, Any]]) -> None:
        """One write for the replies of one read."""
        self.write(b"".join(_action_frame(r["id"], FIXED_ACTION) for r in requests))


class PolicyFloor:
    """The requests of one event-loop pass, answered by one numpy forward pass over them."""

    HIDDEN = 64
    """Width of the two hidden layers (rlserve's default MLP)."""

    def __init__(self, obs_dim: int = 4, actions: int = 2, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        sizes = [obs_dim, self.HIDDEN, self.HIDDEN, actions]
        self._layers = [
            (
                rng.normal(0, 1 / np.sqrt(n_in), (n_in, n_out)).astype(np.float32),
                np.zeros(n_out, np.float32),
            )
            for n_in, n_out in itertools.pairwise(sizes)
        ]
        self._rng = rng
        self._pending: list[tuple[PolicyFloorProtocol, int, np.ndarray]] = []

    def submit(self, protocol: PolicyFloorProtocol, request_id: int, obs: np.ndarray) -> None:
        """Queue one request; the first of a pass schedules the flush after the pass."""
        if not self._pending:
            asyncio.get_running_loop().call_soon(self._flush)
        self._pending.append((protocol, request_id, obs))

    def _flush(self) -> None:
        pending, self._pending = self._pending, []
        x = np.stack([obs for _, _, obs in pending])
        last = len(self._layers) - 1
        for i, (weight, bias) in enumerate(self._layers):
            x = x @ weight + bias
            if i < last:
                np.tanh(x, out=x)
        x -= x.max(axis=1, keepdims=True)
        probs = np.exp(x)
        probs /= probs.sum(axis=1, keepdims=True)
        draws = self._rng.random(len(pending))[:, None]
        actions = (probs.cumsum(axis=1) < draws).sum(axis=1).tolist()
        for (protocol, request_id, _), action in zip(pending, actions, strict=True):
            protocol.reply(request_id, action)


class PolicyFloorProtocol(FramedProtocol):
    """Read each request's observation and hand it to the shared :class:`PolicyFloor`."""

    def __init__(self, floor: PolicyFloor) -> None:
        super().__init__()
        self._floor = floor

    def handle(self, requests: list[dict[str, Any]]) -> None:
        """Submit each request; the floor answers after the event loop's pass."""
        for request in requests:
            payload = request["observation"].data
            obs = np.frombuffer(payload, np.float32, offset=2 + 4 * payload[1])
            self._floor.submit(self, request["id"], obs)

    def reply(self, request_id: int, action: int) -> None:
        """Write the ``action`` reply to one request."""
        self.write(_action_frame(request_id, action))


async def _serve(policy: bool = False) -> None:
    loop = asyncio.get_running_loop()
    if policy:
        floor = PolicyFloor()
        server = await loop.create_server(lambda: PolicyFloorProtocol(floor), "127.0.0.1", 0)
    else:
        server = await loop.create_server(EchoProtocol, "127.0.0.1", 0)
    host, port = server.sockets[0].getsockname()[:2]
    print(f"echo listening on {host}:{port}", flush=True)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    async with server:
        await stop.wait()


def serve(policy: bool = False) -> None:
    """Run the echo server (``policy``: the policy floor) until SIGTERM, on uvloop if present."""
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(_serve(policy))


class EchoServer:
    """The echo server as a process, shaped like the benchmark's ``rlserve serve`` handle.

    ``policy``: run the policy floor (:class:`PolicyFloor`) instead of the echo.

    ``listening_s``: launch to the listening line; ``first_action_s``: launch to the first reply.
    """

    def __init__(self, policy: bool = False) -> None:
        launched = time.monotonic()
        command = [sys.executable, str(Path(__file__).resolve())] + (["--policy"] if policy else [])
        self._launched = ListeningProcess(command, LISTENING, "the echo server")
        self.process, self.lines = self._launched.process, self._launched.lines
        self.listening_s = time.monotonic() - launched
        match = self._launched.match
        self.address = f"{match.group(1)}:{match.group(2)}"
        probe = EchoClient(self.address)
        probe.get_action(probe.start_episode(), np.zeros(4, dtype=np.float32))
        probe.close()
        self.first_action_s = time.monotonic() - launched

    def metrics(self) -> dict[str, Any]:
        """No metrics: the echo server counts nothing."""
        return {}

    def learner_pids(self) -> list[int]:
        """No learner."""
        return []

    def memory_mib(self) -> dict[str, float]:
        """RSS of the echo server process."""
        server = rss_kib(self.process.pid) / 1024
        return {"server_mib": server, "learner_mib": 0.0, "total_mib": server}

    def stop(self) -> None:
        """SIGTERM, and wait for it to exit."""
        self._launched.stop(grace_s=10)


# -- the client ---------------------------------------------------------------------------------


class EchoClient:
    """The calls of the benchmark's client loop, one echo round trip per ``get_action``.

    Args:
        address: ``host:port`` of the echo server.
        index: Unused; the signature of the benchmark's client factory.
    """

    def __init__(self, address: str, index: int = 0):
        host, port = address.rsplit(":", 1)
        self._sock = socket.create_connection((host, int(port)), timeout=60)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._next_id = 1
        self._seq: dict[str, int] = {}
        self._reward: dict[str, float] = {}
        self._buffer = b""

    def start_episode(self, training_enabled: bool = True) -> str:
        """A fresh episode id, as rlserve's client makes one (no round trip)."""
        episode_id = uuid.uuid4().hex
        self._seq[episode_id] = 0
        return episode_id

    def get_action(self, episode_id: str, observation: Any) -> int:
        """Send the ``get_action`` frame rlserve's client sends and read the reply's action."""
        request_id = self._send(self._get_action_message(episode_id, observation))
        reply = self._read_frame()
        if reply.get("id") != request_id:
            raise RuntimeError(f"echo reply {reply!r} does not answer request {request_id}")
        return int(reply["action"])

    def _get_action_message(self, episode_id: str, observation: Any) -> dict[str, Any]:
        """The episode's next single-episode ``get_action``, with the pending reward."""
        seq = self._seq[episode_id] = self._seq[episode_id] + 1
        message: dict[str, Any] = {
            "type": "get_action",
            "episode_id": episode_id,
            "observation": float32_ext(observation),
            "seq": seq,
        }
        reward = self._reward.pop(episode_id, None)
        if reward is not None:
            message["reward"] = reward
        return message

    def _send(self, message: dict[str, Any]) -> int:
        """Frame ``message`` with the next request id and send it; the id."""
        request_id = message["id"] = self._next_id
        self._next_id += 1
        body = msgpack.packb(message, use_bin_type=True)
        self._sock.sendall(HEADER.pack(len(body)) + body)
        return request_id

    def log_returns(self, episode_id: str, reward: float) -> None:
        """Keep the reward for the episode's next ``get_action``."""
        self._reward[episode_id] = self._reward.get(episode_id, 0.0) + reward

    def end_episode(self, episode_id: str, observation: Any, truncated: bool = False) -> None:
        """Forget the episode (no round trip)."""
        self._seq.pop(episode_id, None)
        self._reward.pop(episode_id, None)

    def close(self) -> None:
        """Close the socket."""
        self._sock.close()

    def _read_frame(self) -> dict[str, Any]:
        buffer = self._buffer
        while True:
            if len(buffer) >= 4:
                end = 4 + HEADER.unpack_from(buffer)[0]
                if len(buffer) >= end:
                    self._buffer = buffer[end:]
                    return dict(msgpack.unpackb(buffer[4:end]))
            data = self._sock.recv(1 << 16)
            if not data:
                raise ConnectionError("the echo server closed the connection")
            buffer += data


if __name__ == "__main__":
    serve(policy="--policy" in sys.argv[1:])
