"""Small environments for the env source tests (importable by sub-processes through fork)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np


class Float64Env(gym.Env[np.ndarray, int]):
    """A float32 Box env that returns float64 obs and ends terminated AND truncated together."""

    observation_space = gym.spaces.Box(-1e6, 1e6, (3,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        config = config or {}
        self.length = int(config.get("length", 4))
        self.t = 0
        self.offset = 0.0

    def _obs(self) -> np.ndarray:
        return np.array([self.t, self.offset, 0.1], dtype=np.float64)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        super().reset(seed=seed)
        self.t = 0
        self.offset = float(self.np_random.integers(0, 1000))
        return self._obs(), {}

    def step(self, action: int) -> Any:
        self.t += 1
        done = self.t >= self.length
        info = {"t": self.t} if self.t % 2 == 0 else {}
        return self._obs(), float(action), done, done, info


class FaultyEnv(gym.Wrapper[Any, Any, Any, Any]):
    """CartPole whose copy ``config["copy"]`` misbehaves at its ``config["at"]``-th step.

    ``config["mode"]``: ``raise`` (exception), ``exit`` (os._exit), ``kill`` (SIGKILL itself),
    ``hang`` (sleeps for ever), ``reset_raise`` (raises at that step, and every later reset
    raises once the file ``config["marker"]`` exists).
    """

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self.config = config
        # One copy per process: worker_index is the copy's index plus 1.
        self.bad = config.worker_index - 1 == config["copy"]  # type: ignore[attr-defined]
        self.steps = 0

    def reset(self, **kwargs: Any) -> Any:
        marker = self.config.get("marker")
        if self.bad and marker and Path(marker).exists():
            raise RuntimeError("reset always fails now")
        self.steps = 0
        return self.env.reset(**kwargs)

    def step(self, action: Any) -> Any:
        self.steps += 1
        if self.bad and self.steps == self.config["at"]:
            mode = self.config["mode"]
            if mode == "raise":
                raise ValueError("boom at step")
            if mode == "exit":
                os._exit(3)
            if mode == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if mode == "hang":
                time.sleep(3600)
            if mode == "reset_raise":
                Path(self.config["marker"]).touch()
                raise ValueError("step failed, and resets will too")
        return self.env.step(action)


class RecordContext(gym.Env[np.ndarray, int]):
    """Puts the worker and vector index of its env_config into its observation."""

    observation_space = gym.spaces.Box(0, 100, (3,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, config: Any) -> None:
        self.ids = (config.worker_index, config.vector_index, config.get("x", 0))

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        super().reset(seed=seed)
        return np.array(self.ids, dtype=np.float32), {}

    def step(self, action: int) -> Any:
        return np.array(self.ids, dtype=np.float32), 0.0, False, False, {}


class OldGymApi(gym.Env[np.ndarray, int]):
    """The pre-Gymnasium gym API: ``reset()`` returns the observation alone (``config["reset"]
    == "obs"``) or ``step()`` returns ``(obs, reward, done, info)`` (``config["step"] == 4``)."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, config: Any = None) -> None:
        self.config = dict(config or {})

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        obs = np.zeros(2, np.float32)
        return obs if self.config.get("reset") == "obs" else (obs, {})

    def step(self, action: int) -> Any:
        obs = np.zeros(2, np.float32)
        if self.config.get("step") == 4:
            return obs, 1.0, False, {}
        return obs, 1.0, False, False, {}
