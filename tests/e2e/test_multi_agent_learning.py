"""Several policies learn from multi-agent episodes: cooperation, and a frozen opponent.

Both examples' servers are started from their own TOML files (examples/meeting.toml and
examples/pursuit.toml), with the examples' environments driven by a multi-agent client, so the
examples are what is tested.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rlserve import PolicyClient

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
sys.path.insert(0, str(EXAMPLES))
import meeting  # noqa: E402
import pursuit  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


def test_two_policies_learn_to_meet_within_the_step_budget(launch_server: Any) -> None:
    """Red and blue each learn their half of meeting: both policies' returns pass 0.7.

    A random pair scores about 0.1 per agent; meeting at once scores 1.0. Budget: 1,500
    episodes (at most 36,000 agent steps).
    """
    server = launch_server("--seed", "3", spaces=("--config", str(EXAMPLES / "meeting.toml")))
    env = meeting.MeetingEnv()
    returns: list[float] = []
    with PolicyClient(server.address, inference_mode="remote") as client:
        assert client.multiagent
        for episode in range(1500):
            returns.append(meeting.play_episode(client, env, seed=episode))
            if episode >= 300 and np.mean(returns[-200:]) >= 0.7:
                break
    first = float(np.mean(returns[:100]))
    last = float(np.mean(returns[-200:]))
    assert last >= 0.7, f"mean return per agent {first:.2f} at first, {last:.2f} at the end"
    metrics = server.wait_until(
        lambda m: (
            m["policies/red/episodes/return_mean"] >= 0.6
            and m["policies/blue/episodes/return_mean"] >= 0.6
        ),
        timeout=30,
        what="both policies' return means",
    )
    # Each policy trained on its own agent's steps, with its own weights versions.
    for policy in ("red", "blue"):
        assert metrics[f"policies/{policy}/weights_version"] >= 3
        assert metrics[f"policies/{policy}/learner/steps_consumed"] > 0


def test_chasers_learn_against_a_frozen_runner(launch_server: Any) -> None:
    """The chasers' policy improves while the runner's never changes (frozen)."""
    server = launch_server("--seed", "5", spaces=("--config", str(EXAMPLES / "pursuit.toml")))
    env = pursuit.PursuitEnv()
    returns: list[float] = []
    with PolicyClient(server.address, inference_mode="remote") as client:
        runner_version = server.wait_until(
            lambda m: m["policies/runner/weights_version"] >= 0, what="the runner's weights"
        )["policies/runner/weights_version"]
        for episode in range(1500):
            returns.append(pursuit.play_episode(client, env, seed=episode))
            if episode >= 300 and np.mean(returns[-200:]) >= np.mean(returns[:200]) + 0.3:
                break
    first, last = float(np.mean(returns[:200])), float(np.mean(returns[-200:]))
    assert last >= first + 0.3, f"chasers' return {first:.2f} at first, {last:.2f} at the end"
    metrics = server.metrics()
    assert metrics["policies/runner/weights_version"] == runner_version  # never trained
    assert metrics["policies/runner/learner/steps_skipped_frozen"] > 0
    assert metrics["policies/chaser/weights_version"] > runner_version
