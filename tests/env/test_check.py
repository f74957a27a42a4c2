"""check_env finds each deliberate mistake of a small broken env, names it, and passes good envs."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from rlserve.env.check import check_env
from rlserve.env.determinism import difference
from rlserve.errors import ConfigError

sys.path.insert(0, str(Path(__file__).parents[2] / "examples"))

from corridor import SimpleCorridor

FAST = pytest.mark.timeout(30)


class Good(gym.Env[np.ndarray, int]):
    """Ten steps of a seeded random walk in a float32 Box of shape (4,)."""

    length = 10

    def __init__(self, config: dict[str, Any] | None = None):
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.t = 0

    def obs(self) -> Any:
        return self.np_random.uniform(-1, 1, 4).astype(np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        super().reset(seed=seed)
        self.t = 0
        return self.obs(), {}

    def step(self, action: int) -> Any:
        self.t += 1
        return self.obs(), 1.0, self.t >= self.length, False, {}


class WrongShape(Good):
    def step(self, action: int) -> Any:
        obs, *rest = super().step(action)
        return (obs[:3], *rest)


class WrongDtype(Good):
    def __init__(self, config: Any = None):
        super().__init__(config)
        self.observation_space = gym.spaces.Box(-1, 1, (4,), np.int64)

    def obs(self) -> Any:
        return np.zeros(4, np.float32)


class OutsideBounds(Good):
    def obs(self) -> Any:
        obs = super().obs()
        obs[2] = 5.0
        return obs


class OldReset(Good):
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        return super().reset(seed=seed)[0]


class NoSeedReset(Good):
    def reset(self) -> Any:  # type: ignore[override]
        return super().reset()


class FourValues(Good):
    def step(self, action: int) -> Any:
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, reward, terminated or truncated, info


class NoneReward(Good):
    def step(self, action: int) -> Any:
        obs, _, *rest = super().step(action)
        return (obs, None, *rest)


class NanReward(Good):
    def step(self, action: int) -> Any:
        obs, _, *rest = super().step(action)
        return (obs, float("nan"), *rest)


class BadTypes(Good):
    def step(self, action: int) -> Any:
        obs, reward, terminated, _, _ = super().step(action)
        return obs, reward, int(terminated), None, "no info"


class Unseeded(Good):
    def step(self, action: int) -> Any:
        _, *rest = super().step(action)
        return (np.random.default_rng().uniform(-1, 1, 4).astype(np.float32), *rest)


class RaisesInStep(Good):
    def step(self, action: int) -> Any:
        if self.t == 3:
            raise ValueError("the engine crashed")
        return super().step(action)


class Float64(Good):
    def obs(self) -> Any:
        return super().obs().astype(np.float64)


class BothFlags(Good):
    def step(self, action: int) -> Any:
        obs, reward, terminated, _, info = super().step(action)
        return obs, reward, terminated, terminated, info


class NeverEnds(Good):
    length = 10**9


class NoSpaces(Good):
    def __init__(self, config: Any = None):
        self.action_space = gym.spaces.Discrete(2)


class ManyMistakes(WrongShape, NoneReward):
    """Two problems at once: both are reported."""


@FAST
def test_cartpole_is_ok() -> None:
    report = check_env("CartPole-v1")
    assert report.ok, report.summary()
    assert not report.warnings, report.summary()
    assert report.episodes == 3 and report.steps > 3
    assert report.mean_length is not None and report.mean_length > 1


@FAST
def test_an_rllib_style_class_taking_a_config_is_ok() -> None:
    report = check_env(SimpleCorridor, {"corridor_length": 3})
    assert report.ok, report.summary()
    assert report.env_name == "SimpleCorridor"
    assert report.mean_length is not None and report.mean_length >= 3
    assert check_env(Good).ok  # a class works without a config too
    assert check_env(lambda config: SimpleCorridor(config), {"corridor_length": 2}).ok
    assert check_env(SimpleCorridor({"corridor_length": 2})).ok


@FAST
@pytest.mark.parametrize(
    ("env", "kind", "words"),
    [
        (
            WrongShape,
            "obs_shape",
            "step() returned an observation of shape (3,) for a Box of shape (4,)",
        ),
        (WrongDtype, "obs_dtype", "dtype float32 for a Box of dtype int64"),
        (OutsideBounds, "obs_outside_space", "element (2,) is 5.0, above high 1.0"),
        (OldReset, "reset_signature", "(obs, info)"),
        (NoSeedReset, "reset_signature", "seed and options"),
        (FourValues, "step_signature", "4 values"),
        (NoneReward, "reward_type", "reward of type NoneType"),
        (NanReward, "reward_not_finite", "reward of nan"),
        (BadTypes, "terminated_type", "terminated of type int"),
        (BadTypes, "truncated_type", "truncated of type NoneType"),
        (BadTypes, "info_type", "info of type str"),
        (Unseeded, "nondeterministic", "the observations of step 0 differ"),
        (RaisesInStep, "step_exception", "ValueError: the engine crashed at step 3 of episode 0"),
        (NoSpaces, "space_missing", "observation_space"),
    ],
)
def test_each_mistake_is_named(env: Any, kind: str, words: str) -> None:
    report = check_env(env)
    assert not report.ok
    assert kind in report.kinds(), report.summary()
    [problem] = [p for p in report.problems if p.kind == kind]
    assert words in problem.message, problem.message
    assert f"[{kind}] {problem.message}" in report.summary()


@FAST
@pytest.mark.parametrize(
    ("env", "kind", "words"),
    [
        (Float64, "obs_dtype", "dtype float64 for a Box of dtype float32: rlserve casts it"),
        (BothFlags, "terminated_and_truncated", "treats it as terminated"),
        (NeverEnds, "episode_not_ending", "did not end within 50 steps"),
    ],
)
def test_legal_but_suspicious_is_a_warning_only(env: Any, kind: str, words: str) -> None:
    report = check_env(env, max_steps=50)
    assert report.ok, report.summary()
    assert kind in report.warning_kinds(), report.summary()
    [warning] = [w for w in report.warnings if w.kind == kind]
    assert words in warning.message, warning.message


@FAST
def test_every_problem_is_listed_once_with_its_count() -> None:
    report = check_env(ManyMistakes, episodes=2)
    assert {"obs_shape", "reward_type"} <= report.kinds()
    shape = next(p for p in report.problems if p.kind == "obs_shape")
    assert shape.count == 2 * Good.length  # every step (the determinism rollouts only compare)
    assert [p.kind for p in report.problems].count("obs_shape") == 1
    assert f"(seen {shape.count} times)" in report.summary()


@FAST
def test_an_exception_while_creating_is_a_problem_and_an_unknown_id_a_usage_error() -> None:
    def creator(config: dict[str, Any]) -> Any:
        raise RuntimeError("no licence")

    report = check_env(creator)
    assert report.kinds() == {"create"}
    assert "RuntimeError: no licence" in report.problems[0].message
    with pytest.raises(ConfigError, match="not a registered gymnasium id"):
        check_env("NoSuchEnv-v0")
    with pytest.raises(ConfigError, match="env_config"):
        check_env(Good(), {"x": 1})


@FAST
def test_difference_names_the_first_element_that_differs() -> None:
    assert difference(np.zeros(3), np.zeros(3) + 1e-7) is None
    assert difference({"a": np.array([0.0, np.nan])}, {"a": np.array([0.0, np.nan])}) is None
    assert difference(np.array([0.0, 1.0]), np.array([0.0, 2.0])) == "element (1,) is 1 vs 2"
    assert difference({"a": 1}, {"b": 1}) == "keys ['a'] vs ['b']"


class TwoAgents:
    """RLlib-style multi-agent env, duck-typed: both agents act every step for 5 steps."""

    possible_agents = ["red", "blue"]

    def __init__(self, config: dict[str, Any] | None = None):
        box = gym.spaces.Box(0.0, 1.0, (2,), np.float32)
        self.observation_spaces = {"red": box, "blue": box}
        self.action_spaces = {"red": gym.spaces.Discrete(3), "blue": gym.spaces.Discrete(3)}
        self.t = 0
        self.rng = np.random.default_rng()

    def obs(self, agent: str) -> Any:
        return self.rng.uniform(0, 1, 2).astype(np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        self.rng, self.t = np.random.default_rng(seed), 0
        return {a: self.obs(a) for a in self.possible_agents}, {}

    def step(self, actions: dict[str, int]) -> Any:
        assert set(actions) == set(self.possible_agents), actions
        self.t += 1
        over = self.t >= 5
        obs = {a: self.obs(a) for a in actions}
        rewards = {a: float(actions[a]) for a in actions}
        return obs, rewards, {"__all__": over}, {"__all__": False}, {}

    def close(self) -> None:
        pass


class BrokenAgents(TwoAgents):
    def obs(self, agent: str) -> Any:
        size = 3 if agent == "blue" else 2
        return self.rng.uniform(0, 1, size).astype(np.float32)

    def step(self, actions: dict[str, int]) -> Any:
        obs, rewards, _, truncateds, infos = super().step(actions)
        rewards["green"] = 1.0
        return obs, rewards, {"red": False}, truncateds, infos


class GetterAgents(TwoAgents):
    """Spaces through get_observation_space/get_action_space instead of dicts."""

    def __init__(self, config: dict[str, Any] | None = None):
        super().__init__(config)
        box = self.observation_spaces["red"]
        del self.observation_spaces, self.action_spaces
        self.get_observation_space = lambda agent: box
        self.get_action_space = lambda agent: gym.spaces.Discrete(3)


@FAST
@pytest.mark.parametrize("env", [TwoAgents, GetterAgents])
def test_a_good_multi_agent_env_is_ok(env: Any) -> None:
    report = check_env(env)
    assert report.ok, report.summary()
    assert report.multi_agent and report.episodes == 3 and report.steps == 15
    assert report.mean_return is not None and report.mean_return > 0


@FAST
def test_multi_agent_mistakes_are_named_per_agent() -> None:
    report = check_env(BrokenAgents, max_steps=20)
    assert {"obs_shape", "unknown_agent", "all_missing"} <= report.kinds(), report.summary()
    messages = {p.kind: p.message for p in report.problems}
    assert "for agent 'blue' returned an observation of shape (3,)" in messages["obs_shape"]
    assert "'green'" in messages["unknown_agent"]
    assert "terminateds without the '__all__' key" in messages["all_missing"]
    assert "episode_not_ending" in report.warning_kinds()


class RandomReward(Good):
    def step(self, action: int) -> Any:
        obs, _, *rest = super().step(action)
        return (obs, float(np.random.default_rng().integers(1000)), *rest)


class DictObs(Good):
    def __init__(self, config: Any = None):
        super().__init__(config)
        box = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.observation_space = gym.spaces.Dict({"pos": box, "vel": box})

    def obs(self) -> Any:
        return {"pos": self.np_random.uniform(-1, 1, 2).astype(np.float32)}


class AgentWithoutSpace(TwoAgents):
    def __init__(self, config: dict[str, Any] | None = None):
        super().__init__(config)
        del self.observation_spaces["blue"]


@FAST
def test_a_reward_that_differs_under_the_same_seed_is_nondeterministic() -> None:
    report = check_env(RandomReward)
    [problem] = report.problems
    assert problem.kind == "nondeterministic"
    assert "the rewards of step 0 differ" in problem.message


@FAST
def test_a_dict_observation_missing_a_key_names_it() -> None:
    report = check_env(DictObs)
    assert report.kinds() == {"obs_keys"}, report.summary()
    assert "missing: ['vel']" in report.problems[0].message


@FAST
def test_an_agent_without_an_observation_space_is_named() -> None:
    report = check_env(AgentWithoutSpace)
    assert "space_missing" in report.kinds(), report.summary()
    assert "observation_spaces['blue']" in report.problems[0].message
