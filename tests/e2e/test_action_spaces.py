"""Every action space PPO acts in, end to end: remote and local clients, training, ONNX export.

Each case starts a real server with its spaces file, plays episodes in both inference modes
(with some ``log_action`` steps), waits for the learner to train on them, and exports the
checkpoint with ``rlserve export``. A space PPO cannot learn stops ``rlserve serve`` before it
listens, with the reason and no run folder left behind.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import onnxruntime as ort
import pytest
from e2e_support import small_ppo
from gymnasium import spaces

from rlserve import PolicyClient
from rlserve.client.local import LocalConfig
from rlserve.policy.action_layout import actions_to_space
from rlserve.policy.space_distribution import action_distribution
from rlserve.protocol.spaces import describe, from_description

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

CASES: dict[str, tuple[gym.Space[Any], gym.Space[Any]]] = {
    "multi_discrete": (spaces.Discrete(3), spaces.MultiDiscrete([3, 2], start=[1, -1])),
    "multi_binary": (spaces.MultiBinary(4), spaces.MultiBinary([2, 2])),
    "box_2d": (spaces.Box(-1.0, 1.0, (4,), np.float32), spaces.Box(-1.0, 1.0, (2, 2))),
    "dict": (
        spaces.Dict({"pos": spaces.Box(-1.0, 1.0, (2,), np.float32), "mode": spaces.Discrete(2)}),
        spaces.Dict(
            {
                "gear": spaces.Discrete(3, start=1),
                "lights": spaces.MultiBinary(2),
                "steer": spaces.Box(-1.0, 1.0, (1,), np.float32),
            }
        ),
    ),
    "tuple": (
        spaces.Tuple((spaces.Box(-1.0, 1.0, (3,), np.float32), spaces.MultiDiscrete([2, 2]))),
        spaces.Tuple((spaces.MultiDiscrete([2, 3]), spaces.Box(0.0, 1.0, (2,), np.float32))),
    ),
}
SMALL_PPO = (*small_ppo(hidden=(16, 16), fragment_length=8), "--checkpoint-every", "1")
QUICK = LocalConfig(batch_steps=16, batch_interval=0.1)
EPISODES, STEPS = 3, 12


def _spaces_file(tmp_path: Path, obs: gym.Space[Any], act: gym.Space[Any]) -> Path:
    path = tmp_path / "spaces.json"
    path.write_text(json.dumps({"observation_space": describe(obs), "action_space": describe(act)}))
    return path


def _play(client: PolicyClient, obs_space: gym.Space[Any], seed: int) -> int:
    """Play short episodes; every third step is a logged action. Return the steps taken."""
    act_space = client.action_space
    obs_space.seed(seed)
    act_space.seed(seed)
    steps = 0
    for _ in range(EPISODES):
        eid = client.start_episode()
        for t in range(STEPS):
            obs = obs_space.sample()
            if t % 3 == 2:
                client.log_action(eid, obs, act_space.sample())
            else:
                action = client.get_action(eid, obs)
                assert act_space.contains(action), action  # the space's own form
            client.log_returns(eid, 1.0)
            steps += 1
        client.end_episode(eid, obs_space.sample(), truncated=True)
    # Several episodes in one call: a stacked array, or a list of maps / tuples.
    ids = [client.start_episode() for _ in range(2)]
    batch = client.get_action(ids, [obs_space.sample() for _ in ids])
    assert len(batch) == 2 and all(act_space.contains(a) for a in batch), batch
    for eid in ids:
        client.end_episode(eid, obs_space.sample(), truncated=True)
    return steps + len(ids)


@pytest.mark.parametrize("name", list(CASES))
def test_an_action_space_trains_in_both_modes_and_exports(
    name: str, launch_server: Any, run_rlserve: Any, tmp_path: Path
) -> None:
    obs_space, act_space = (from_description(describe(s)) for s in CASES[name])
    spaces_file = _spaces_file(tmp_path, obs_space, act_space)
    server = launch_server(*SMALL_PPO, "--seed", "2", spaces=("--spaces-file", str(spaces_file)))
    server.wait_for_weights(0)
    total = 0
    for mode, seed in (("remote", 1), ("local", 2)):
        local = QUICK if mode == "local" else None
        with PolicyClient(server.address, inference_mode=mode, local=local, timeout=30) as client:
            assert describe(client.action_space) == describe(act_space)
            total += _play(client, obs_space, seed)
    metrics = server.wait_until(
        lambda m: m.get("learner/steps_trained", 0) > 0 and m["server/weights_version"] >= 1,
        what="an update trained on both modes' steps",
    )
    assert metrics["samples/env_steps"] == total
    assert metrics["samples/steps_reported"] > 0  # the local client's steps
    assert metrics["learner/fragments_excluded_invalid"] == 0
    server.wait_until(lambda m: bool(server.checkpoints), what="a checkpoint")

    output = tmp_path / "export" / "policy.onnx"
    done = run_rlserve("export", str(server.run_folder), "--output", str(output))
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in output.parent.iterdir()) == ["policy.onnx", "policy.onnx.json"]
    obs_space.seed(3)
    obs = np.stack([spaces.flatten(obs_space, obs_space.sample()) for _ in range(5)])
    session = ort.InferenceSession(str(output))
    action = session.run(["action"], {"obs": obs.astype(np.float32)})[0]
    dist = action_distribution(act_space)
    assert action.shape == (5, dist.action_width)
    for value in actions_to_space(act_space, action.astype(np.float64)):
        assert act_space.contains(value), value


@pytest.mark.parametrize(
    ("action_space", "reason"),
    [
        (spaces.Box(0, 5, (2,), np.int64), "use a float32 Box, or MultiDiscrete"),
        (spaces.MultiDiscrete([]), "no elements to act on"),
    ],
)
def test_a_space_ppo_cannot_learn_is_refused_before_listening(
    action_space: gym.Space[Any], reason: str, run_rlserve: Any, tmp_path: Path
) -> None:
    spaces_file = _spaces_file(tmp_path, spaces.Box(-1.0, 1.0, (2,), np.float32), action_space)
    runs = tmp_path / "runs"
    done = run_rlserve(
        "serve", "--spaces-file", str(spaces_file), "--run-dir", str(runs), "--port", "0"
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert reason in done.stderr and "Traceback" not in done.stderr
    assert "listening" not in done.stdout
    assert not runs.exists() or not any(runs.iterdir())
