"""Checks of what a single-agent ``gymnasium.Env`` returns from ``reset`` and ``step``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gymnasium import spaces
from gymnasium.utils.passive_env_checker import data_shares_objects

from rlserve.env.check_values import (
    check_flag,
    check_info,
    check_observation,
    check_reward,
    check_space,
)
from rlserve.env.report import EnvReport

__all__ = ["SingleAgentChecks", "Step"]

FIVE = "(obs, reward, terminated, truncated, info)"


@dataclass(slots=True)
class Step:
    """What one checked ``step()`` returned, as the episode loop needs it.

    Attributes:
        obs: The observation (a dict of them for multi-agent envs).
        reward: The reward (the sum over agents for multi-agent envs), 0.0 if unusable.
        over: Whether the episode ended (terminated or truncated).
    """

    obs: Any
    reward: float
    over: bool


class SingleAgentChecks:
    """Checks a single-agent env's spaces and every ``reset``/``step`` result.

    Args:
        report: Where findings go.
        env: The environment.
        seed: Seeds the action space, so the actions taken are the same on every run.
    """

    def __init__(self, report: EnvReport, env: Any, seed: int):
        self.report = report
        self.env = env
        self.seed = seed
        self._last_obs: Any = None
        self.observation_space: spaces.Space[Any] | None = None
        self.action_space: spaces.Space[Any] | None = None

    def check_spaces(self) -> bool:
        """Check both spaces; return whether the episodes can run (both are usable)."""
        observation: Any = getattr(self.env, "observation_space", None)
        action: Any = getattr(self.env, "action_space", None)
        if check_space(self.report, observation, "observation", "observation_space"):
            self.observation_space = observation
        if check_space(self.report, action, "action", "action_space"):
            self.action_space = action
            self.action_space.seed(self.seed)
        return self.observation_space is not None and self.action_space is not None

    def sample(self, obs: Any) -> Any:
        """An action from the (seeded) action space; it raises what ``sample()`` raises."""
        assert self.action_space is not None
        return self.action_space.sample()

    def reset_result(self, result: Any) -> Any:
        """Check what ``reset()`` returned; return the observation."""
        assert self.observation_space is not None
        if self._old_reset(result):
            self.report.add_problem(
                "reset_signature",
                "reset() returned the observation only (the old gym API): return "
                "(obs, info), e.g. `return obs, {}`",
            )
            obs = result
        elif not isinstance(result, tuple) or len(result) != 2:
            self.report.add_problem(
                "reset_signature",
                f"reset() returned {_describe(result)}: return a pair (obs, info)",
            )
            return None
        else:
            obs, info = result
            check_info(self.report, info, "reset()")
        check_observation(self.report, obs, self.observation_space, "reset()")
        self._last_obs = obs
        return obs

    def _old_reset(self, result: Any) -> bool:
        if not isinstance(result, tuple):
            return True
        # A Tuple observation space makes the bare observation a tuple as well.
        return (
            isinstance(self.observation_space, spaces.Tuple)
            and len(result) == len(self.observation_space.spaces)
            and not (len(result) == 2 and isinstance(result[1], dict))
        )

    def step_result(self, result: Any, step: int, episode: int) -> Step | None:
        """Check what ``step()`` returned; None when it cannot be read at all."""
        assert self.observation_space is not None
        if not isinstance(result, tuple) or len(result) not in (4, 5):
            self.report.add_problem(
                "step_signature", f"step() returned {_describe(result)}: return 5 values {FIVE}"
            )
            return None
        if len(result) == 4:
            self.report.add_problem(
                "step_signature",
                "step() returned 4 values (obs, reward, done, info: the old gym API): return 5 "
                f"values {FIVE}, with terminated for the task's end and truncated for a time "
                "limit",
            )
            obs, reward, done, info = result
            terminated, truncated = check_flag(self.report, done, "terminated", "step()"), False
        else:
            obs, reward, terminated, truncated, info = result
            terminated = check_flag(self.report, terminated, "terminated", "step()")
            truncated = check_flag(self.report, truncated, "truncated", "step()")
        check_observation(self.report, obs, self.observation_space, "step()")
        value = check_reward(self.report, reward, "step()")
        check_info(self.report, info, "step()")
        if terminated and truncated:
            self.report.add_warning(
                "terminated_and_truncated",
                f"step() returned terminated and truncated both True (step {step} of episode "
                f"{episode}): rlserve treats it as terminated, with no value bootstrapped from "
                "the last observation; return truncated=False when the task really ended",
            )
        if data_shares_objects(self._last_obs, obs):
            self.report.add_warning(
                "obs_reused",
                "step() returned an observation that shares memory with the previous one: code "
                "that keeps observations sees them change; return a new array (obs.copy())",
            )
        self._last_obs = obs
        return Step(obs, value, terminated or truncated)


def _describe(result: Any) -> str:
    if isinstance(result, tuple):
        return f"a tuple of {len(result)} values"
    return f"a {type(result).__name__}"
