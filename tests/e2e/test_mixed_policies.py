"""``rlserve serve`` with a PPO policy and a DQN policy in one run: both get actions (remote and
local inference, single-agent and multi-agent episodes), both train with their own learner, the
run folder records each one's algorithm, and ``--resume`` brings both back."""

from __future__ import annotations

import math
import signal
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

from rlserve import PolicyClient
from rlserve.algorithm import Algorithm, PPOConfig
from rlserve.client.local import LocalConfig
from rlserve.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, as a package
    import tomli as tomllib

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

CONFIG = """\
[server]
fragment_length = 16
checkpoint_every = 2
seed = 3

[ppo]
train_batch_size = 64
minibatch_size = 32
num_epochs = 1
hidden = [16]
device = "cpu"

[dqn]
learning_starts = 64
train_every = 16
batch_size = 16
hidden = [16]
device = "cpu"

[policies.red]
spaces_from = "CartPole-v1"

[policies.red.ppo]
lr = 0.0005

[policies.green]
spaces_from = "CartPole-v1"
algo = "dqn"

[policies.green.dqn]
exploration_steps = 300

[mapping]
"red_*" = "red"
"green_*" = "green"
"""

CARTPOLE = gym.make("CartPole-v1")


def play(client: PolicyClient, policy_id: str, seed: int) -> int:
    """One single-agent CartPole episode of ``policy_id``; return its length."""
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=seed)
    eid = client.start_episode(policy_id=policy_id)
    steps = 0
    while True:
        action = client.get_action(eid, obs)
        assert env.action_space.contains(action), action
        obs, reward, terminated, truncated, _ = env.step(action)
        client.log_returns(eid, float(reward))
        steps += 1
        if terminated or truncated:
            client.end_episode(eid, obs, truncated=not terminated)
            return steps


def play_pair(client: PolicyClient, seed: int) -> int:
    """One multi-agent episode: agent red_1 (PPO) and green_1 (DQN), each on its own CartPole."""
    envs = {"red_1": gym.make("CartPole-v1"), "green_1": gym.make("CartPole-v1")}
    obs = {a: env.reset(seed=seed + i)[0] for i, (a, env) in enumerate(envs.items())}
    eid = client.start_episode()
    steps = 0
    while True:
        actions = client.get_action(eid, obs)
        assert set(actions) == set(envs)
        rewards, done = {}, False
        for agent, env in envs.items():
            obs[agent], reward, terminated, truncated, _ = env.step(actions[agent])
            rewards[agent] = float(reward)
            done = done or terminated or truncated
        client.log_returns(eid, rewards)
        steps += len(envs)
        if done or steps >= 60:
            client.end_episode(eid, obs, truncated=True)
            return steps


def trained(metrics: dict[str, Any], pid: str, updates: float) -> bool:
    return bool(metrics[f"policies/{pid}/learner/updates"] >= updates)


def test_a_ppo_and_a_dqn_policy_serve_train_and_resume(launch_server: Any, tmp_path: Path) -> None:
    config = tmp_path / "mixed.toml"
    config.write_text(CONFIG)
    server = launch_server(spaces=("--config", str(config)))
    start = server.metrics()
    # Each policy's algorithm's metric names are there from the start (null before an update).
    assert start["policies/green/learner/q_loss"] is None
    assert start["policies/green/learner/epsilon"] is None
    assert start["policies/green/learner/gradient_steps"] == 0
    assert start["policies/red/learner/policy_loss"] is None
    assert "policies/red/learner/q_loss" not in start
    assert "learner/q_loss" in start and start["learner/gradient_steps"] == 0
    remote = PolicyClient(
        server.address, inference_mode="remote", client_name="red", multiagent=False, timeout=60
    )
    local = PolicyClient(
        server.address,
        inference_mode="local",
        client_name="green",
        multiagent=False,
        timeout=60,
        update_interval=0.2,
        local=LocalConfig(batch_steps=32, batch_interval=0.1),
    )
    pair = PolicyClient(
        server.address, inference_mode="remote", client_name="pair", multiagent=True, timeout=60
    )
    try:
        seed = 0
        while not (trained(server.metrics(), "red", 2) and trained(server.metrics(), "green", 2)):
            assert seed < 400, server.metrics()
            play(remote, "red", seed)
            play(local, "green", 10_000 + seed)
            play_pair(pair, 20_000 + seed)
            seed += 1
        metrics = server.wait_until(
            lambda m: m["learner/steps_consumed"] == m["samples/steps_logged"],
            timeout=60,
            what="everything logged read",
        )
    finally:
        for client in (remote, local, pair):
            client.close()
    # Both learned with their own algorithm: PPO's statistics for red, DQN's for green.
    assert math.isfinite(metrics["policies/red/learner/policy_loss"])
    assert math.isfinite(metrics["policies/green/learner/q_loss"])
    assert metrics["policies/green/learner/gradient_steps"] > 0
    assert metrics["policies/green/learner/epsilon"] < 1.0
    assert metrics["policies/red/weights_version"] >= 2
    assert metrics["policies/green/weights_version"] >= 2
    # The run folder records each policy's algorithm and both algorithms' settings.
    run = server.run_folder
    saved = tomllib.loads((run / "config.toml").read_text())
    assert saved["policies"]["green"]["algo"] == "dqn"
    assert saved["policies"]["green"]["dqn"] == {"exploration_steps": 300}
    assert saved["policies"]["red"] == {"frozen": False, "algo": "ppo", "ppo": {"lr": 0.0005}}
    assert saved["dqn"]["learning_starts"] == 64 and saved["ppo"]["train_batch_size"] == 64
    updates = {pid: metrics[f"policies/{pid}/learner/updates"] for pid in ("red", "green")}
    assert server.stop(signal.SIGTERM) == 0

    # A restart of the Algorithm API that would train green with PPO is refused, with the fix.
    obs_space, act_space = CARTPOLE.observation_space, CARTPOLE.action_space
    changed = (
        PPOConfig()
        .multi_agent(
            policies={
                "red": (None, obs_space, act_space, {}),
                "green": (None, obs_space, act_space, {}),
            },
            policy_mapping={"red_*": "red", "green_*": "green"},
        )
        .serving(port=0, http_port=-1)
    )
    with pytest.raises(ConfigError, match=r"policy 'green' of this run is trained by dqn"):
        Algorithm.from_checkpoint(run, changed)

    resumed = launch_server(resume=run)
    restored = resumed.wait_until(
        lambda m: all(trained(m, pid, updates[pid]) for pid in updates),
        timeout=120,
        what="each policy's learner restored",
    )
    assert f"resuming {run}" in resumed.stdout()
    assert "policies/red/learner/q_loss" not in restored  # red is still PPO's, green DQN's
    assert restored["policies/green/learner/gradient_steps"] > 0  # restored counters
    green = PolicyClient(
        resumed.address, inference_mode="remote", client_name="g2", multiagent=False, timeout=60
    )
    try:
        seed = 0
        while not trained(resumed.metrics(), "green", updates["green"] + 2):
            assert seed < 200, resumed.metrics()
            play(green, "green", 30_000 + seed)
            seed += 1
    finally:
        green.close()
    assert math.isfinite(resumed.metrics()["policies/green/learner/q_loss"])
    assert resumed.stop(signal.SIGTERM) == 0
