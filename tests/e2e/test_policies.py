"""A server hosting two policies declared in a TOML file: single-agent episodes of each over
the raw binary protocol train each policy apart, with its own weights, checkpoints and metrics,
and ``--resume`` brings both back."""

from __future__ import annotations

import json
import re
import signal
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from e2e_support import RawSocket

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, as a package
    import tomli as tomllib

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

METRICS_DOC = Path(__file__).parents[2] / "docs" / "metrics.md"

CONFIG = """\
[server]
fragment_length = 16
checkpoint_every = 1
max_sample_queue_steps = 1000000

[ppo]
train_batch_size = 64
minibatch_size = 32
num_epochs = 1
hidden = [16]

[policies.red]
spaces_from = "CartPole-v1"

[policies.red.ppo]
lr = 0.0005

[policies.blue]
observation_space = { type = "Box", shape = [5], low = 0.0, high = 1.0 }
action_space = { type = "Discrete", n = 3 }

[mapping]
"red_*" = "red"
"blue_*" = "blue"
"""


class Player:
    """Plays single-agent episodes of one policy over a raw binary connection."""

    def __init__(self, address: str, policy_id: str, seed: int):
        self.conn = RawSocket(address, timeout=60)
        self.conn.hello()
        self.policy_id = policy_id
        self.rng = np.random.default_rng(seed)
        self.ids = iter(range(1, 1 << 30))
        self.steps = 0

    def call(self, message: dict[str, Any]) -> dict[str, Any]:
        reply = self.conn.request({**message, "id": next(self.ids)})
        assert reply["type"] != "error", reply
        return reply

    def episode(self) -> None:
        started = self.call({"type": "start_episode", "policy_id": self.policy_id})
        eid = started["episode_id"]
        if self.policy_id == "red":
            env = gym.make("CartPole-v1")
            obs, _ = env.reset(seed=int(self.rng.integers(1 << 30)))
            for _ in range(40):
                action = self.call({"type": "get_action", "episode_id": eid, "observation": obs})
                obs, reward, terminated, _, _ = env.step(int(action["action"]))
                self.call({"type": "log_returns", "episode_id": eid, "reward": float(reward)})
                self.steps += 1
                if terminated:
                    break
            env.close()
        else:
            for _ in range(20):
                obs = self.rng.uniform(0, 1, 5).astype(np.float32)
                action = self.call({"type": "get_action", "episode_id": eid, "observation": obs})
                assert action["action"] in (0, 1, 2)
                self.call({"type": "log_returns", "episode_id": eid, "reward": 0.1})
                self.steps += 1
            obs = self.rng.uniform(0, 1, 5).astype(np.float32)
        self.call({"type": "end_episode", "episode_id": eid, "observation": obs, "truncated": True})

    def play_until(self, server: Any, key: str, at_least: float) -> None:
        """Play episodes until the server's metric ``key`` reaches ``at_least``."""
        for _ in range(200):
            if server.metrics()[key] >= at_least:
                return
            self.episode()
        raise AssertionError(f"{key} stayed below {at_least}: {server.metrics()[key]}")


def expected_metrics(policies: list[str]) -> set[str]:
    """The doc's names: the totals of a single-policy server and, per policy, the
    ``policies/<id>/`` names (each ``learner/`` name but restarts, and the rows of that table)."""
    text = METRICS_DOC.read_text()
    totals = set(re.findall(r"^\| `([a-z_]+/[a-z_0-9]+)` \|", text, re.M))
    per_policy = set(re.findall(r"^\| `policies/<id>/([a-z_/0-9]+)` \|", text, re.M))
    per_policy |= {n for n in totals if n.startswith("learner/") and n != "learner/restarts"}
    return totals | {f"policies/{pid}/{name}" for pid in policies for name in per_policy}


def test_two_policies_train_apart_and_resume(launch_server: Any, tmp_path: Path) -> None:
    config = tmp_path / "two.toml"
    config.write_text(CONFIG)
    server = launch_server(spaces=("--config", str(config)))
    before = server.metrics()
    assert set(before) == expected_metrics(["red", "blue"]), set(before) ^ expected_metrics(
        ["red", "blue"]
    )
    red = Player(server.address, "red", seed=1)
    blue = Player(server.address, "blue", seed=2)
    try:
        red.play_until(server, "policies/red/weights_version", 1)
        blue.play_until(server, "policies/blue/weights_version", 1)
        metrics = server.wait_until(
            lambda m: (
                m["policies/red/learner/updates"] >= 1
                and m["policies/blue/learner/updates"] >= 1
                and m["learner/steps_consumed"] == m["samples/steps_logged"]
            ),
            timeout=120,
            what="an update of each policy, everything logged read",
        )
    finally:
        red.conn.close()
        blue.conn.close()
    assert set(metrics) == expected_metrics(["red", "blue"])
    # Each policy trained on its own steps only; the totals are their sums.
    assert metrics["policies/red/learner/steps_consumed"] == red.steps
    assert metrics["policies/blue/learner/steps_consumed"] == blue.steps
    assert metrics["learner/updates"] == (
        metrics["policies/red/learner/updates"] + metrics["policies/blue/learner/updates"]
    )
    assert metrics["server/weights_version"] == max(
        metrics["policies/red/weights_version"], metrics["policies/blue/weights_version"]
    )
    assert metrics["samples/env_steps"] == red.steps + blue.steps
    # The run folder: each policy's own checkpoints and weights; the declarations saved.
    run = server.run_folder
    for pid in ("red", "blue"):
        assert sorted((run / "policies" / pid / "checkpoints").glob("ckpt_*.pt")), pid
        assert (run / "policies" / pid / "weights.npz").is_file()
    assert not (run / "checkpoints").exists() and not (run / "weights").exists()
    saved = tomllib.loads((run / "config.toml").read_text())
    # Each policy's algorithm is recorded (the run's, here), its overrides in its table.
    assert saved["policies"]["red"] == {"frozen": False, "algo": "ppo", "ppo": {"lr": 0.0005}}
    assert saved["mapping"] == {"red_*": "red", "blue_*": "blue"}
    assert set(json.loads((run / "spaces.json").read_text())["policies"]) == {"red", "blue"}
    versions = {pid: metrics[f"policies/{pid}/weights_version"] for pid in ("red", "blue")}
    updates = {pid: metrics[f"policies/{pid}/learner/updates"] for pid in ("red", "blue")}
    assert server.stop(signal.SIGTERM) == 0
    assert "final checkpoints: red: " in server.stdout() and ", blue: " in server.stdout()

    resumed = launch_server(resume=run)
    out = resumed.stdout()
    assert f"resuming {run}" in out
    assert f"serving weights red v{versions['red']:.0f}, blue v{versions['blue']:.0f}" in out
    # Served at once, versions never go back, the learners' counters come back.
    restored = resumed.wait_until(
        lambda m: all(m[f"policies/{pid}/learner/updates"] == updates[pid] for pid in updates),
        timeout=120,
        what="each policy's learner restored",
    )
    for pid in ("red", "blue"):
        assert restored[f"policies/{pid}/weights_version"] >= versions[pid]
    assert "for policy 'red'" in resumed.stdout() and "for policy 'blue'" in resumed.stdout()
    blue = Player(resumed.address, "blue", seed=3)
    try:
        blue.play_until(resumed, "policies/blue/weights_version", versions["blue"] + 1)
    finally:
        blue.conn.close()
    final = resumed.wait_until(
        lambda m: m["learner/steps_consumed"] == m["samples/steps_logged"],
        timeout=120,
        what="everything logged read",
    )
    assert final["policies/red/weights_version"] == versions["red"]  # no red steps since
    assert final["policies/blue/learner/updates"] > updates["blue"]
    assert "Traceback" not in resumed.log()
    assert resumed.stop() == 0
