"""The HTTP/JSON carrier, metrics endpoints and tokens, against a live server."""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import httpx
import numpy as np
import pytest
from e2e_support import RawSocket, play_cartpole
from prometheus_client.parser import text_string_to_metric_families

from rlserve import AuthenticationError, PolicyClient

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

TOKEN = "s3cret-token"
GOOD = [0.01, -0.02, 0.03, 0.04]


@pytest.fixture(scope="module")
def server(module_launcher: Any) -> Any:
    handle = module_launcher("--max-frame-bytes", "65536", "--seed", "6")
    handle.wait_for_weights()
    return handle


@pytest.fixture(scope="module")
def http(server: Any) -> Any:
    with httpx.Client(base_url=server.http_url, timeout=30) as client:
        yield client


@pytest.fixture(scope="module")
def token_server(module_launcher: Any) -> Any:
    handle = module_launcher("--token", TOKEN)
    return handle


def _ok(reply: httpx.Response) -> dict[str, Any]:
    assert reply.status_code == 200, reply.text
    assert reply.headers["content-type"].startswith("application/json")
    return reply.json()


def _error(reply: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert reply.status_code == status, reply.text
    assert reply.headers["content-type"].startswith("application/json")
    body = reply.json()
    assert body["type"] == "error", body
    assert body["code"] == code, body
    assert isinstance(body["message"], str) and body["message"]
    return body


def test_http_port_accepts_connections_once_announced(launch_server: Any) -> None:
    """A script that reads the listening line and connects at once must not be refused."""

    def connect_both(line: re.Match[str]) -> list[str]:
        outcome = []
        for port in (line["port"], line["http_port"]):
            try:
                socket.create_connection(("127.0.0.1", int(port)), 5).close()
                outcome.append("accepted")
            except OSError as exc:
                outcome.append(f"refused: {exc}")
        return outcome

    server = launch_server(wait_http=False, on_listening=connect_both)
    assert server.on_listening_result == ["accepted", "accepted"]


def test_health(server: Any, http: httpx.Client) -> None:
    body = _ok(http.get("/v1/health"))
    assert body["status"] == "ok"
    assert body["protocol_version"] == 1
    assert isinstance(body["server_version"], str)
    assert body["weights_version"] >= 0


def test_hello(http: httpx.Client) -> None:
    body = _ok(http.post("/v1/hello", json={"protocol_version": 1, "id": 3}))
    assert body["type"] == "welcome"
    assert body["id"] == 3
    policy = body["policies"]["default"]
    assert policy["observation_space"]["type"] == "Box"
    assert policy["observation_space"]["shape"] == [4]
    assert policy["action_space"] == {"type": "Discrete", "n": 2, "start": 0}
    assert "remote" in body["inference_modes"]
    _error(http.post("/v1/hello", json={"protocol_version": 99}), 400, "version_mismatch")


def test_cartpole_episode_over_http(http: httpx.Client) -> None:
    before = _ok(http.get("/v1/metrics"))
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=8)
    started = _ok(http.post("/v1/start_episode", json={"id": 1}))
    assert started["type"] == "episode_started"
    assert started["id"] == 1
    eid = started["episode_id"]
    steps, terminated, truncated = 0, False, False
    while not (terminated or truncated):
        reply = _ok(
            http.post("/v1/get_action", json={"episode_id": eid, "observation": obs.tolist()})
        )
        assert reply["type"] == "action"
        action = reply["action"]
        assert type(action) is int and action in (0, 1)
        obs, reward, terminated, truncated, _ = env.step(action)
        assert _ok(http.post("/v1/log_returns", json={"episode_id": eid, "reward": reward})) == {
            "type": "ok",
            "id": 0,
        }
        steps += 1
    body = {"episode_id": eid, "observation": obs.tolist(), "truncated": not terminated}
    assert _ok(http.post("/v1/end_episode", json=body))["type"] == "ok"
    after = _ok(http.get("/v1/metrics"))
    assert after["episodes/completed"] - before["episodes/completed"] == 1
    assert after["samples/env_steps"] - before["samples/env_steps"] == steps


def test_batched_and_logged_actions_over_http(http: httpx.Client) -> None:
    ids = [_ok(http.post("/v1/start_episode", json={}))["episode_id"] for _ in range(3)]
    reply = _ok(http.post("/v1/get_action", json={"episode_ids": ids, "observations": [GOOD] * 3}))
    assert len(reply["actions"]) == 3
    assert set(reply["actions"]) <= {0, 1}
    reply = _ok(
        http.post(
            "/v1/get_action",
            json={"episode_ids": ids, "observations": [GOOD] * 3, "rewards": [1.0, 0.5, 0.0]},
        )
    )
    assert len(reply["actions"]) == 3
    logged = {"episode_id": ids[0], "observation": GOOD, "action": 1, "reward": 1.0}
    assert _ok(http.post("/v1/log_action", json=logged))["type"] == "ok"
    for eid in ids:
        assert _ok(http.post("/v1/end_episode", json={"episode_id": eid, "observation": GOOD}))
    assert _ok(http.post("/v1/ping", json={"id": 9})) == {"type": "pong", "id": 9}


def test_episode_moves_between_carriers(server: Any, http: httpx.Client) -> None:
    """An episode started over HTTP can be continued by a binary client of the same identity."""
    me = {"X-RLServe-Client": "carrier-mover"}
    eid = _ok(http.post("/v1/start_episode", json={}, headers=me))["episode_id"]
    with PolicyClient(
        server.address, inference_mode="remote", timeout=30, client_id="carrier-mover"
    ) as client:
        assert client.get_action(eid, np.asarray(GOOD, dtype=np.float32)) in (0, 1)
    body = {"episode_id": eid, "observation": GOOD}
    assert _ok(http.post("/v1/get_action", json=body, headers=me))
    assert _ok(http.post("/v1/end_episode", json=body, headers=me))


def test_episode_errors_are_409(http: httpx.Client) -> None:
    _error(
        http.post("/v1/get_action", json={"episode_id": "nope", "observation": GOOD}),
        409,
        "episode_error",
    )
    eid = _ok(http.post("/v1/start_episode", json={}))["episode_id"]
    other = {"X-RLServe-Client": "another-client"}
    again = http.post("/v1/start_episode", json={"episode_id": eid}, headers=other)
    _error(again, 409, "episode_error")
    # A reward before the first action is accepted (it counts in the return only).
    assert _ok(http.post("/v1/log_returns", json={"episode_id": eid, "reward": 1.0}))
    assert _ok(http.post("/v1/end_episode", json={"episode_id": eid, "observation": GOOD}))
    _error(
        http.post("/v1/end_episode", json={"episode_id": eid, "observation": GOOD}),
        409,
        "episode_error",
    )


@pytest.mark.parametrize(
    "observation",
    [
        "[NaN, 0, 0, 0]",
        "[0, Infinity, 0, 0]",
        "[10.0, 0, 0, 0]",
        "[0, 0, 0]",
        "[[0, 0, 0, 0]]",
        '["a", "b", "c", "d"]',
        '{"x": 1}',
        "null",
    ],
)
def test_bad_values_are_422(http: httpx.Client, observation: str) -> None:
    eid = _ok(http.post("/v1/start_episode", json={}))["episode_id"]
    body = f'{{"episode_id": "{eid}", "observation": {observation}}}'
    headers = {"content-type": "application/json"}
    _error(http.post("/v1/get_action", content=body, headers=headers), 422, "bad_value")
    # The episode is untouched by the rejected request.
    assert _ok(http.post("/v1/get_action", json={"episode_id": eid, "observation": GOOD}))
    _error(http.post("/v1/end_episode", content=body, headers=headers), 422, "bad_value")
    assert _ok(http.post("/v1/end_episode", json={"episode_id": eid, "observation": GOOD}))


@pytest.mark.parametrize(
    ("kind", "body"),
    [
        ("start_episode", b"this is not json"),
        ("start_episode", b"[1, 2, 3]"),
        ("start_episode", b'"a string"'),
        ("start_episode", b"\xff\xfe\x00"),
        ("start_episode", b'{"episode_id": 5}'),
        ("start_episode", b'{"training_enabled": "yes"}'),
        ("get_action", b'{"episode_id": "x"}'),
        ("get_action", b'{"episode_ids": [], "observations": []}'),
        ("log_returns", b'{"episode_id": "x"}'),
        ("log_returns", b'{"episode_id": "x", "reward": "1"}'),
        ("hello", b"{}"),
    ],
)
def test_undecodable_requests_are_400(http: httpx.Client, kind: str, body: bytes) -> None:
    headers = {"content-type": "application/json"}
    _error(http.post(f"/v1/{kind}", content=body, headers=headers), 400, "decode_error")


def test_unknown_type_is_404(http: httpx.Client) -> None:
    body = _error(http.post("/v1/bogus", json={}), 404, "decode_error")
    assert "start_episode" in body["message"]  # lists the known types


def test_oversized_body_is_413(http: httpx.Client) -> None:
    observation = [0.0] * 40_000  # about 160 kB of JSON, over --max-frame-bytes 65536
    reply = http.post("/v1/get_action", json={"episode_id": "x", "observation": observation})
    _error(reply, 413, "limit_exceeded")


def test_a_bad_client_header_is_checked_after_the_body_and_echoes_the_id(
    server: Any, http: httpx.Client, token_server: Any
) -> None:
    """Section 4.3: the X-RLServe-Client check (413) comes after the body's checks and before
    the request is carried out; its error echoes the body's id like the body's own errors."""
    for header in ("", "x" * 129):
        bad = {"X-RLServe-Client": header}
        body = _error(http.post("/v1/ping", json={"id": 7}, headers=bad), 413, "limit_exceeded")
        assert body["id"] == 7
        assert body["message"] == "header X-RLServe-Client must have 1 to 128 characters"
        for no_id in ({}, {"id": None}):  # no id (a negative one is a decode_error)
            reply = http.post("/v1/ping", json=no_id, headers=bad)
            assert _error(reply, 413, "limit_exceeded")["id"] is None
        # The body's errors come first.
        not_json = {**bad, "Content-Type": "application/json"}
        reply = http.post("/v1/ping", content=b"{", headers=not_json)
        assert _error(reply, 400, "decode_error")["id"] is None
        reply = http.post("/v1/get_action", json={"id": 8}, headers=bad)
        assert _error(reply, 400, "decode_error")["id"] == 8
        # Then the header, before the request is carried out: an unknown episode is not looked
        # up, and nothing is started.
        ask = {"id": 9, "episode_id": "never-started", "observation": GOOD}
        assert _error(http.post("/v1/get_action", json=ask, headers=bad), 413, "limit_exceeded")
        started = server.metrics()["episodes/started"]
        start = {"id": 10, "episode_id": f"bad-header-{len(header)}"}
        reply = http.post("/v1/start_episode", json=start, headers=bad)
        assert _error(reply, 413, "limit_exceeded")["id"] == 10
        assert server.metrics()["episodes/started"] == started
        # Header checks before the body come before it: the token and the Content-Type.
        with httpx.Client(base_url=token_server.http_url, timeout=30) as other:
            _error(other.post("/v1/ping", json={"id": 11}, headers=bad), 401, "unauthorized")
        reply = http.post("/v1/ping", content=b"{}", headers={**bad, "Content-Type": "text/plain"})
        assert _error(reply, 415, "decode_error")["id"] is None


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("GET", "/v1/start_episode", "POST"),
        ("PUT", "/v1/ping", "POST"),
        ("POST", "/v1/health", "GET, HEAD"),
        ("DELETE", "/v1/metrics", "GET, HEAD"),
        ("POST", "/metrics", "GET, HEAD"),
        ("POST", "/", "GET, HEAD"),
        ("GET", "/dashboard/login", "POST"),
    ],
)
def test_a_known_path_with_the_wrong_method_is_405(
    http: httpx.Client, method: str, path: str, allow: str
) -> None:
    """Section 4.3: 405 with an Allow header and the JSON error body."""
    reply = http.request(method, path, headers={"Content-Type": "application/json"})
    body = _error(reply, 405, "decode_error")
    assert reply.headers["allow"] == allow
    assert body["id"] is None
    assert body["message"] == f"{path} does not take {method}; use {allow.replace(', ', ' or ')}"


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/v1/nope"), ("GET", "/nope"), ("POST", "/v2/ping"), ("GET", "/v1/health/x")],
)
def test_an_unknown_path_is_404(http: httpx.Client, method: str, path: str) -> None:
    """Section 4.3: any method on a path the server does not have, with the JSON error body."""
    reply = http.request(method, path, headers={"Content-Type": "application/json"})
    body = _error(reply, 404, "decode_error")
    assert body["message"].startswith(f"no such path: {method} {path}; the server has POST /v1/")


def test_null_is_the_same_as_absent_over_http(http: httpx.Client) -> None:
    """Section 3.2 holds for JSON too: null is an absent field."""
    hello = {"id": None, "protocol_version": 1, "client_name": None, "token": None}
    hello |= {"inference_mode": None, "client_id": None}
    assert _ok(http.post("/v1/hello", json=hello))["type"] == "welcome"
    start = {"id": None, "episode_id": None, "training_enabled": None, "policy_id": None}
    eid = _ok(http.post("/v1/start_episode", json=start))["episode_id"]
    step = {"episode_id": eid, "observation": GOOD, "reward": None, "seq": None}
    step |= {"episode_ids": None, "observations": None, "rewards": None, "seqs": None}
    assert _ok(http.post("/v1/get_action", json=step))["action"] in (0, 1)
    end = {"episode_id": eid, "observation": GOOD, "truncated": None, "reward": None}
    assert _ok(http.post("/v1/end_episode", json=end | {"seq": None}))["type"] == "ok"


def test_prometheus_metrics(server: Any, http: httpx.Client) -> None:
    with PolicyClient(server.address, inference_mode="remote", timeout=30) as client:
        play_cartpole(client, seed=77)
    reply = http.get("/metrics")
    assert reply.status_code == 200
    assert reply.headers["content-type"].startswith("text/plain")
    text = reply.text
    assert "rlserve_episodes_return_mean" in text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    expected = _ok(http.get("/v1/metrics"))
    kinds = {"episodes/return_mean": "gauge", "episodes/completed": "counter"}
    for name, kind in (kinds | {"server/weights_version": "gauge"}).items():
        family = families["rlserve_" + name.replace("/", "_")]
        assert family.type == kind
        assert family.samples[0].value == pytest.approx(expected[name])
    assert "rlserve_episodes_completed_total " in text


def test_json_metrics_are_valid_json(http: httpx.Client) -> None:
    reply = http.get("/v1/metrics")
    metrics = json.loads(reply.text)  # strict: no NaN/Infinity literals
    for key in ("episodes/return_mean", "episodes/completed", "samples/env_steps"):
        assert key in metrics


# -- tokens ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "authorization", [None, "Bearer wrong", f"Basic {TOKEN}", "Bearer", f"Bearer {TOKEN}x"]
)
def test_token_required_over_http(token_server: Any, authorization: str | None) -> None:
    headers = {} if authorization is None else {"Authorization": authorization}
    with httpx.Client(base_url=token_server.http_url, timeout=30, headers=headers) as http:
        assert http.get("/v1/health").status_code == 200  # health needs no token
        _error(http.get("/v1/metrics"), 401, "unauthorized")
        assert http.get("/metrics").status_code == 401
        _error(http.post("/v1/start_episode", json={}), 401, "unauthorized")
        _error(http.post("/v1/hello", json={"protocol_version": 1}), 401, "unauthorized")


def test_right_token_over_http(token_server: Any) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=token_server.http_url, timeout=60, headers=headers) as http:
        assert _ok(http.post("/v1/hello", json={"protocol_version": 1}))["type"] == "welcome"
        # A null token is an absent one: the Bearer header carries it (section 4.2).
        welcome = _ok(http.post("/v1/hello", json={"protocol_version": 1, "token": None}))
        assert welcome["type"] == "welcome"
        eid = _ok(http.post("/v1/start_episode", json={}))["episode_id"]
        assert _ok(http.post("/v1/get_action", json={"episode_id": eid, "observation": GOOD}))
        assert _ok(http.post("/v1/end_episode", json={"episode_id": eid, "observation": GOOD}))
        assert _ok(http.get("/v1/metrics"))["episodes/started"] >= 1
        assert http.get("/metrics").status_code == 200


@pytest.mark.parametrize("token", [None, "wrong", ""])
def test_wrong_token_over_binary(token_server: Any, token: str | None) -> None:
    with pytest.raises(AuthenticationError):
        PolicyClient(token_server.address, inference_mode="remote", token=token, timeout=30)
    with RawSocket(token_server.address) as raw:
        reply = raw.request({"type": "hello", "id": 1, "protocol_version": 1, "token": token})
        assert reply["code"] == "unauthorized"
        assert raw.receive() is None  # closed after a failed hello


def test_right_token_over_binary(token_server: Any) -> None:
    with PolicyClient(
        token_server.address, inference_mode="remote", token=TOKEN, timeout=60
    ) as client:
        result = play_cartpole(client, seed=4)
    assert result.length > 0
    with RawSocket(token_server.address) as raw:
        raw.hello(TOKEN)
        assert raw.request({"type": "ping", "id": 2}) == {"type": "pong", "id": 2}


@pytest.mark.parametrize("token", [None, ""])
def test_public_host_without_token_refuses_to_start(
    tmp_path: Path, run_rlserve: Callable[..., Any], token: str | None
) -> None:
    args = ["serve", "--host", "0.0.0.0", "--port", "0", "--http-port", "0"]
    args += ["--spaces-from", "CartPole-v1", "--no-progress", "--run-dir", str(tmp_path / "runs")]
    if token is not None:
        args += ["--token", token]
    done = run_rlserve(*args)
    assert done.returncode != 0
    assert "token" in done.stderr.lower()
    assert "Traceback" not in done.stderr
    assert "listening" not in done.stdout


def test_public_host_with_token_serves(launch_server: Any) -> None:
    server = launch_server("--host", "0.0.0.0", "--token", TOKEN)
    assert server.host == "0.0.0.0"
    with PolicyClient(server.address, inference_mode="remote", token=TOKEN, timeout=30) as client:
        assert client.observation_space.shape == (4,)
    reply = httpx.get(
        f"{server.http_url}/v1/metrics", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10
    )
    assert reply.status_code == 200


def test_structured_actions_and_unbounded_bounds_over_http(
    launch_server: Any, tmp_path: Path
) -> None:
    """Dict actions travel as JSON maps in both directions (section 6.3), and an unbounded side
    of the action bounds is null in the weights (JSON has no infinity, section 7.9)."""
    spaces = {
        "observation_space": {"type": "Box", "shape": [3], "dtype": "float32"},
        "action_space": {
            "type": "Dict",
            "spaces": {
                "gear": {"type": "MultiDiscrete", "nvec": [3, 2]},
                "steer": {"type": "Box", "shape": [2], "dtype": "float32", "low": [-1.0, None]},
            },
        },
    }
    spaces_file = tmp_path / "spaces.json"
    spaces_file.write_text(json.dumps(spaces))
    server = launch_server("--seed", "1", spaces=("--spaces-file", str(spaces_file)))
    server.wait_for_weights()
    obs = [0.5, -0.25, 1.0]
    with httpx.Client(base_url=server.http_url, timeout=30) as client:
        reply = _ok(client.post("/v1/get_weights", json={"id": 1}))
        eid = _ok(client.post("/v1/start_episode", json={}))["episode_id"]
        action = _ok(client.post("/v1/get_action", json={"episode_id": eid, "observation": obs}))
        taken = {"gear": [2, 1], "steer": [0.5, -3.0]}
        logged = {"episode_id": eid, "observation": obs, "action": taken, "reward": 1.0}
        assert _ok(client.post("/v1/log_action", json=logged))["type"] == "ok"
        wrong = {**logged, "action": {"gear": [3, 0], "steer": [0.0, 0.0]}, "reward": 0.0}
        _error(client.post("/v1/log_action", json=wrong), 422, "bad_value")
        ended = {"episode_id": eid, "observation": obs, "reward": 0.5}
        assert _ok(client.post("/v1/end_episode", json=ended))["type"] == "ok"
    model = reply["model"]
    low, high = model["action_low"], model["action_high"]
    assert len(low) == len(high) == 4  # the flat action layout: 2 choice columns + 2 values
    assert None in high and all(v is None or isinstance(v, float) for v in low + high)
    chosen = action["action"]
    assert set(chosen) == {"gear", "steer"}, chosen
    assert 0 <= chosen["gear"][0] < 3 and 0 <= chosen["gear"][1] < 2
    assert len(chosen["steer"]) == 2 and chosen["steer"][0] >= -1.0


def test_a_summary_return_too_large_for_a_double_is_a_bad_value(http: httpx.Client) -> None:
    """A JSON integer of 400 digits is refused like any non-finite return, and the batch id is
    free again for a corrected report."""
    version = _ok(http.post("/v1/get_weights", json={"id": 1}))["version"]
    body = '{"id":2,"batch_id":"huge-return","fragments":[],"episodes":[{"episode_id":"e1",'
    huge = body + '"return":1' + "0" * 400 + ',"length":3}]}'
    headers = {"Content-Type": "application/json"}
    _error(http.post("/v1/report_samples", content=huge, headers=headers), 422, "bad_value")
    fixed = body + '"return":3.0,"length":3}]}'
    accepted = _ok(http.post("/v1/report_samples", content=fixed, headers=headers))
    assert accepted["type"] == "samples_accepted" and not accepted.get("duplicate"), accepted
    assert version >= 0
