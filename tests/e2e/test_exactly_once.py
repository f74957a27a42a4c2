"""Retried calls are applied once; episodes belong to the client that started them.

A proxy between the client and a real server loses chosen replies (the server has applied the
request, the client never hears back), so the client reconnects and re-sends: the server's
per-episode sequence numbers answer the retry with the first answer.
"""

from __future__ import annotations

import signal
import sys
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from e2e_support import RawSocket
from fault_proxy import FaultProxy

from rlserve import (
    CapacityError,
    ConnectionLostError,
    EpisodeError,
    EpisodeLostError,
    PolicyClient,
    RLServeError,
)
from rlserve.client.connection import Connection, Timeouts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

GOOD = np.array([0.01, -0.02, 0.03, 0.04], dtype=np.float32)


@pytest.fixture(scope="module")
def shared(module_launcher: Any) -> Any:
    handle = module_launcher("--max-episodes-per-client", "2", "--seed", "3")
    handle.wait_for_weights()
    return handle


@pytest.fixture
def proxy_to(request: pytest.FixtureRequest) -> Iterator[Any]:
    proxies: list[FaultProxy] = []

    def make(server: Any) -> FaultProxy:
        proxies.append(FaultProxy(server.address))
        return proxies[-1]

    yield make
    for proxy in proxies:
        proxy.close()


def test_calls_whose_replies_are_lost_count_once(launch_server: Any, proxy_to: Any) -> None:
    server = launch_server("--seed", "1")
    server.wait_for_weights()
    proxy = proxy_to(server)
    with PolicyClient(
        proxy.address, inference_mode="remote", timeout=30, reconnect_timeout=30
    ) as client:
        proxy.drop_reply("start_episode")
        # Pipelined: the get_action below goes out behind it, and the proxy cuts the connection
        # after losing the start's reply. If it forwarded the get_action first, the re-sent
        # start is refused (the episode is in use: the one server error allowed below), which
        # tells the client that its start took effect; if not, it is answered as started.
        eid = client.start_episode()
        first = client.get_action(eid, GOOD)
        client.log_returns(eid, 5.0)  # travels with the next get_action
        proxy.drop_reply("get_action")
        second = client.get_action(eid, GOOD)  # applied, reply lost, re-sent
        client.log_returns(eid, 1.0, info={"sent": "with log_action"})
        proxy.drop_reply("log_action")
        client.log_action(eid, GOOD, 1)
        proxy.drop_reply("end_episode")
        client.end_episode(eid, GOOD)  # pipelined: its lost reply is noticed by close()
        assert first in (0, 1) and second in (0, 1)
    assert proxy.dropped == [
        "start_episode",
        "get_action",
        "log_action",
        "end_episode",
    ]
    assert client.reconnects == 4
    metrics = server.wait_until(lambda m: m["episodes/completed"] == 1, what="the episode")
    assert metrics["episodes/started"] == 1
    assert metrics["episodes/length_mean"] == 3  # not 4 or 5
    assert metrics["episodes/return_mean"] == pytest.approx(6.0)  # 5.0 counted once
    assert metrics["samples/env_steps"] == 3
    assert metrics["server/errors"] <= 1  # at most the re-sent start_episode, refused as in use


def test_a_lost_batched_reply_is_answered_with_the_same_actions(shared: Any, proxy_to: Any) -> None:
    proxy = proxy_to(shared)
    before = shared.metrics()
    with PolicyClient(proxy.address, inference_mode="remote", timeout=30) as client:
        ids = [client.start_episode(), client.start_episode()]
        client.get_action(ids, np.stack([GOOD, GOOD]))
        proxy.drop_reply("get_action")
        actions = client.get_action(ids, {eid: GOOD for eid in ids})
        assert set(actions) == set(ids)
        for eid in ids:
            client.end_episode(eid, GOOD)
    assert proxy.dropped == ["get_action"]
    after = shared.wait_until(
        lambda m: m["episodes/completed"] == before["episodes/completed"] + 2, what="episodes"
    )
    assert after["samples/env_steps"] - before["samples/env_steps"] == 4


def test_a_random_start_is_pipelined_and_recovers_a_lost_reply(shared: Any, proxy_to: Any) -> None:
    """start_episode() does not wait for its reply: the next call reads it (and re-sends the
    start on a fresh connection when it was lost)."""
    proxy = proxy_to(shared)
    with PolicyClient(proxy.address, inference_mode="remote", timeout=30) as client:
        proxy.drop_reply("start_episode")
        eid = client.start_episode()
        assert client.reconnects == 0  # returned before the proxy lost the reply
        assert client.get_action(eid, GOOD) in (0, 1)
        assert client.reconnects == 1
        client.end_episode(eid, GOOD)
    assert proxy.dropped == ["start_episode"]


def test_a_refused_pipelined_start_is_raised_by_the_next_call(launch_server: Any) -> None:
    """The server-wide limit (which the client cannot see) refuses a pipelined start: the next
    call raises it, naming the start, and the episode never opened."""
    server = launch_server("--max-episodes-per-server", "1", "--seed", "5")
    server.wait_for_weights()
    with PolicyClient(server.address, inference_mode="remote", timeout=30) as client:
        first = client.start_episode()
        refused = client.start_episode()  # pipelined: the server's refusal comes later
        client.log_returns(refused, 1.0)  # kept for its first get_action
        with pytest.raises(CapacityError, match=f"start_episode of episode '{refused}' failed"):
            client.get_action(refused, GOOD)
        # Nothing is kept for the episode that never opened (a client refused over and over
        # would otherwise grow its table of pending rewards).
        assert refused not in client._engine._pending_reward  # type: ignore[attr-defined]
        with pytest.raises(EpisodeError, match="unknown episode"):
            client.get_action(refused, GOOD)  # it never opened
        assert client.get_action(first, GOOD) in (0, 1)
        client.end_episode(first, GOOD)
        again = client.start_episode()
        assert client.get_action(again, GOOD) in (0, 1)
        # A refused start and the end behind it (refused too) leave the episode unopened.
        gone = client.start_episode()
        client.end_episode(gone, GOOD)
        with pytest.raises(CapacityError, match=f"start_episode of episode '{gone}' failed"):
            client.get_action(again, GOOD)
        with pytest.raises(EpisodeError, match="unknown episode"):
            client.log_returns(gone, 1.0)  # not kept for a next call: sent, and refused
        client.end_episode(again, GOOD)


def test_a_refused_start_read_before_a_lost_reply_waits_for_the_next_call(
    launch_server: Any, proxy_to: Any
) -> None:
    """A call whose reply was lost may have been applied: re-sent, it returns its answer, and
    the refusal of a pipelined start read on its way is raised by the next call instead."""
    server = launch_server("--max-episodes-per-server", "1", "--seed", "7")
    server.wait_for_weights()
    proxy = proxy_to(server)
    with PolicyClient(proxy.address, inference_mode="remote", timeout=30) as client:
        kept = client.start_episode()
        assert client.get_action(kept, GOOD) in (0, 1)
        refused = client.start_episode()  # the server-wide limit refuses it
        proxy.drop_reply("get_action")
        assert client.get_action(kept, GOOD) in (0, 1)  # applied, reply lost, re-sent
        assert client.reconnects == 1
        with pytest.raises(CapacityError, match=f"start_episode of episode '{refused}' failed"):
            client.get_action(kept, GOOD)
        assert client.get_action(kept, GOOD) in (0, 1)
        # The same, re-sent in the refused episode itself: its refusal is the error to raise.
        doomed = client.start_episode()
        proxy.drop_reply("get_action")
        with pytest.raises(CapacityError, match=f"start_episode of episode '{doomed}' failed"):
            client.get_action(doomed, GOOD)
        assert client.reconnects == 2
        assert client.get_action(kept, GOOD) in (0, 1)  # nothing left to raise
        client.end_episode(kept, GOOD)
    metrics = server.wait_until(lambda m: m["episodes/completed"] == 1, what="the episode")
    assert metrics["episodes/length_mean"] == 4  # the re-sent step counted once


def test_an_unconfirmed_start_is_lost_when_the_connection_stays_lost(
    launch_server: Any, proxy_to: Any
) -> None:
    """A pipelined start whose reply never came, and no server to re-send it to: the call
    gives up, and the episode's next call says it is lost (the server may never have seen it)."""
    server = launch_server("--seed", "8")
    server.wait_for_weights()
    proxy = proxy_to(server)
    with PolicyClient(
        proxy.address, inference_mode="remote", timeout=5, reconnect_timeout=1
    ) as client:
        proxy.drop_reply("start_episode")
        eid = client.start_episode()
        client.log_returns(eid, 1.0)  # kept for its first get_action
        assert server.stop() == 0  # the proxy has nothing to connect to any more
        with pytest.raises(ConnectionLostError):
            client.get_action(eid, GOOD)
        assert eid not in client._engine._pending_reward  # type: ignore[attr-defined]
        with pytest.raises(EpisodeLostError, match="start_episode was sent without waiting"):
            client.get_action(eid, GOOD)


def test_a_pipelined_start_is_resent_to_a_restarted_server(
    launch_server: Any, proxy_to: Any
) -> None:
    """A start whose reply was lost, then the server restarted: the new server never saw the
    episode, so the client starts it there instead of declaring it lost."""
    first = launch_server("--seed", "6")
    first.wait_for_weights()
    proxy = proxy_to(first)
    with PolicyClient(
        proxy.address, inference_mode="remote", timeout=30, reconnect_timeout=60
    ) as client:
        old = client.start_episode()
        assert client.get_action(old, GOOD) in (0, 1)
        proxy.drop_reply("start_episode")
        fresh = client.start_episode()
        assert first.stop(signal.SIGTERM) == 0, first.log()
        second = launch_server("--seed", "6", port=first.port)
        second.wait_for_weights()
        # The call that finds the new server is of a lost episode: the start is re-sent first.
        with pytest.raises(EpisodeError, match="lost: the server restarted"):
            client.get_action(old, GOOD)
        assert client.get_action(fresh, GOOD) in (0, 1)
        client.end_episode(fresh, GOOD)
    metrics = second.wait_until(lambda m: m["episodes/completed"] == 1, what="the episode")
    assert metrics["episodes/started"] == 1
    assert metrics["server/errors"] == 0


def test_starts_behind_a_refused_one_after_a_restart_are_lost(launch_server: Any) -> None:
    """Unconfirmed pipelined starts are re-sent to a restarted server in order; when it refuses
    one, those behind it are not re-sent: their episodes are lost (saying why), not left open
    with their rewards kept."""
    first = launch_server("--seed", "9")
    first.wait_for_weights()
    with PolicyClient(
        first.address, inference_mode="remote", timeout=30, reconnect_timeout=60
    ) as client:
        first.process.send_signal(signal.SIGSTOP)  # it reads nothing: no start is answered
        kept, refused, behind = (client.start_episode() for _ in range(3))
        client.log_returns(behind, 1.0)
        first.stop(signal.SIGKILL)
        second = launch_server("--seed", "9", "--max-episodes-per-server", "1", port=first.port)
        second.wait_for_weights()
        with pytest.raises(CapacityError):
            client.get_action(kept, GOOD)  # re-sends the three starts: the second is refused
        with pytest.raises(EpisodeLostError, match="was not re-sent"):
            client.get_action(behind, GOOD)
        assert behind not in client._engine._pending_reward  # type: ignore[attr-defined]
        with pytest.raises(EpisodeError, match="unknown episode"):
            client.get_action(refused, GOOD)
        assert client.get_action(kept, GOOD) in (0, 1)
        client.end_episode(kept, GOOD)


def test_a_short_timeout_while_the_server_starts_does_not_fail(launch_server: Any) -> None:
    """The first get_action waits for the learner's first weights, longer than the timeout."""
    server = launch_server("--seed", "2")
    with PolicyClient(
        server.address, inference_mode="remote", timeout=0.5, reconnect_timeout=60
    ) as client:
        eid = client.start_episode()
        assert client.get_action(eid, GOOD) in (0, 1)
        client.log_returns(eid, 1.0)
        assert client.get_action(eid, GOOD) in (0, 1)
        client.end_episode(eid, GOOD)
    metrics = server.wait_until(lambda m: m["episodes/completed"] == 1, what="the episode")
    assert metrics["samples/env_steps"] == 2
    assert metrics["episodes/return_mean"] == 1.0


def test_out_of_order_seq_is_refused(shared: Any) -> None:
    conn = Connection(shared.address, None, "raw", "remote", Timeouts(request=30.0))
    conn.open()
    try:
        eid = conn.request({"type": "start_episode"})["episode_id"]
        ask = {"type": "get_action", "episode_id": eid, "observation": GOOD}
        action = conn.request({**ask, "seq": 1})["action"]
        assert conn.request({**ask, "seq": 1})["action"] == action  # a retry
        with pytest.raises(EpisodeError, match="out of order: the next call is 2"):
            conn.request({**ask, "seq": 3})
        with pytest.raises(EpisodeError, match="repeats the number of its get_action"):
            conn.request({"type": "log_returns", "episode_id": eid, "reward": 1.0, "seq": 1})
        end = {"type": "end_episode", "episode_id": eid, "observation": GOOD, "seq": 2}
        conn.request(dict(end))
        conn.request(dict(end))  # a retry after the end: still answered
        with pytest.raises(EpisodeError, match="has ended"):
            conn.request({**end, "seq": 3})
    finally:
        conn.close()


def test_a_call_without_seq_leaves_the_expected_number(shared: Any) -> None:
    """Section 9.9: a call without seq neither uses up a number nor changes the next one, and
    the last numbered call can still be re-sent, answered with its own first reply."""
    before = shared.metrics()
    conn = Connection(shared.address, None, "raw", "remote", Timeouts(request=30.0))
    conn.open()
    try:
        eid = conn.request({"type": "start_episode"})["episode_id"]
        ask = {"type": "get_action", "episode_id": eid, "observation": GOOD}
        first = conn.request({**ask, "seq": 1})["action"]
        conn.request({"type": "log_returns", "episode_id": eid, "reward": 1.0})
        conn.request(dict(ask))
        conn.request({"type": "log_action", "episode_id": eid, "observation": GOOD, "action": 0})
        with pytest.raises(EpisodeError, match="out of order: the next call is 2"):
            conn.request({**ask, "seq": 3})
        assert conn.request({**ask, "seq": 1})["action"] == first  # a retry: records nothing
        conn.request({**ask, "seq": 2})
        conn.request({"type": "end_episode", "episode_id": eid, "observation": GOOD, "seq": 3})

        # Multi-agent: the retry gets its own actions (two agents), not those of the
        # unnumbered call after it (one agent).
        eid = conn.request({"type": "start_episode"})["episode_id"]
        pair = {
            "type": "get_action",
            "episode_id": eid,
            "agent_ids": ["a", "b"],
            "observations": np.stack([GOOD, GOOD]),
        }
        first = np.asarray(conn.request({**pair, "seq": 1})["actions"]).tolist()
        one = {**pair, "agent_ids": ["a"], "observations": np.stack([GOOD]), "rewards": [0.0]}
        assert len(conn.request(one)["actions"]) == 1
        with pytest.raises(EpisodeError, match="out of order: the next call is 2"):
            conn.request({**pair, "seq": 3})
        assert np.asarray(conn.request({**pair, "seq": 1})["actions"]).tolist() == first
        conn.request({**pair, "rewards": [0.0, 0.0], "seq": 2})
        conn.request({"type": "end_episode", "episode_id": eid, "agent_ids": [], "seq": 3})
    finally:
        conn.close()
    after = shared.wait_until(
        lambda m: m["episodes/completed"] == before["episodes/completed"] + 2, what="episodes"
    )
    # Single: seq 1, the unnumbered get_action and log_action, seq 2. Multi-agent: 2 + 1 + 2.
    assert after["samples/env_steps"] - before["samples/env_steps"] == 4 + 5


# -- ownership -------------------------------------------------------------------------------


def test_another_client_cannot_touch_an_episode(shared: Any, proxy_to: Any) -> None:
    proxy = proxy_to(shared)
    with (
        PolicyClient(proxy.address, inference_mode="remote", timeout=30) as owner,
        PolicyClient(shared.address, inference_mode="remote") as other,
    ):
        eid = owner.start_episode()
        owner.get_action(eid, GOOD)
        for call in (
            lambda: other.get_action(eid, GOOD),
            lambda: other.log_action(eid, GOOD, 0),
            lambda: other.get_action([eid], np.stack([GOOD])),
        ):
            with pytest.raises(EpisodeError, match="belongs to another client"):
                call()
        other.end_episode(eid, GOOD)  # pipelined: refused, raised by the next call that waits
        mine = other.start_episode()  # pipelined too: it does not wait for the end's reply
        with pytest.raises(EpisodeError, match=r"end_episode of episode .* belongs to another"):
            other.get_action(mine, GOOD)
        assert other.get_action(mine, GOOD) in (0, 1)  # the start took effect, the call did not
        other.end_episode(mine, GOOD)
        # The owner carries on, also after its connection broke.
        proxy.drop_reply("get_action")
        owner.log_returns(eid, 1.0)
        owner.get_action(eid, GOOD)
        assert owner.reconnects == 1
        owner.end_episode(eid, GOOD)


def test_http_identity_owns_its_episodes(shared: Any) -> None:
    with httpx.Client(base_url=shared.http_url, timeout=30) as http:
        mine = {"X-RLServe-Client": uuid.uuid4().hex}
        theirs = {"X-RLServe-Client": uuid.uuid4().hex}
        eid = http.post("/v1/start_episode", json={}, headers=mine).json()["episode_id"]
        assert http.post(
            "/v1/get_action", json={"episode_id": eid, "observation": GOOD.tolist()}, headers=mine
        ).is_success
        for kind, body in (
            ("log_returns", {"reward": 1.0}),
            ("get_action", {"observation": GOOD.tolist()}),
            ("end_episode", {"observation": GOOD.tolist()}),
        ):
            reply = http.post(f"/v1/{kind}", json={"episode_id": eid, **body}, headers=theirs)
            assert reply.status_code == 409
            assert "belongs to another client" in reply.json()["message"]
        # Without the header the caller is "anonymous": another client too.
        reply = http.post("/v1/log_returns", json={"episode_id": eid, "reward": 1.0})
        assert reply.status_code == 409
        # A binary client cannot take it over either.
        with (
            PolicyClient(shared.address, inference_mode="remote") as client,
            pytest.raises(EpisodeError),
        ):
            client.get_action(eid, GOOD)
        reply = http.post(
            "/v1/end_episode", json={"episode_id": eid, "observation": GOOD.tolist()}, headers=mine
        )
        assert reply.is_success
        too_long = {"X-RLServe-Client": "x" * 1000}
        assert http.post("/v1/ping", json={}, headers=too_long).status_code == 413


def _raw(server: Any, client_id: str | None) -> Connection:
    conn = Connection(
        server.address, None, "raw", "remote", Timeouts(request=30.0), client_id=client_id
    )
    conn.open()
    return conn


def test_the_per_client_limit_counts_per_identity(shared: Any) -> None:
    """--max-episodes-per-client 2: two connections of one client share the count."""
    identity = uuid.uuid4().hex
    first, second, stranger = _raw(shared, identity), _raw(shared, identity), _raw(shared, None)
    try:
        ids = [first.request({"type": "start_episode"})["episode_id"] for _ in range(2)]
        with pytest.raises(CapacityError, match="holds 2 open episodes"):
            second.request({"type": "start_episode"})
        # The second connection is the same client: it may use and end the first's episodes.
        second.request({"type": "end_episode", "episode_id": ids[0], "observation": GOOD})
        second.request({"type": "start_episode"})
        # Another client has its own count.
        for _ in range(2):
            stranger.request({"type": "start_episode"})
    finally:
        for conn in (first, second, stranger):
            conn.close()


def test_a_later_hello_sets_the_identity_anew(shared: Any) -> None:
    """Section 3.3: each successful hello sets the identity as a first one does: its client_id,
    or without one the connection's own (the same one all along)."""
    first, second = uuid.uuid4().hex, uuid.uuid4().hex

    def hello(raw: RawSocket, client_id: str | None) -> None:
        message = {"type": "hello", "id": 0, "protocol_version": 1, "client_id": client_id}
        assert raw.request(message)["type"] == "welcome"

    def act(raw: RawSocket, eid: str) -> str:
        reply = raw.request({"type": "get_action", "id": 1, "episode_id": eid, "observation": GOOD})
        if reply["type"] == "action":
            return "acts"
        assert reply["code"] == "episode_error" and "belongs to another client" in reply["message"]
        return "refused"

    def start(raw: RawSocket) -> str:
        reply = raw.request({"type": "start_episode", "id": 2})
        assert reply["type"] == "episode_started", reply
        return str(reply["episode_id"])

    with RawSocket(shared.address) as raw, RawSocket(shared.address) as other:
        hello(raw, None)
        own = start(raw)  # the connection's own identity
        hello(raw, first)
        mine = start(raw)
        hello(raw, second)  # switches: the first identity's episode is not this one's
        theirs = start(raw)
        assert [act(raw, eid) for eid in (own, mine, theirs)] == ["refused", "refused", "acts"]
        hello(raw, None)  # back to the connection's own identity, not the second's
        assert [act(raw, eid) for eid in (own, mine, theirs)] == ["acts", "refused", "refused"]
        hello(raw, first)
        assert [act(raw, eid) for eid in (own, mine, theirs)] == ["refused", "acts", "refused"]
        # The second identity's episode is still open, and its own on another connection.
        hello(other, second)
        assert act(other, theirs) == "acts"
        for conn, client_id, eid in ((raw, None, own), (raw, first, mine), (other, second, theirs)):
            hello(conn, client_id)
            end = {"type": "end_episode", "id": 3, "episode_id": eid, "observation": GOOD}
            assert conn.request(end)["type"] == "ok"


def test_a_client_id_in_an_http_hello_does_not_change_the_identity(shared: Any) -> None:
    """Over HTTP the header alone is the identity (section 4.2); hello's client_id is ignored."""
    with httpx.Client(base_url=shared.http_url, timeout=30) as http:
        mine = {"X-RLServe-Client": uuid.uuid4().hex}
        other_id = uuid.uuid4().hex
        eid = http.post("/v1/start_episode", json={}, headers=mine).json()["episode_id"]
        hello = {"protocol_version": 1, "client_id": other_id}
        assert http.post("/v1/hello", json=hello, headers=mine).json()["type"] == "welcome"
        ask = {"episode_id": eid, "observation": GOOD.tolist()}
        assert http.post("/v1/get_action", json=ask, headers=mine).status_code == 200
        theirs = http.post("/v1/get_action", json=ask, headers={"X-RLServe-Client": other_id})
        assert theirs.status_code == 409
        assert "belongs to another client" in theirs.json()["message"]
        # Checked like any field, though.
        empty = http.post("/v1/hello", json={**hello, "client_id": ""}, headers=mine)
        assert (empty.status_code, empty.json()["code"]) == (413, "limit_exceeded")
        end = {"episode_id": eid, "observation": GOOD.tolist()}
        assert http.post("/v1/end_episode", json=end, headers=mine).status_code == 200


def test_episode_error_wins_over_capacity(shared: Any) -> None:
    """Section 7.2: at its limit (2 here) a client still gets episode_error for a start that
    could never succeed, and episode_started for a re-sent start of its own unused episode."""
    me, stranger = _raw(shared, uuid.uuid4().hex), _raw(shared, uuid.uuid4().hex)
    try:
        theirs = stranger.request({"type": "start_episode"})["episode_id"]
        used = me.request({"type": "start_episode"})["episode_id"]
        me.request({"type": "end_episode", "episode_id": used, "observation": GOOD})
        active = me.request({"type": "start_episode"})["episode_id"]
        me.request({"type": "get_action", "episode_id": active, "observation": GOOD})
        unused = uuid.uuid4().hex
        me.request({"type": "start_episode", "episode_id": unused})
        with pytest.raises(CapacityError, match="holds 2 open episodes"):
            me.request({"type": "start_episode"})
        for episode_id, problem in (
            (used, "was used before"),
            (active, "is already active"),
            (theirs, "is already active"),
        ):
            with pytest.raises(EpisodeError, match=problem):
                me.request({"type": "start_episode", "episode_id": episode_id})
        with pytest.raises(EpisodeError, match="unknown policy 'nope'"):
            me.request({"type": "start_episode", "policy_id": "nope"})
        retried = me.request({"type": "start_episode", "episode_id": unused})
        assert retried["episode_id"] == unused
        with pytest.raises(CapacityError, match="holds 2 open episodes"):
            me.request({"type": "start_episode", "episode_id": uuid.uuid4().hex})
        for eid in (active, unused):
            me.request({"type": "end_episode", "episode_id": eid, "observation": GOOD})
        stranger.request({"type": "end_episode", "episode_id": theirs, "observation": GOOD})
    finally:
        me.close()
        stranger.close()


def test_a_resent_end_episode_is_ok_only_for_the_identity_that_ended_it(shared: Any) -> None:
    """Sections 7.6 and 9.9: another identity's copy is refused as about an ended episode."""
    before = shared.metrics()
    owner_id = uuid.uuid4().hex
    owner, other, anonymous = (
        _raw(shared, owner_id),
        _raw(shared, uuid.uuid4().hex),
        _raw(shared, None),
    )
    try:
        eid = owner.request({"type": "start_episode"})["episode_id"]
        owner.request({"type": "get_action", "episode_id": eid, "observation": GOOD, "seq": 1})
        end = {"type": "end_episode", "episode_id": eid, "observation": GOOD, "seq": 2}
        assert owner.request(dict(end))["type"] == "ok"
        ended = f"episode '{eid}' has ended; start a new episode"
        for conn in (other, anonymous):
            with pytest.raises(EpisodeError, match=ended):
                conn.request(dict(end))
        with httpx.Client(base_url=shared.http_url, timeout=30) as http:
            body = {**end, "observation": GOOD.tolist()}
            for headers in ({"X-RLServe-Client": uuid.uuid4().hex}, {}):
                reply = http.post("/v1/end_episode", json=body, headers=headers)
                assert reply.status_code == 409
                assert (reply.json()["code"], reply.json()["message"]) == ("episode_error", ended)
            # The owner's identity over HTTP: the same client, so a retry.
            reply = http.post("/v1/end_episode", json=body, headers={"X-RLServe-Client": owner_id})
            assert reply.status_code == 200 and reply.json()["type"] == "ok"
        assert owner.request(dict(end))["type"] == "ok"  # the refusals changed nothing
    finally:
        for conn in (owner, other, anonymous):
            conn.close()
    after = shared.wait_until(
        lambda m: m["episodes/completed"] == before["episodes/completed"] + 1, what="the episode"
    )
    assert after["episodes/started"] - before["episodes/started"] == 1


def test_client_id_is_validated(shared: Any) -> None:
    with pytest.raises(RLServeError, match="'client_id' must have 1 to 128 characters"):
        _raw(shared, "x" * 1000)


# -- threads ---------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["remote", "local"])
def test_one_client_shared_by_threads(launch_server: Any, mode: str) -> None:
    """Eight threads step their own episodes through one client.

    Threads switch as often as the interpreter allows, so that unguarded shared state (request
    ids, the socket, the episode table) would be interleaved mid-update: without the client's
    lock, threads read each other's replies, waited for ever, timed out and re-sent.
    """
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        _play_in_threads(launch_server, mode)
    finally:
        sys.setswitchinterval(switch)


def _play_in_threads(launch_server: Any, mode: str) -> None:
    server = launch_server("--seed", "6")
    if mode == "local":
        server.wait_for_weights()
    threads_count, episodes, steps = 8, 2, 5
    errors: list[BaseException] = []
    start = threading.Barrier(threads_count)
    with PolicyClient(
        server.address, inference_mode=mode, timeout=10, reconnect_timeout=30
    ) as client:

        def play() -> None:
            try:
                start.wait(30)
                for _ in range(episodes):
                    eid = client.start_episode()
                    for _ in range(steps):
                        assert client.get_action(eid, GOOD) in (0, 1)
                        client.log_returns(eid, 1.0)
                    client.end_episode(eid, GOOD, truncated=True)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=play) for _ in range(threads_count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert not any(thread.is_alive() for thread in threads)
    assert not errors, errors
    total = threads_count * episodes
    metrics = server.wait_until(
        lambda m: m["episodes/completed"] == total, what="every episode of every thread"
    )
    assert metrics["samples/env_steps"] == total * steps
    assert metrics["episodes/length_mean"] == steps
    assert metrics["episodes/return_mean"] == steps
    assert metrics["server/errors"] == 0
