"""Bad inputs get typed errors, and the server keeps serving the connection and everyone else."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from e2e_support import RawSocket

from rlserve import (
    CapacityError,
    EpisodeError,
    PolicyClient,
    SpaceError,
)
from rlserve.client.connection import Connection, Timeouts
from rlserve.errors import LimitExceededError

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

GOOD = np.array([0.01, -0.02, 0.03, 0.04], dtype=np.float32)

BAD_OBSERVATIONS = {
    "wrong_shape": np.zeros(3, dtype=np.float32),
    "too_many_dims": np.zeros((2, 4), dtype=np.float32),
    "nan": np.array([0.0, np.nan, 0.0, 0.0], dtype=np.float32),
    "infinite": np.array([0.0, 0.0, 0.0, np.inf], dtype=np.float32),
    "out_of_bounds": np.array([10.0, 0.0, 0.0, 0.0], dtype=np.float32),  # |x| <= 4.8
    "not_numbers": ["a", "b", "c", "d"],
}


@pytest.fixture(scope="module")
def server(module_launcher: Any) -> Any:
    handle = module_launcher("--max-episodes-per-client", "4", "--seed", "4")
    handle.wait_for_weights()
    return handle


def _client(server: Any, check: bool = True, name: str = "bad-inputs") -> PolicyClient:
    return PolicyClient(
        server.address,
        inference_mode="remote",
        client_name=name,
        timeout=30,
        reconnect_timeout=5,
        check_observations=check,
    )


@contextmanager
def bystander(server: Any) -> Iterator[None]:
    """An episode on another connection, started before and finished after the block."""
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=99)
    with _client(server, name="bystander") as client:
        eid = client.start_episode()
        for _ in range(3):
            obs, reward, *_ = env.step(client.get_action(eid, obs))
            client.log_returns(eid, float(reward))
        yield
        for _ in range(3):
            obs, reward, *_ = env.step(client.get_action(eid, obs))
            client.log_returns(eid, float(reward))
        client.end_episode(eid, obs, truncated=True)


def _errors(server: Any) -> int:
    return int(server.metrics()["server/errors"])


@pytest.mark.parametrize("checked_by", ["client", "server"])
@pytest.mark.parametrize("case", sorted(BAD_OBSERVATIONS))
def test_bad_observation(server: Any, case: str, checked_by: str) -> None:
    """Each call that carries an observation rejects a bad one with SpaceError, changing nothing."""
    bad = BAD_OBSERVATIONS[case]
    errors_before = _errors(server)
    with bystander(server), _client(server, check=checked_by == "client") as client:
        eid = client.start_episode()
        calls = {
            "get_action": lambda: client.get_action(eid, bad),
            "batched get_action": lambda: client.get_action([eid], {eid: bad}),
            "log_action": lambda: client.log_action(eid, bad, 0),
            "end_episode": lambda: (client.end_episode(eid, bad), client.get_action(eid, GOOD)),
        }
        if case == "not_numbers" and checked_by == "server":
            # Covered by test_unchecked_batch_of_non_numbers_raises_space_error.
            del calls["batched get_action"]
        for call, send in calls.items():
            with pytest.raises(SpaceError):
                send()
            # The episode and the connection are untouched: a good step still works.
            assert client.get_action(eid, GOOD) in (0, 1), call
            client.log_returns(eid, 1.0)
        client.end_episode(eid, GOOD)
    expected = 0 if checked_by == "client" else len(calls)
    assert _errors(server) - errors_before == expected


@pytest.mark.parametrize("case", ["nan", "out_of_bounds", "wrong_shape"])
def test_bad_row_in_a_stacked_batch_rejects_the_whole_batch(server: Any, case: str) -> None:
    bad = BAD_OBSERVATIONS[case]
    with _client(server, check=False) as client:
        ids = [client.start_episode() for _ in range(3)]
        rows = [bad, bad, bad] if case == "wrong_shape" else [GOOD, bad, GOOD]
        batch = np.stack(rows)
        with pytest.raises(SpaceError):
            client.get_action(ids, batch)
        # No episode was changed by the rejected batch.
        actions = client.get_action(ids, np.stack([GOOD, GOOD, GOOD]))
        assert actions.shape == (3,)
        for eid in ids:
            client.end_episode(eid, GOOD)


def test_unchecked_batch_of_non_numbers_raises_space_error(server: Any) -> None:
    """With check_observations=False the error must still be rlserve's, not numpy's."""
    with _client(server, check=False) as client:
        ids = [client.start_episode() for _ in range(2)]
        with pytest.raises(SpaceError):
            client.get_action(ids, [["a", "b", "c", "d"], ["e", "f", "g", "h"]])
        assert client.get_action(ids, np.stack([GOOD, GOOD])).shape == (2,)
        for eid in ids:
            client.end_episode(eid, GOOD)


def test_unknown_episode_id(server: Any) -> None:
    errors_before = _errors(server)
    with bystander(server), _client(server) as client:
        with pytest.raises(EpisodeError, match="unknown episode"):
            client.log_returns("no-such-episode", 1.0)
        with pytest.raises(EpisodeError, match="unknown episode"):
            client.get_action("no-such-episode", GOOD)
        with pytest.raises(EpisodeError, match="unknown episode"):
            client.get_action(["no-such-episode"], np.stack([GOOD]))
        with pytest.raises(EpisodeError, match="unknown episode"):
            client.log_action("no-such-episode", GOOD, 1)
        # end_episode is pipelined: its error comes with the next call on the connection.
        client.end_episode("no-such-episode", GOOD)
        with pytest.raises(EpisodeError, match="end_episode"):
            client.start_episode("after-unknown-end")
        # A batch that names one unknown episode changes none of the known ones.
        eid = client.start_episode()
        with pytest.raises(EpisodeError, match="unknown episode"):
            client.get_action([eid, "no-such-episode"], np.stack([GOOD, GOOD]))
        assert client.get_action(eid, GOOD) in (0, 1)
        client.end_episode(eid, GOOD)
    assert _errors(server) - errors_before == 6


@pytest.mark.parametrize("mode", ["remote", "local"])
def test_an_id_that_is_no_episode_id_is_named_in_both_modes(server: Any, mode: str) -> None:
    with PolicyClient(server.address, inference_mode=mode, timeout=30) as client:
        for bad in (5, ""):
            with pytest.raises(EpisodeError, match="episode_id must be a non-empty string"):
                client.start_episode(bad)  # type: ignore[arg-type]
        with pytest.raises(EpisodeError, match="an episode id is the string start_episode"):
            client.get_action(5, GOOD)  # type: ignore[arg-type]
        eid = client.start_episode()
        with pytest.raises(SpaceError, match=r"as env.reset\(\) returns \(obs, info\)"):
            client.get_action(eid, (GOOD, {}))
        with pytest.raises(SpaceError, match=r"shape \(1, 4\) does not fit"):
            client.get_action(eid, GOOD[None])
        # One observation is told as one value in both modes, never as a batch of one.
        for call in (client.get_action, client.log_action, client.end_episode):
            args = (0,) if call == client.log_action else ()
            with pytest.raises(SpaceError, match=r"^observation: value 10\.0 at index \(0,\) "):
                call(eid, BAD_OBSERVATIONS["out_of_bounds"], *args)
            with pytest.raises(SpaceError, match=r"^observation: .*expected shape \(4,\)"):
                call(eid, BAD_OBSERVATIONS["wrong_shape"], *args)
        with pytest.raises(SpaceError, match=r"the observation dict has no entry for \['other'\]"):
            client.get_action([eid, "other"], {eid: GOOD})
        assert client.get_action([eid], {eid: GOOD})[eid] in (0, 1)
        keyed = {eid: GOOD}
        assert client.get_action(keyed.keys(), keyed)[eid] in (0, 1)  # any iterable of ids
        client.end_episode(eid, GOOD)


def test_log_returns_after_a_refused_call_is_not_swallowed(server: Any) -> None:
    """A get_action the server refused is not an action: a reward after it is still an error."""
    with _client(server) as client:
        with pytest.raises(EpisodeError, match="unknown episode"):
            client.get_action("never-started", GOOD)
        with pytest.raises(EpisodeError, match="unknown episode"):
            client.log_returns("never-started", 1.0)
        eid = client.start_episode()
        client.get_action(eid, GOOD)
        client.end_episode(eid, GOOD)
        with pytest.raises(EpisodeError, match="ended"):
            client.log_action(eid, GOOD, 0)
        with pytest.raises(EpisodeError, match="ended"):
            client.log_returns(eid, 1.0)


def test_reused_episode_id(server: Any) -> None:
    with bystander(server), _client(server) as client:
        assert client.start_episode("reused-id") == "reused-id"
        # Unused yet: a repeated start is a retry, answered as started.
        assert client.start_episode("reused-id") == "reused-id"
        assert client.get_action("reused-id", GOOD) in (0, 1)
        with pytest.raises(EpisodeError, match="already active"):
            client.start_episode("reused-id")
        client.end_episode("reused-id", GOOD)
        with pytest.raises(EpisodeError, match="used before"):
            client.start_episode("reused-id")
        fresh = client.start_episode()
        assert client.get_action(fresh, GOOD) in (0, 1)
        client.end_episode(fresh, GOOD)
    with _client(server) as other, pytest.raises(EpisodeError, match="used before"):
        other.start_episode("reused-id")


def test_calls_after_end(server: Any) -> None:
    with bystander(server), _client(server) as client:
        eid = client.start_episode()
        client.get_action(eid, GOOD)
        client.end_episode(eid, GOOD)
        with pytest.raises(EpisodeError, match="ended"):
            client.log_returns(eid, 1.0)
        with pytest.raises(EpisodeError, match="ended"):
            client.get_action(eid, GOOD)
        with pytest.raises(EpisodeError, match="ended"):
            client.log_action(eid, GOOD, 0)
        with pytest.raises(EpisodeError, match="ended"):
            client.get_action([eid], np.stack([GOOD]))
        client.end_episode(eid, GOOD)  # a second end: its error comes with the next call
        with pytest.raises(EpisodeError, match="ended"):
            client.close()
    with _client(server) as client:
        eid = client.start_episode()
        assert client.get_action(eid, GOOD) in (0, 1)
        client.end_episode(eid, GOOD)


def test_reward_before_first_action_is_accepted(server: Any) -> None:
    """As in RLlib: it counts in the episode's return and belongs to no step."""
    with bystander(server), _client(server) as client:
        eid = client.start_episode()
        client.log_returns(eid, 1.0)
        assert client.get_action(eid, GOOD) in (0, 1)
        client.log_returns(eid, 1.0)
        client.end_episode(eid, GOOD)


def test_rewards_over_the_bound_in_a_batch_change_nothing(server: Any) -> None:
    conn = Connection(server.address, None, "raw", "remote", Timeouts(request=30, reconnect=5))
    conn.open()
    try:
        first = conn.request({"type": "start_episode"})["episode_id"]
        second = conn.request({"type": "start_episode"})["episode_id"]
        conn.request({"type": "get_action", "episode_id": first, "observation": GOOD})
        conn.request({"type": "get_action", "episode_id": second, "observation": GOOD})
        conn.request({"type": "log_returns", "episode_id": second, "reward": 6e8})
        with pytest.raises(SpaceError, match=f"get_action for episode '{second}'.*add up to"):
            conn.request(
                {
                    "type": "get_action",
                    "episode_ids": [first, second],
                    "observations": np.stack([GOOD, GOOD]),
                    "rewards": [1.0, 6e8],
                }
            )
        reply = conn.request(
            {
                "type": "get_action",
                "episode_ids": [first, second],
                "observations": np.stack([GOOD, GOOD]),
                "rewards": [1.0, 0.0],
            }
        )
        assert len(reply["actions"]) == 2
        for eid in (first, second):
            assert conn.request({"type": "end_episode", "episode_id": eid, "observation": GOOD})
    finally:
        conn.close()


def test_server_checks_logged_actions(server: Any) -> None:
    """An action outside the action space is refused by the server (the client checks it too)."""
    with _client(server) as client:
        eid = client.start_episode()
        with pytest.raises(SpaceError):
            client.log_action(eid, GOOD, 2)
        client.end_episode(eid, GOOD)
    conn = Connection(server.address, None, "raw", "remote", Timeouts(request=30, reconnect=5))
    conn.open()
    try:
        eid = conn.request({"type": "start_episode"})["episode_id"]
        for action in (2, -1, 0.5, "left", [0, 1], None):
            with pytest.raises(SpaceError):
                conn.request(
                    {"type": "log_action", "episode_id": eid, "observation": GOOD, "action": action}
                )
        conn.request({"type": "log_action", "episode_id": eid, "observation": GOOD, "action": 1})
        assert conn.request({"type": "end_episode", "episode_id": eid, "observation": GOOD})
    finally:
        conn.close()


def test_unknown_policy(server: Any) -> None:
    with RawSocket(server.address) as raw:
        raw.hello()
        reply = raw.request({"type": "start_episode", "id": 5, "policy_id": "nope"})
        assert reply["type"] == "error"
        assert reply["code"] == "episode_error"
        assert reply["id"] == 5
        assert raw.request({"type": "ping", "id": 6}) == {"type": "pong", "id": 6}


def test_capacity_per_client(server: Any) -> None:
    with _client(server) as client:
        ids = [client.start_episode() for _ in range(4)]
        with pytest.raises(CapacityError):
            client.start_episode()
        with _client(server, name="other") as other:  # the limit is per connection
            eid = other.start_episode()
            other.get_action(eid, GOOD)
            other.end_episode(eid, GOOD)
        client.get_action(ids[0], GOOD)
        client.end_episode(ids[0], GOOD)
        ids[0] = client.start_episode()
        for eid in ids:
            client.get_action(eid, GOOD)
            client.end_episode(eid, GOOD)


def test_requests_before_hello_are_refused(server: Any) -> None:
    with RawSocket(server.address) as raw:
        reply = raw.request({"type": "start_episode", "id": 1})
        assert reply["type"] == "error"
        assert reply["code"] == "unauthorized"
        assert reply["id"] == 1
        raw.hello()  # the same connection may still say hello
        assert raw.request({"type": "ping", "id": 2}) == {"type": "pong", "id": 2}


@pytest.mark.parametrize(
    "message",
    [
        {"type": "get_action", "id": 3},  # fields missing
        {"type": "start_episode", "id": 3, "episode_id": "x" * 500},  # an id over its limit
        {"type": "log_returns", "id": 3, "episode_id": "e", "reward": float("nan")},
        {"type": "jump", "id": 3},  # an unknown type
        {"id": 3},  # no type at all
    ],
    ids=["missing-fields", "long-id", "nan-reward", "unknown-type", "no-type"],
)
def test_nothing_but_hello_is_read_before_hello(server: Any, message: dict[str, Any]) -> None:
    """Section 3.3: before hello every other message is unauthorized, its fields unread."""
    with RawSocket(server.address) as raw:
        reply = raw.request(message)
        assert (reply["type"], reply["id"], reply["code"]) == ("error", 3, "unauthorized")
        assert "the first message on a connection must be 'hello'" in reply["message"]
        raw.hello()  # the connection stays open and may still say hello
        assert raw.request({"type": "ping", "id": 4}) == {"type": "pong", "id": 4}


def test_a_malformed_hello_gets_its_field_error_and_the_connection_stays_open(
    server: Any,
) -> None:
    with RawSocket(server.address) as raw:
        reply = raw.request({"type": "hello", "id": 1})
        assert (reply["code"], reply["message"]) == (
            "decode_error",
            "'hello' needs the field 'protocol_version'",
        )
        raw.hello()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("client_id", "x" * 129),
        ("client_id", ""),
        ("client_name", "x" * 129),
        ("inference_mode", "x" * 129),
    ],
    ids=["long-client-id", "empty-client-id", "long-client-name", "long-inference-mode"],
)
def test_a_hello_refused_with_limit_exceeded_keeps_the_connection_unchanged(
    server: Any, field: str, value: str
) -> None:
    """Sections 3.3 and 7.1: unlike version_mismatch and unauthorized, it does not close."""
    bad = {"type": "hello", "id": 1, "protocol_version": 1, field: value}
    with RawSocket(server.address) as raw:
        reply = raw.request(bad)
        assert (reply["type"], reply["id"], reply["code"]) == ("error", 1, "limit_exceeded")
        # Open, and still before hello.
        assert raw.request({"type": "ping", "id": 2})["code"] == "unauthorized"
        client_id = uuid.uuid4().hex
        hello = {"type": "hello", "id": 3, "protocol_version": 1, "client_id": client_id}
        assert raw.request(hello)["type"] == "welcome"
        eid = raw.request({"type": "start_episode", "id": 4})["episode_id"]
        # Refused again once authenticated: still open, and still the same identity.
        assert raw.request({**bad, "id": 5})["code"] == "limit_exceeded"
        ask = {"type": "get_action", "id": 6, "episode_id": eid, "observation": GOOD}
        assert raw.request(ask)["type"] == "action"
        end = {"type": "end_episode", "id": 7, "episode_id": eid, "observation": GOOD}
        assert raw.request(end) == {"type": "ok", "id": 7}


def test_nil_is_the_same_as_absent_on_the_binary_carrier(server: Any) -> None:
    """Section 3.2: a client whose serialiser writes nil for unset members works unchanged."""
    nil = None
    with RawSocket(server.address) as raw:
        hello = {"type": "hello", "id": nil, "protocol_version": 1, "client_name": nil}
        hello |= {"token": nil, "inference_mode": nil, "client_id": nil}
        assert raw.request(hello)["type"] == "welcome"
        start = {"type": "start_episode", "id": nil, "episode_id": "nil-1"}
        start |= {"training_enabled": nil, "policy_id": nil}
        assert raw.request(start) == {"type": "episode_started", "id": 0, "episode_id": "nil-1"}
        get_action = {"type": "get_action", "id": 2, "episode_id": "nil-1", "observation": GOOD}
        get_action |= {"reward": nil, "seq": nil, "episode_ids": nil, "observations": nil}
        get_action |= {"rewards": nil, "seqs": nil}
        reply = raw.request(get_action)
        assert reply["type"] == "action" and reply["action"] in (0, 1), reply
        log_returns = {"type": "log_returns", "id": 3, "episode_id": "nil-1", "reward": 1.0}
        assert raw.request(log_returns | {"info": nil, "seq": nil}) == {"type": "ok", "id": 3}
        end = {"type": "end_episode", "id": 4, "episode_id": "nil-1", "observation": GOOD}
        end |= {"truncated": nil, "reward": nil, "seq": nil}
        assert raw.request(end) == {"type": "ok", "id": 4}
        weights = {"type": "get_weights", "id": 5, "policy_id": nil, "have_version": nil}
        assert raw.request(weights)["unchanged"] is False
        summary = {"episode_id": "nil-2", "return": 1.0, "length": 1, "reason": nil}
        report = {"type": "report_samples", "id": 6, "batch_id": "nil-batch", "policy_id": nil}
        reply = raw.request(report | {"fragments": [], "episodes": [summary]})
        assert (reply["type"], reply["steps"], reply["duplicate"]) == ("samples_accepted", 0, False)


def test_a_client_at_its_limit_cannot_take_over_another_clients_episode(server: Any) -> None:
    """Only start_episode answers capacity; acting in another's episode is an episode_error."""
    with RawSocket(server.address) as owner, RawSocket(server.address) as full:
        owner.hello()
        full.hello()
        assert owner.request({"type": "start_episode", "id": 1, "episode_id": "mine"})["id"] == 1
        held = [f"full-{i}" for i in range(4)]  # the module's server allows 4 per client
        for i, eid in enumerate(held):
            reply = full.request({"type": "start_episode", "id": i, "episode_id": eid})
            assert reply["type"] == "episode_started", reply
        calls = [
            {"type": "get_action", "episode_id": "mine", "observation": GOOD},
            {"type": "log_action", "episode_id": "mine", "observation": GOOD, "action": 0},
            {"type": "log_returns", "episode_id": "mine", "reward": 0.0},
            {"type": "end_episode", "episode_id": "mine", "observation": GOOD},
        ]
        for call in calls:
            reply = full.request({**call, "id": 9})
            assert (reply["type"], reply["code"]) == ("error", "episode_error"), reply
            assert "belongs to another client" in reply["message"]
        reply = full.request({"type": "start_episode", "id": 10, "episode_id": "mine"})
        assert (reply["code"], reply["message"]) == (
            "episode_error",
            "episode 'mine' is already active; end it first or use a new id",
        )
        reply = full.request({"type": "start_episode", "id": 11, "episode_id": "full-5"})
        assert reply["code"] == "capacity", reply
        end = {"type": "end_episode", "id": 12, "episode_id": "mine", "observation": GOOD}
        assert owner.request(end)["type"] == "ok"  # the owner's episode was never touched
        for eid in held:
            end = {"type": "end_episode", "id": 13, "episode_id": eid, "observation": GOOD}
            assert full.request(end)["type"] == "ok"


CARTPOLE_BOX = (
    "Box([-4.8               -inf -0.41887903        -inf], "
    "[4.8               inf 0.41887903        inf], (4,), float32)"
)


@pytest.mark.parametrize(
    ("observation", "message"),
    [
        (
            np.zeros(3, np.float32),
            f"observation: shape (3,) does not fit {CARTPOLE_BOX}; expected shape (4,)",
        ),
        (
            np.zeros((1, 4), np.float32),
            f"observation: shape (1, 4) does not fit {CARTPOLE_BOX}; expected shape (4,)",
        ),
        (
            np.array([0.0, 0.0, 9.0, 0.0], np.float32),
            "observation: value 9.0 at index (2,) is above the space's high bound 0.41887903; "
            "clip it or widen the space",
        ),
        (
            np.array([0.0, np.inf, 0.0, 0.0], np.float32),
            "observation: contains inf at index (1,); values must be finite in float32 (the "
            "server stores float32: |x| <= 3.4028235e+38)",
        ),
        (
            np.array([0.0, 0.0, 0.0, -1e39]),
            "observation: value -1e+39 at index (3,) is out of range; it is stored as float32 "
            "and must be finite float32 values (-3.4028235e+38..3.4028235e+38)",
        ),
    ],
    ids=["short", "batch-of-one", "above", "infinite", "float64-overflow"],
)
def test_a_bad_single_observation_is_described_as_it_was_sent(
    server: Any, observation: np.ndarray, message: str
) -> None:
    """The shape and index in the error are the sender's, never those of a batch of one."""
    with RawSocket(server.address) as raw:
        raw.hello()
        eid = raw.request({"type": "start_episode", "id": 2})["episode_id"]
        calls = [
            {"type": "get_action", "episode_id": eid, "observation": observation},
            {"type": "log_action", "episode_id": eid, "observation": observation, "action": 1},
            {"type": "end_episode", "episode_id": eid, "observation": observation},
        ]
        for call in calls:
            reply = raw.request({**call, "id": 3})
            assert (reply["code"], reply["message"]) == ("bad_value", message), call["type"]


def test_a_bad_batch_is_described_in_the_batch_shape(server: Any) -> None:
    with RawSocket(server.address) as raw:
        raw.hello()
        ids = [raw.request({"type": "start_episode", "id": i})["episode_id"] for i in range(2)]
        batch = {"type": "get_action", "id": 3, "episode_ids": ids}
        reply = raw.request({**batch, "observations": np.zeros((2, 3), np.float32)})
        assert (reply["code"], reply["message"]) == (
            "bad_value",
            "observations: a batch of 2 observations of shape (4,) must have shape (2, 4), got "
            "(2, 3)",
        )
        bad = np.zeros((2, 4), np.float32)
        bad[1, 2] = 9.0
        reply = raw.request({**batch, "observations": bad})
        assert reply["message"] == (
            "observations: value 9.0 at index (1, 2) is above the space's high bound "
            "0.41887903; clip it or widen the space"
        )
        for eid in ids:
            end = {"type": "end_episode", "id": 4, "episode_id": eid, "observation": GOOD}
            assert raw.request(end)["type"] == "ok"


@pytest.mark.parametrize(
    ("field", "value"), [("protocol_version", 2), ("inference_mode", "telepathy")]
)
def test_incompatible_hello_is_refused_and_closed(server: Any, field: str, value: Any) -> None:
    with RawSocket(server.address) as raw:
        hello = {"type": "hello", "id": 1, "protocol_version": 1, field: value}
        reply = raw.request(hello)
        assert reply["type"] == "error"
        assert reply["code"] == "version_mismatch"
        assert raw.receive() is None  # closed after the error


def test_reward_survives_a_refused_get_action(launch_server: Any) -> None:
    """A reward logged for a step is not lost when the next get_action is refused."""
    server = launch_server("--seed", "12")
    with _client(server, check=False) as client:
        eid = client.start_episode()
        client.get_action(eid, GOOD)
        client.log_returns(eid, 1.0)  # buffered: would travel with the next get_action
        with pytest.raises(SpaceError):
            client.get_action(eid, BAD_OBSERVATIONS["nan"])
        client.get_action(eid, GOOD)
        client.log_returns(eid, 2.0)
        client.end_episode(eid, GOOD)
    metrics = server.wait_until(lambda m: m["episodes/completed"] == 1, what="the episode")
    assert metrics["episodes/return_mean"] == pytest.approx(3.0)


@pytest.mark.parametrize("mode", ["remote", "local"])
def test_infos_that_merge_over_the_limit_are_refused_by_the_call_that_merges(
    server: Any, mode: str
) -> None:
    """Each map alone is within max_info_bytes (64 KiB); the second, merged, is not."""
    with PolicyClient(server.address, inference_mode=mode, client_name="infos", timeout=30) as c:
        eid = c.start_episode()
        c.get_action(eid, GOOD)
        c.log_returns(eid, 1.0, info={"first": bytes(40_000)})
        with pytest.raises(LimitExceededError, match=r"merge to .*max_info_bytes"):
            c.log_returns(eid, 1.0, info={"second": bytes(40_000)})
        # The refused call kept nothing: the step goes on with the first map and its reward.
        c.log_returns(eid, 2.0, info={"small": 1})
        c.get_action(eid, GOOD)
        c.end_episode(eid, GOOD)


def test_a_call_that_raises_took_no_effect(server: Any) -> None:
    """When a pipelined end_episode's error is raised by the next call, that call did nothing.

    Otherwise the caller is told start_episode failed while the server opened the episode.
    """
    with _client(server) as client:
        client.end_episode("never-existed", GOOD)  # pipelined; its error comes later
        with pytest.raises(EpisodeError):
            client.start_episode("started-or-not")
        eid = client.start_episode("started-or-not")
        client.get_action(eid, GOOD)
        client.end_episode(eid, GOOD)


def test_a_token_sent_to_a_server_without_one_is_warned_about_there(server: Any) -> None:
    with PolicyClient(server.address, token="s3cret", timeout=30) as client:
        client.end_episode(client.start_episode(), GOOD)  # admitted: the server has no token
    deadline = time.monotonic() + 30
    while "a client sent a token, but this server has none" not in server.log():
        assert time.monotonic() < deadline, server.log()
        time.sleep(0.05)
