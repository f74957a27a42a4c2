"""The dashboard's samples: series per policy side by side, the bounded history, client rates."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

from rlserve.experience.episode_records import EpisodeSummary
from rlserve.server.client_activity import ClientActivity, client_label
from rlserve.server.dashboard_feed import (
    POLICY_SERIES,
    TOTAL_SERIES,
    DashboardFeed,
    History,
    newest_checkpoint,
)
from rlserve.server.stats import ServerStats


def _summary(policy_id: str, episode_return: float, length: int) -> EpisodeSummary:
    return EpisodeSummary("e", episode_return, length, True, "terminated", None, policy_id)


def _feed(stats: ServerStats, activity: ClientActivity | None = None, **kw: Any) -> DashboardFeed:
    return DashboardFeed(
        stats,
        activity or ClientActivity(),
        lambda: {},
        lambda: {"status": "ok", "problems": {}},
        kw.pop("checkpoints", {}),
        **kw,
    )


def test_several_policies_side_by_side() -> None:
    stats = ServerStats(("attacker", "defender"))
    stats.update_learner("attacker", {"learner/policy_loss": 0.5, "learner/approx_kl": 0.01})
    stats.update_learner("defender", {"learner/policy_loss": -0.25})
    stats.set_policy_version("defender", 3)
    stats.record_episode(_summary("attacker", 10.0, 5))
    stats.record_episode(_summary("defender", -4.0, 7))
    sample = _feed(stats).sample()
    attacker, defender = sample["policies"]["attacker"], sample["policies"]["defender"]
    assert attacker["policy_loss"] == 0.5 and attacker["kl"] == 0.01
    assert defender["policy_loss"] == -0.25 and defender["kl"] is None  # NaN: not yet
    assert attacker["return_mean"] == 10.0 and defender["return_mean"] == -4.0
    assert defender["weights_version"] == 3 and attacker["weights_version"] == -1
    assert sample["totals"]["length_mean"] == 6.0
    assert set(attacker) == set(POLICY_SERIES)
    assert set(sample["totals"]) == set(TOTAL_SERIES)
    json.dumps(sample, allow_nan=False)  # what the page receives has no NaN


def test_one_policy_reads_the_unprefixed_names() -> None:
    stats = ServerStats()
    stats.update_learner("default", {"learner/entropy": 0.69})
    stats.set_policy_version("default", 2)
    stats.count_actions(40, batch=40)
    sample = _feed(stats).sample()
    assert sample["policies"]["default"]["entropy"] == 0.69
    assert sample["policies"]["default"]["weights_version"] == 2
    assert sample["env_steps"] == 40


def test_every_mapped_key_exists_in_a_snapshot() -> None:
    """The mapping tables name real metrics (catches a rename in stats.py)."""
    single = ServerStats().snapshot()
    several = ServerStats(("a", "b")).snapshot()
    # Set by the learner pace, a metric source of the running server.
    missing = {key for key in TOTAL_SERIES.values() if key not in single}
    assert missing <= {"samples/learner_lag_steps"}
    for many, one in POLICY_SERIES.values():
        assert one in single, one
        assert f"policies/a/{many}" in several, many


def test_history_keeps_the_whole_run_in_bounded_points() -> None:
    history = History(capacity=8)
    for step in range(100):
        history.add({"env_steps": step})
    kept = [p["env_steps"] for p in history.points]
    assert len(kept) <= 8
    assert kept[0] == 0  # the start of the run stays
    assert kept == sorted(kept)
    assert kept[-1] >= 100 - 16  # and the recent past


def test_history_grows_with_each_sample_and_opening_holds_it() -> None:
    feed = _feed(ServerStats(), capacity=50)
    for _ in range(5):
        feed.sample()
    opening = feed.opening()
    assert len(opening["history"]) == 5
    assert opening["latest"]["env_steps"] == 0
    assert opening["policies"] == ["default"]


def test_follow_yields_each_new_sample_and_ends_on_stop() -> None:
    async def scenario() -> list[int]:
        stats = ServerStats()
        feed = _feed(stats)
        seen: list[int] = []

        async def reader() -> None:
            async for sample in feed.follow():
                seen.append(sample["env_steps"])

        task = asyncio.create_task(reader())
        await asyncio.sleep(0)
        for steps in (3, 4):
            stats.count_actions(steps, batch=0)
            feed.sample()
            await asyncio.sleep(0)
        feed.stop()
        await asyncio.wait_for(task, 5)
        return seen

    assert asyncio.run(scenario()) == [3, 7]


def test_client_rates_hide_identities() -> None:
    now = [0.0]
    activity = ClientActivity(clock=lambda: now[0])
    for _ in range(20):
        activity.saw("client:secret-http-id", "")
    activity.saw("client:sim-7", "cartpole-sim")
    now[0] = 2.0
    rows = activity.table({"client:secret-http-id": 3})
    assert [row["requests_per_s"] for row in rows] == [10.0, 0.5]
    assert rows[0]["client"] == client_label("client:secret-http-id")
    assert "secret" not in json.dumps(rows)
    assert rows[0]["open_episodes"] == 3
    assert rows[1]["name"] == "cartpole-sim"
    now[0] = 100.0
    rows = activity.table({"client:secret-http-id": 1})
    assert [row["client"] for row in rows] == [client_label("client:secret-http-id")]


def test_newest_checkpoint(tmp_path: Path) -> None:
    assert newest_checkpoint(tmp_path / "none") is None
    for i, name in enumerate(("ckpt_000010.pt", "ckpt_000020.pt")):
        (tmp_path / name).write_bytes(b"x")
        os.utime(tmp_path / name, (1000 + i, 1000 + i))
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    newest = newest_checkpoint(tmp_path)
    assert newest is not None and newest["name"] == "ckpt_000020.pt"
    sample = _feed(ServerStats(), checkpoints={"default": tmp_path}).sample()
    assert sample["checkpoints"]["default"]["name"] == "ckpt_000020.pt"
