"""The learner pace: which replies wait, for how long, and in what order they go out."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rlserve.errors import ConfigError
from rlserve.server.config import ServerConfig
from rlserve.server.pacing import (
    RECURRENT_LAG_STEPS,
    LearnerPace,
    max_lag_steps,
    paced_fragment_length,
)


def _sent() -> tuple[list[dict[str, Any]], Any]:
    sent: list[dict[str, Any]] = []
    return sent, sent.append


def test_replies_wait_while_behind_and_go_out_in_order_once_caught_up() -> None:
    pace = LearnerPace(max_lag_steps=100)
    pace.update(unread_steps=0, owed_steps=0, connected=True)
    sent, respond = _sent()

    async def scenario() -> None:
        pace.paced(respond)({"type": "action", "id": 1})  # not behind: goes out at once
        pace.update(unread_steps=80, owed_steps=21)  # lag 101 > 100
        assert pace.behind
        first, second = pace.paced(respond), pace.paced(respond)
        first({"type": "action", "id": 2})
        second({"type": "ok", "id": 3})
        assert first.held and second.held
        assert [r["id"] for r in sent] == [1]
        pace.update(unread_steps=0)  # read: the lag is the owed 21
        assert [r["id"] for r in sent] == [1, 2, 3]
        assert pace.waiting == 0
        assert pace.metrics()["samples/replies_held"] == 2

    asyncio.run(scenario())


def test_errors_are_never_held() -> None:
    pace = LearnerPace(max_lag_steps=10)
    pace.update(unread_steps=50, connected=True)
    sent, respond = _sent()

    async def scenario() -> None:
        paced = pace.paced(respond)
        paced({"type": "error", "id": 7, "code": "episode", "message": "unknown episode"})
        assert not paced.held
        assert sent[0]["id"] == 7

    asyncio.run(scenario())


def test_nothing_is_held_without_a_learner_or_without_a_bound() -> None:
    sent, respond = _sent()

    async def scenario() -> None:
        unbounded = LearnerPace(max_lag_steps=0)
        unbounded.update(unread_steps=10**6, connected=True)
        assert not unbounded.enabled and not unbounded.behind
        gone = LearnerPace(max_lag_steps=10)
        gone.update(unread_steps=50, connected=True)
        held = gone.paced(respond)
        held({"type": "action", "id": 1})
        assert held.held
        gone.update(connected=False)  # the learner died: serving goes on
        assert [r["id"] for r in sent] == [1]
        assert not gone.behind

    asyncio.run(scenario())


def test_a_reply_is_held_at_most_max_hold_seconds() -> None:
    pace = LearnerPace(max_lag_steps=10, max_hold_seconds=0.05)
    pace.update(unread_steps=50, connected=True)
    sent, respond = _sent()

    async def scenario() -> None:
        pace.paced(respond)({"type": "action", "id": 1})
        assert sent == []
        for _ in range(200):  # no timing assertion: wait until the valve opens
            await asyncio.sleep(0.01)
            if sent:
                break
        assert [r["id"] for r in sent] == [1]
        assert pace.metrics()["samples/holds_timed_out"] == 1
        assert pace.behind  # still behind: the next reply waits again

    asyncio.run(scenario())


def test_close_sends_everything_held() -> None:
    pace = LearnerPace(max_lag_steps=10)
    pace.update(unread_steps=50, connected=True)
    sent, respond = _sent()

    async def scenario() -> None:
        pace.paced(respond)({"type": "action", "id": 1})
        pace.close()
        assert [r["id"] for r in sent] == [1]
        pace.paced(respond)({"type": "action", "id": 2})
        assert [r["id"] for r in sent] == [1, 2]

    asyncio.run(scenario())


def test_the_bound_defaults_to_one_training_round_and_is_never_below_one() -> None:
    assert max_lag_steps(None, []) == 0  # PPO only: never hold
    assert max_lag_steps(None, [64]) == 64
    assert max_lag_steps(None, [64, 256]) == 256
    assert max_lag_steps(0, [64]) == 0
    assert max_lag_steps(500, [64]) == 500
    with pytest.raises(ConfigError, match="at least 64"):
        max_lag_steps(32, [64])


def test_a_recurrent_ppo_policy_is_held_near_on_policy_by_default() -> None:
    assert max_lag_steps(None, [], recurrent=True) == RECURRENT_LAG_STEPS
    assert max_lag_steps(None, [1000], recurrent=True) == 1000  # a longer round wins
    assert max_lag_steps(0, [], recurrent=True) == 0  # set: as set
    assert max_lag_steps(4096, [], recurrent=True) == 4096


def test_fragments_are_cut_at_half_the_bound_while_pacing() -> None:
    assert paced_fragment_length(200, 64) == 32
    assert paced_fragment_length(200, 0) == 200
    assert paced_fragment_length(16, 64) == 16
    assert paced_fragment_length(200, 1) == 1


def test_a_negative_bound_is_refused() -> None:
    with pytest.raises(ConfigError, match="max_learner_lag_steps must be >= 0"):
        ServerConfig(max_learner_lag_steps=-1)


@pytest.mark.parametrize("seconds", [0.0, -1.0, float("inf"), float("nan")])
def test_a_hold_limit_that_is_not_a_positive_number_of_seconds_is_refused(seconds: float) -> None:
    with pytest.raises(ConfigError, match="max_hold_seconds must be a positive number of seconds"):
        ServerConfig(max_hold_seconds=seconds)
