"""Nothing a client sends stops or wedges the server (issue 6: findings 1, 7, 8 and 10's HTTP part).

Every test talks to a real server over real sockets: extreme values, malformed frames, a client
that never reads, connections that never say hello, too many connections, slow and hostile HTTP.
"""

from __future__ import annotations

import json
import select
import socket
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import httpx
import numpy as np
import pytest
from e2e_support import RawSocket

from rlserve import PolicyClient
from rlserve.protocol.codec import encode
from rlserve.protocol.framing import frame
from rlserve.protocol.spaces import describe

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

HELLO_TIMEOUT = 1.5
REQUEST_TIMEOUT = 5.0
ALLOWED_ORIGIN = "https://ok.example"
OBS_SPACE = gym.spaces.Box(-np.inf, np.inf, (4,), np.float64)
GOOD = np.zeros(4, dtype=np.float64)


@pytest.fixture(scope="module")
def server(module_launcher: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    spaces_file = tmp_path_factory.mktemp("spaces") / "float64.json"
    spaces_file.write_text(
        json.dumps(
            {
                "observation_space": describe(OBS_SPACE),
                "action_space": describe(gym.spaces.Discrete(2)),
            }
        )
    )
    handle = module_launcher(
        "--hello-timeout",
        str(HELLO_TIMEOUT),
        "--http-request-timeout",
        str(REQUEST_TIMEOUT),
        "--http-allowed-origins",
        ALLOWED_ORIGIN,
        "--seed",
        "6",
        spaces=("--spaces-file", str(spaces_file)),
    )
    handle.wait_for_weights()
    return handle


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _assert_serving(server: Any) -> None:
    """The server is alive and a normal episode still gets actions."""
    assert server.alive(), server.log()
    with RawSocket(server.address) as raw:
        raw.hello()
        eid = raw.request({"type": "start_episode", "id": 1})["episode_id"]
        reply = raw.request({"type": "get_action", "id": 2, "episode_id": eid, "observation": GOOD})
        assert reply["type"] == "action", reply
        assert (
            raw.request({"type": "end_episode", "id": 3, "episode_id": eid, "observation": GOOD})[
                "type"
            ]
            == "ok"
        )
    assert server.health()["status"] == "ok"


def _fragment(steps: int = 3, **changes: Any) -> dict[str, Any]:
    fragment = {
        "episode_id": "f-" + str(time.monotonic_ns()),
        "obs": np.zeros((steps + 1, 4), np.float32),
        "actions": np.zeros(steps, np.int64),
        "rewards": np.ones(steps, np.float32),
        "policy_chosen": np.ones(steps, bool),
        "behaviour_logp": np.full(steps, -0.69, np.float32),
        "weights_version": np.zeros(steps, np.int64),
        "terminated": True,
        "truncated": False,
    }
    fragment.update(changes)
    return fragment


# -- finding 1: values checked after the float32 cast -----------------------------------------

EXTREME_CALLS = {
    "observation_1e39": lambda eid: {
        "type": "get_action",
        "episode_id": eid,
        "observation": np.array([1e39, 0, 0, 0], np.float64),
    },
    "get_action_reward": lambda eid: {
        "type": "get_action",
        "episode_id": eid,
        "observation": GOOD,
        "reward": -1e39,
    },
    "batched_rewards": lambda eid: {
        "type": "get_action",
        "episode_ids": [eid],
        "observations": GOOD[None],
        "rewards": [3e38],
    },
    "log_action_reward": lambda eid: {
        "type": "log_action",
        "episode_id": eid,
        "observation": GOOD,
        "action": 1,
        "reward": -1e39,
    },
    "log_returns": lambda eid: {"type": "log_returns", "episode_id": eid, "reward": -1e39},
    "end_episode_reward": lambda eid: {
        "type": "end_episode",
        "episode_id": eid,
        "observation": GOOD,
        "reward": 3e38,
    },
    "end_episode_observation": lambda eid: {
        "type": "end_episode",
        "episode_id": eid,
        "observation": np.array([0, -1e39, 0, 0], np.float64),
    },
    "report_rewards_3e38": lambda eid: {
        "type": "report_samples",
        "batch_id": "r-" + eid,
        "fragments": [_fragment(rewards=np.full(3, 3e38, np.float32))],
    },
    "report_logp_minus_1e30": lambda eid: {
        "type": "report_samples",
        "batch_id": "l-" + eid,
        "fragments": [_fragment(behaviour_logp=np.full(3, -1e30, np.float32))],
    },
    "report_obs_1e39": lambda eid: {
        "type": "report_samples",
        "batch_id": "o-" + eid,
        "fragments": [_fragment(obs=np.full((4, 4), 1e39, np.float64))],
    },
}


@pytest.mark.parametrize("case", sorted(EXTREME_CALLS))
def test_extreme_values_are_refused_and_the_server_keeps_training(server: Any, case: str) -> None:
    with RawSocket(server.address) as raw:
        raw.hello()
        eid = raw.request({"type": "start_episode", "id": 1})["episode_id"]
        first = raw.request({"type": "get_action", "id": 2, "episode_id": eid, "observation": GOOD})
        assert first["type"] == "action", first
        reply = raw.request({**EXTREME_CALLS[case](eid), "id": 3})
        assert reply["type"] == "error" and reply["code"] == "bad_value", reply
        assert "float32" in reply["message"] and "e+" in reply["message"], reply
        # The episode is untouched: it carries on normally.
        reply = raw.request({"type": "log_returns", "id": 4, "episode_id": eid, "reward": 1.0})
        assert reply["type"] == "ok", reply
        good = {"type": "report_samples", "id": 5, "batch_id": "good-" + case}
        reply = raw.request({**good, "fragments": [_fragment()]})
        assert reply["type"] == "samples_accepted", reply
    _assert_serving(server)


# -- finding 8: malformed frames get a reply and the connection keeps answering -------------


def test_malformed_frames_get_replies_and_the_connection_answers(server: Any) -> None:
    with RawSocket(server.address) as raw:
        raw.hello()
        eid = raw.request({"type": "start_episode", "id": 1})["episode_id"]
        # Pipelined: a get_action, then the bad frames, then a ping, all before reading.
        raw.send({"type": "get_action", "id": 2, "episode_id": eid, "observation": GOOD})
        raw.send(
            {
                "type": "report_samples",
                "id": 3,
                "batch_id": "arr",
                "fragments": [_fragment()],
                "episodes": np.zeros(3),
            }
        )
        raw.send(
            {
                "type": "log_action",
                "id": 4,
                "episode_id": eid,
                "observation": GOOD,
                "action": np.array([0, 1, 1]),
            }
        )
        raw.send({"type": "ping", "id": 5})
        replies = [raw.receive() for _ in range(4)]
        assert [r["id"] for r in replies if r is not None] == [2, 3, 4, 5], replies
        assert replies[0]["type"] == "action"
        assert replies[1]["type"] == "error" and replies[1]["code"] == "decode_error"
        assert replies[2]["type"] == "error" and replies[2]["code"] == "bad_value"
        assert "shape (3,)" in replies[2]["message"]
        assert replies[3] == {"type": "pong", "id": 5}
    assert "Traceback" not in server.log()


def test_a_frame_of_millions_of_small_containers_is_refused_and_the_connection_answers(
    server: Any,
) -> None:
    """16 MiB of empty arrays (250 arrays of 65,535, each within max_container_len) used to be
    decoded whole on the event loop: 16M objects, seconds of stall and a gigabyte."""
    with RawSocket(server.address, timeout=60) as raw:
        raw.hello()
        raw.send_packed({"type": "ping", "id": 1, "x": [[[]] * 65_535] * 250})
        raw.send({"type": "ping", "id": 2})
        refused = raw.receive()
        assert refused is not None and refused["type"] == "error", refused
        assert refused["code"] == "limit_exceeded" and refused["id"] is None, refused
        assert "max_containers_per_frame" in refused["message"]
        assert raw.receive() == {"type": "pong", "id": 2}
    assert "Traceback" not in server.log()


# -- finding 7: back-pressure and hygiene of the binary carrier -------------------------------


def test_a_client_that_never_reads_does_not_grow_server_memory(server: Any) -> None:
    pid = server.process.pid
    with RawSocket(server.address) as warm:
        warm.hello()
        assert warm.request({"type": "get_weights", "id": 1})["type"] == "weights"
    before = _rss_kib(pid)
    with RawSocket(server.address) as raw:
        raw.hello()
        sock = raw.sock
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        frames = b"".join(frame(encode({"type": "get_weights", "id": i})) for i in range(5000))
        sent = 0
        deadline = time.monotonic() + 10
        while sent < len(frames) and time.monotonic() < deadline:
            try:
                sent += sock.send(frames[sent : sent + 65536])
            except BlockingIOError:
                time.sleep(0.05)
        time.sleep(2.0)  # let the server do whatever it would do with them
        grown_mib = (_rss_kib(pid) - before) / 1024
        # Unbounded, 5,000 replies of ~40 kB would be ~190 MiB.
        assert grown_mib < 40, f"server RSS grew by {grown_mib:.0f} MiB"
    _assert_serving(server)


def test_big_frames_wait_for_hello(server: Any) -> None:
    padding = "x" * 100_000
    with RawSocket(server.address) as raw:
        raw.send({"type": "ping", "id": 1, "padding": padding})
        reply = raw.receive()
        assert reply is not None and reply["code"] == "frame_too_large", reply
        assert "before a successful hello" in reply["message"]
        assert raw.receive() is None
    with RawSocket(server.address) as raw:
        raw.hello()
        assert raw.request({"type": "ping", "id": 1, "padding": padding})["type"] == "pong"


def test_a_connection_without_hello_is_closed_after_the_deadline(server: Any) -> None:
    with RawSocket(server.address) as raw:
        reply = raw.receive(timeout=HELLO_TIMEOUT + 20)
        assert reply is not None and reply["code"] == "timeout", reply
        assert "hello" in reply["message"]
        assert raw.receive() is None
    with RawSocket(server.address) as raw:  # a client that says hello is not affected
        raw.hello()
        time.sleep(HELLO_TIMEOUT + 0.5)
        assert raw.request({"type": "ping", "id": 7}) == {"type": "pong", "id": 7}


def test_the_connection_cap_answers_capacity(launch_server: Any) -> None:
    server = launch_server("--max-connections", "3")
    sockets = [RawSocket(server.address) for _ in range(3)]
    try:
        for raw in sockets:
            raw.hello()
        with RawSocket(server.address) as extra:
            reply = extra.receive()
            assert reply is not None and reply["code"] == "capacity", reply
            assert "max_connections" in reply["message"]
            assert extra.receive() is None
        sockets.pop().close()
        deadline = time.monotonic() + 20
        while True:  # the freed slot is usable once the server saw the close
            with RawSocket(server.address) as again:
                again.send({"type": "hello", "id": 0, "protocol_version": 1})
                if (again.receive() or {}).get("type") == "welcome":
                    break
            assert time.monotonic() < deadline, "the freed connection slot never came back"
            time.sleep(0.1)
    finally:
        for raw in sockets:
            raw.close()


# -- finding 7 and 10: the HTTP carrier -------------------------------------------------------


def test_http_needs_json_content_type(server: Any) -> None:
    with httpx.Client(base_url=server.http_url, timeout=30) as http:
        reply = http.post("/v1/ping", content=b"{}", headers={"content-type": "text/plain"})
        assert reply.status_code == 415, reply.text
        assert "Content-Type: application/json" in reply.json()["message"]
        reply = http.post("/v1/ping", content=b"{}")
        assert reply.status_code == 415
        assert http.post("/v1/ping", json={}).status_code == 200


def test_the_http_layers_own_refusals_count_as_error_replies(server: Any) -> None:
    before = server.metrics()["server/errors"]
    with httpx.Client(base_url=server.http_url, timeout=30) as http:
        refusals = [
            http.post("/v1/no_such_type", json={}),  # 404
            http.get("/v1/ping"),  # 405
            http.post("/v1/ping", content=b"{}", headers={"content-type": "text/plain"}),  # 415
            http.post("/v1/ping", content=b"{", headers={"content-type": "application/json"}),
        ]
    assert [r.status_code for r in refusals] == [404, 405, 415, 400]
    assert server.metrics()["server/errors"] - before == len(refusals)


def test_http_refuses_foreign_origins_and_hosts(server: Any) -> None:
    with httpx.Client(base_url=server.http_url, timeout=30) as http:
        evil = http.post("/v1/ping", json={}, headers={"origin": "https://evil.example"})
        assert evil.status_code == 403, evil.text
        assert "http_allowed_origins" in evil.json()["message"]
        assert http.post("/v1/ping", json={}, headers={"origin": ALLOWED_ORIGIN}).is_success
        own = server.http_url
        assert http.post("/v1/ping", json={}, headers={"origin": own}).is_success
        rebound = http.post("/v1/ping", json={}, headers={"host": "attacker.example:80"})
        assert rebound.status_code == 421, rebound.text
        assert http.get("/v1/health", headers={"host": "attacker.example"}).status_code == 421
        for host in ("localhost:1", "127.0.0.1", "[::1]:9"):
            assert http.post("/v1/ping", json={}, headers={"host": host}).is_success, host


def test_http_deeply_nested_json_is_a_decode_error(server: Any) -> None:
    body = b"[" * 1000 + b"]" * 1000
    wrapped = b'{"info": ' + body + b"}"
    with httpx.Client(base_url=server.http_url, timeout=30) as http:
        for payload in (body, wrapped, b'{"x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"):
            reply = http.post(
                "/v1/ping", content=payload, headers={"content-type": "application/json"}
            )
            assert reply.status_code == 400, reply.text
            assert reply.json()["code"] == "decode_error"


def _json_array(item: bytes, count: int) -> bytes:
    return b"[" + b",".join([item] * count) + b"]"


@pytest.mark.parametrize(
    ("info", "limit"),
    [
        (_json_array(b"{}", 5_000_000), "max_container_len (65536)"),
        (_json_array(_json_array(b"[]", 60_000), 20), "max_containers_per_frame"),
    ],
    ids=["5M objects in one array", "20 arrays of 60,000 arrays"],
)
def test_http_bodies_over_the_decode_limits_are_refused_like_binary_frames(
    server: Any, info: bytes, limit: str
) -> None:
    """15 MB of {} in one info used to be parsed whole and handed back to the event loop (a 400,
    after +500 MB and seconds of unpickling); now the worker refuses it as a binary frame is."""
    body = b'{"id": 7, "episode_id": "nobody", "reward": 0, "info": ' + info + b"}"
    with httpx.Client(base_url=server.http_url, timeout=60) as http:
        reply = http.post(
            "/v1/log_returns", content=body, headers={"content-type": "application/json"}
        )
        assert reply.status_code == 413, reply.text
        assert reply.json()["code"] == "limit_exceeded"
        assert limit in reply.json()["message"]
        assert http.post("/v1/ping", json={"id": 8}).json() == {"type": "pong", "id": 8}
    assert "Traceback" not in server.log()


def _http_request(server: Any, body: bytes, path: str = "/v1/ping") -> bytes:
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{server.http_port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def test_a_large_body_does_not_stall_binary_clients(server: Any) -> None:
    """While a big body is parsed, a binary ping is answered before the HTTP reply comes.

    The body (15 MB, about a second of parsing) is sent but for its last byte; the last byte goes,
    then the ping. A server that parsed on its event loop would be inside the parse when the
    ping arrives and would write the HTTP reply first; ours parses in a worker process.
    """
    observations = ",".join(["[]"] * 5_000_000)  # parses slowly, becomes a tiny array
    body = '{"id": 1, "episode_ids": ["nobody"], "observations": [' + observations + "]}"
    request = _http_request(server, body.encode(), "/v1/get_action")
    with RawSocket(server.address) as binary:
        binary.hello()
        for attempt in range(2):
            http = socket.create_connection(("127.0.0.1", server.http_port), 30)
            try:
                http.sendall(request[:-1])
                time.sleep(0.5)  # the server reads all but the last byte meanwhile
                http.sendall(request[-1:])
                time.sleep(0.2)  # and starts parsing
                binary.send({"type": "ping", "id": 100 + attempt})
                readable, _, _ = select.select([binary.sock, http], [], [], 60)
                if binary.sock not in readable:
                    http.settimeout(10)
                    raise AssertionError(f"the HTTP reply came first: {http.recv(300)!r}")
                assert binary.receive() == {"type": "pong", "id": 100 + attempt}
                http.settimeout(60)
                reply = http.recv(65536)
                assert reply.startswith(b"HTTP/1.1 409"), reply  # an unknown episode
            finally:
                http.close()


def test_slow_loris_http_connections_are_closed(server: Any) -> None:
    conn = socket.create_connection(("127.0.0.1", server.http_port), 30)
    try:
        conn.settimeout(0.2)
        request = _http_request(server, b"{}")
        deadline = time.monotonic() + 30
        closed = False
        for byte in request[:-1]:  # never complete
            try:
                conn.send(bytes([byte]))
                if conn.recv(1024) == b"":
                    closed = True
                    break
            except TimeoutError:
                pass
            except OSError:
                closed = True
                break
            assert time.monotonic() < deadline
        assert closed, "a request trickled for ever was never cut"
    finally:
        conn.close()


def _reply_then_close(conn: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (fails after 30 s)."""
    conn.settimeout(30)
    received = b""
    while chunk := conn.recv(65536):
        received += chunk
    return received


@pytest.mark.parametrize("case", ["body too slow", "body too large"])
def test_a_reply_to_a_body_left_unread_closes_the_connection(server: Any, case: str) -> None:
    """The rest of such a body cannot be told from a next request: the reply ends the connection."""
    with socket.create_connection(("127.0.0.1", server.http_port), 30) as conn:
        if case == "body too slow":
            conn.sendall(_http_request(server, b'{"id": 1}')[:-3])  # 3 bytes short, for ever
            status = b" 408 "
        else:
            head = _http_request(server, b"")
            conn.sendall(head.replace(b"Content-Length: 0", b"Content-Length: 999999999999"))
            status = b" 413 "
        reply = _reply_then_close(conn)  # a connection kept open would time this out
    assert status in reply.split(b"\r\n", 1)[0], reply[:200]
    assert b"connection: close" in reply.lower()


def test_http_clients_dropping_mid_body_log_no_traceback(server: Any) -> None:
    for _ in range(20):
        conn = socket.create_connection(("127.0.0.1", server.http_port), 30)
        head = _http_request(server, b"")
        head = head.replace(b"Content-Length: 0", b"Content-Length: 100000")
        conn.sendall(head + b'{"id": 1, "padding": "' + b"x" * 1000)
        conn.close()
    _assert_serving(server)
    with httpx.Client(base_url=server.http_url, timeout=30) as http:
        assert http.post("/v1/ping", json={}).is_success
    log = server.log()
    assert "Traceback" not in log, log
    assert log.count("disconnected mid-request") <= 1, log


def test_idle_connections_are_closed_and_clients_reconnect_transparently(
    launch_server: Any,
) -> None:
    server = launch_server("--idle-timeout", "1", "--connection-idle-timeout", "1.5")
    server.wait_for_weights()
    with RawSocket(server.address) as raw:
        raw.hello()
        assert raw.receive(timeout=30) is None  # closed, without an error frame
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=1)
    with PolicyClient(server.address, inference_mode="remote", timeout=30) as client:
        eid = client.start_episode()
        client.get_action(eid, obs)
        client.end_episode(eid, obs)
        time.sleep(3.0)  # the server closes the quiet connection meanwhile
        eid = client.start_episode()
        assert client.action_space.contains(client.get_action(eid, obs))
        client.end_episode(eid, obs)
        assert client._conn.reconnects >= 1
    assert server.wait_until(lambda m: m["episodes/completed"] >= 2)
