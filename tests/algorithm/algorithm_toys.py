"""Small environments and helpers shared by the Algorithm tests (imported by their module name)."""

from __future__ import annotations

import threading
from typing import Any

import gymnasium as gym
import numpy as np

from rlserve.env import ALL_AGENTS, ExternalEnv, MultiAgentEnv
from rlserve.errors import EnvError

OBS1 = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)


class Mimic(MultiAgentEnv):
    """Two agents see a sign each step; ``a`` scores for copying it, ``b`` for the opposite."""

    def __init__(self, config: Any = None) -> None:
        self.possible_agents = ["a", "b"]
        self.agents = list(self.possible_agents)
        self.observation_spaces = dict.fromkeys(self.possible_agents, OBS1)
        self.action_spaces = dict.fromkeys(self.possible_agents, gym.spaces.Discrete(2))
        self.rng = np.random.default_rng(0)
        self.t = 0
        self.sign = 1

    def _obs(self) -> dict[str, np.ndarray]:
        self.sign = int(self.rng.integers(0, 2))
        value = np.array([1.0 if self.sign else -1.0], np.float32)
        return {"a": value, "b": value}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action_dict: dict[str, Any]) -> Any:
        rewards = {
            "a": float(action_dict["a"] == self.sign),
            "b": float(action_dict["b"] != self.sign),
        }
        self.t += 1
        done = self.t >= 8
        return self._obs(), rewards, {ALL_AGENTS: done}, {ALL_AGENTS: False}, {}


class GuessSign(ExternalEnv):
    """A simulator with its own loop: one-step episodes, reward 1 for naming the sign."""

    def __init__(self) -> None:
        super().__init__(gym.spaces.Discrete(2), OBS1)
        self.rng = np.random.default_rng(0)
        self.stopped = threading.Event()

    def run(self) -> None:
        try:
            while True:
                sign = int(self.rng.integers(0, 2))
                obs = np.array([1.0 if sign else -1.0], np.float32)
                eid = self.start_episode()
                action = self.get_action(eid, obs)
                self.log_returns(eid, 1.0 if action == sign else 0.0)
                self.end_episode(eid, obs)
        except EnvError:
            self.stopped.set()  # the trainer closed the source


def strip_times(result: dict[str, Any]) -> dict[str, Any]:
    """``result`` without its wall-clock times (equal only across identical runs)."""
    out = dict(result)
    for key in ("time_this_iter_s", "time_total_s"):
        out.pop(key)
    out["learners"] = {
        pid: {k: v for k, v in m.items() if k != "update_seconds"}
        for pid, m in result["learners"].items()
    }
    return out
