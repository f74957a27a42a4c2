"""Per-policy metrics: a server with several policies adds ``policies/<id>/`` names and keeps
totals under today's names; a single-policy server keeps exactly today's names."""

from __future__ import annotations

import asyncio
import math
from typing import Any

from rlserve.cli.status import format_status
from rlserve.experience.episode_records import EpisodeSummary
from rlserve.server.learner_link import LearnerLink
from rlserve.server.stats import LEARNER_INITIAL, ServerStats


def summary(ret: float, policy_id: str = "default", **more: Any) -> EpisodeSummary:
    return EpisodeSummary("e", ret, 5, True, "terminated", policy_id=policy_id, **more)


def test_a_single_policy_server_keeps_todays_names() -> None:
    stats = ServerStats()
    names = set(stats.snapshot())
    stats.update_learner(
        "default",
        {
            "learner/updates": 2.0,
            "learner/steps_consumed": 7.0,  # the process's count comes with 'consumed'
            "learner/steps_skipped_frozen": 3.0,
        },
    )
    stats.set_policy_version("default", 4)
    stats.record_episode(summary(1.5))
    snapshot = stats.snapshot()
    assert set(snapshot) == names
    assert not any(name.startswith("policies/") for name in names)
    assert snapshot["learner/updates"] == 2
    assert snapshot["learner/steps_consumed"] == 0
    assert snapshot["server/weights_version"] == 4
    assert "policies" not in stats.state() and "policy_versions" not in stats.state()


def test_several_policies_have_their_own_names_and_totals() -> None:
    stats = ServerStats(("red", "blue"))
    snapshot = stats.snapshot()
    for pid in ("red", "blue"):
        assert snapshot[f"policies/{pid}/weights_version"] == -1
        assert math.isnan(snapshot[f"policies/{pid}/episodes/return_mean"])
        assert snapshot[f"policies/{pid}/learner/steps_skipped_frozen"] == 0
        for name in LEARNER_INITIAL:
            assert f"policies/{pid}/{name}" in snapshot
    stats.update_learner("red", {"learner/updates": 3.0, "learner/policy_loss": 0.5})
    stats.update_learner(
        "blue",
        {"learner/updates": 1.0, "learner/policy_loss": -0.25, "learner/weights_version": 9.0},
    )
    stats.set_policy_version("blue", 9)
    stats.set_policy_version("red", 3)
    # A single-agent episode counts for its policy; a multi-agent one for each of its policies.
    stats.record_episode(summary(2.0, policy_id="red"))
    stats.record_episode(summary(10.0, policy_returns={"red": 4.0, "blue": 6.0}))
    stats.record_episode(summary(1.0, policy_id="nobody"))  # a policy this server does not host
    snapshot = stats.snapshot()
    assert snapshot["policies/red/learner/updates"] == 3
    assert snapshot["policies/blue/learner/policy_loss"] == -0.25
    assert snapshot["learner/updates"] == 4  # summed
    assert snapshot["learner/policy_loss"] == -0.25  # the newest update's
    assert snapshot["learner/weights_version"] == 9  # the highest
    assert snapshot["server/weights_version"] == 9
    assert snapshot["policies/red/weights_version"] == 3
    assert snapshot["policies/red/episodes/return_mean"] == 3.0
    assert snapshot["policies/blue/episodes/return_mean"] == 6.0
    assert snapshot["episodes/completed"] == 3
    assert "red v3 3.0, blue v9 6.0" in stats.progress_line()
    shown = format_status("here", {"status": "ok"}, snapshot)
    assert "policy    red: weights v3, 3 updates" in shown
    assert "policy    blue: weights v9, 1 updates" in shown
    # Kept across a resume.
    again = ServerStats(("red", "blue"))
    again.restore(stats.state())
    assert again.snapshot()["policies/red/weights_version"] == 3
    assert again.snapshot()["policies/blue/episodes/return_mean"] == 6.0
    assert again.weights_version == 9


def test_the_log_is_cleaned_only_past_every_policys_checkpoints() -> None:
    """The learner handle combines each policy's needs; the server sees one position."""
    cleaned: list[int] = []

    async def on_checkpointed(message: dict[str, Any]) -> None:
        cleaned.append(message["log_needed_after"])

    link = LearnerLink(
        {"policies": [{"policy_id": "red"}, {"policy_id": "blue"}], "max_queue_steps": 10},
        ServerStats(("red", "blue")),
        None,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        on_checkpointed,
        dict,
    )

    def checkpointed(pid: str, needed: int, reason: str = "interval") -> dict[str, Any]:
        return {
            "type": "checkpointed",
            "policy_id": pid,
            "path": f"{pid}/ckpt",
            "reason": reason,
            "trained_through": needed,
            "log_needed_after": needed,
            "untrained_steps": 0,
        }

    async def scenario() -> None:
        await link._dispatch(checkpointed("red", 50))  # blue's needs are unknown yet: keep all
        await link._dispatch(checkpointed("blue", 20))
        await link._dispatch(checkpointed("red", 80))
        await link._dispatch(checkpointed("blue", 90))
        link.checkpoints.expect_final()
        await link._dispatch(checkpointed("red", 95, "shutdown"))
        assert not link.checkpoints.final_in.is_set()  # blue's final checkpoint is still to come
        await link._dispatch(checkpointed("blue", 95, "shutdown"))
        assert link.checkpoints.final_in.is_set()

    asyncio.run(scenario())
    assert cleaned == [0, 20, 20, 80, 90, 95]
    assert link.last_checkpoints == {"red": "red/ckpt", "blue": "blue/ckpt"}


def test_each_algorithms_names_are_listed_from_the_start() -> None:
    """DQN's and SAC's metric names are there before the first update, as PPO's are."""
    single = ServerStats()
    single.configure_policies(["default"], {"default": "dqn"})
    names = set(single.snapshot())
    for name in ("learner/q_loss", "learner/epsilon", "learner/gradient_steps"):
        assert name in names, name
    assert math.isnan(single.snapshot()["learner/epsilon"])
    assert single.snapshot()["learner/gradient_steps"] == 0
    assert "learner/alpha" not in names  # SAC's: no policy of this server is SAC's
    # Beyond a PPO server's names (which it keeps as they were): DQN's own.
    assert names - set(ServerStats().snapshot()) == {
        "learner/q_loss",
        "learner/q_mean",
        "learner/epsilon",
        "learner/lr",
        "learner/replay_size",
        "learner/gradient_steps",
        "learner/env_steps_ingested",
        "learner/gradient_steps_skipped_nonfinite",
    }

    stats = ServerStats()
    stats.configure_policies(["red", "green", "blue"], {"green": "dqn", "blue": "sac"})
    start = stats.snapshot()
    assert math.isnan(start["policies/green/learner/q_loss"])
    assert math.isnan(start["policies/blue/learner/alpha"])
    assert "policies/red/learner/q_loss" not in start  # red is PPO's (None: the default)
    assert "policies/green/learner/alpha" not in start
    assert math.isnan(start["policies/red/learner/policy_loss"])  # every policy has PPO's
    for total in ("learner/q_loss", "learner/alpha", "learner/gradient_steps"):
        assert total in start, total
    stats.update_learner("green", {"learner/q_loss": 0.5, "learner/gradient_steps": 7.0})
    stats.update_learner("blue", {"learner/alpha": 0.2, "learner/gradient_steps": 5.0})
    stats.update_learner("green", {"learner/q_loss": 0.25, "learner/gradient_steps": 9.0})
    now = stats.snapshot()
    assert now["learner/q_loss"] == 0.25  # the newest update's
    assert now["learner/alpha"] == 0.2
    assert now["learner/gradient_steps"] == 14  # summed over green and blue
    assert now["policies/green/learner/gradient_steps"] == 9
