"""A short learning run end to end: PPO through the real server learns a small corridor."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

from rlserve import PolicyClient
from rlserve.protocol.spaces import describe

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

LENGTH = 5
TIME_LIMIT = 20
STEP_REWARD = -0.1
GOAL_REWARD = 1.0
OPTIMAL_RETURN = (LENGTH - 2) * STEP_REWARD + GOAL_REWARD  # 3 plain steps, then the goal: 0.7
THRESHOLD = 0.65
"""Mean return of the last 20 episodes to reach; a uniformly random policy averages below 0."""
STEP_BUDGET = 30_000
WINDOW = 20


class Corridor(gym.Env[np.ndarray, int]):
    """Cells 0..LENGTH-1, start in cell 0; action 1 moves right, 0 left; the goal is the last cell.

    Each step costs STEP_REWARD; reaching the goal pays GOAL_REWARD instead and terminates.
    The observation is the one-hot cell.
    """

    def __init__(self) -> None:
        self.observation_space = spaces.Box(0.0, 1.0, (LENGTH,), np.float32)
        self.action_space = spaces.Discrete(2)
        self._cell = 0

    def _obs(self) -> np.ndarray:
        obs = np.zeros(LENGTH, dtype=np.float32)
        obs[self._cell] = 1.0
        return obs

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self._cell = 0
        return self._obs(), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self._cell = min(max(self._cell + (1 if action == 1 else -1), 0), LENGTH - 1)
        if self._cell == LENGTH - 1:
            return self._obs(), GOAL_REWARD, True, False, {}
        return self._obs(), STEP_REWARD, False, False, {}


def test_corridor_env_optimum() -> None:
    """The arithmetic the threshold relies on."""
    env = gym.wrappers.TimeLimit(Corridor(), TIME_LIMIT)
    env.reset(seed=0)
    total, done = 0.0, False
    while not done:
        _, reward, terminated, truncated, _ = env.step(1)
        total += float(reward)
        done = terminated or truncated
    assert total == pytest.approx(OPTIMAL_RETURN)
    assert OPTIMAL_RETURN > THRESHOLD


def test_ppo_learns_the_corridor(launch_server: Any, tmp_path: Path) -> None:
    env = Corridor()
    spaces_file = tmp_path / "corridor_spaces.json"
    spaces_file.write_text(
        json.dumps(
            {
                "observation_space": describe(env.observation_space),
                "action_space": describe(env.action_space),
            }
        )
    )
    server = launch_server(
        "--seed",
        "0",
        "--fragment-length",
        "32",
        "--ppo-train-batch-size",
        "256",
        "--ppo-minibatch-size",
        "64",
        "--ppo-num-epochs",
        "4",
        "--ppo-lr",
        "0.003",
        "--ppo-gamma",
        "0.95",
        "--ppo-hidden",
        "32",
        "32",
        spaces=("--spaces-file", str(spaces_file)),
    )
    server.wait_for_weights(0)

    returns: list[float] = []
    steps = [0]
    ended = [0]  # every episode ended on the server, including one finished after the stop
    lock = threading.Lock()
    stop = threading.Event()
    reached = threading.Event()  # set at the moment the window meets the threshold
    errors: list[BaseException] = []

    def solved() -> bool:
        return len(returns) >= WINDOW and float(np.mean(returns[-WINDOW:])) >= THRESHOLD

    def run(seed: int) -> None:
        try:
            corridor = gym.wrappers.TimeLimit(Corridor(), TIME_LIMIT)
            with PolicyClient(
                server.address, inference_mode="remote", client_name=f"corridor-{seed}", timeout=60
            ) as client:
                assert client.observation_space.shape == (LENGTH,)
                obs, _ = corridor.reset(seed=seed)
                while not stop.is_set():
                    eid = client.start_episode()
                    total, done = 0.0, False
                    while not done:
                        action = client.get_action(eid, obs)
                        obs, reward, terminated, truncated, _ = corridor.step(action)
                        client.log_returns(eid, float(reward))
                        total += float(reward)
                        done = terminated or truncated
                        with lock:
                            steps[0] += 1
                    client.end_episode(eid, obs, truncated=not terminated)
                    obs, _ = corridor.reset()
                    with lock:
                        ended[0] += 1
                        if stop.is_set():
                            break  # the other client already ended the run
                        returns.append(total)
                        if solved():
                            reached.set()
                        if reached.is_set() or steps[0] >= STEP_BUDGET:
                            stop.set()
        except BaseException as exc:
            errors.append(exc)
            stop.set()

    threads = [threading.Thread(target=run, args=(seed,)) for seed in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(280)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)

    last = float(np.mean(returns[-WINDOW:]))
    assert reached.is_set() and solved(), (
        f"mean return of the last {WINDOW} episodes is {last:.3f} after {steps[0]} steps "
        f"and {len(returns)} episodes (threshold {THRESHOLD}, optimum {OPTIMAL_RETURN})"
    )
    metrics = server.wait_until(
        lambda m: m["episodes/completed"] == ended[0], what="every episode to be counted"
    )
    assert metrics["samples/env_steps"] == steps[0]
    assert metrics["server/weights_version"] >= 1
    assert metrics["learner/updates"] >= 1
