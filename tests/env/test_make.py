from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.envs.classic_control import CartPoleEnv
from toy_envs import Float64Env, RecordContext

from rlserve.env import (
    EnvContext,
    EnvSource,
    InProcessVectorSource,
    ProcessVectorSource,
    env_creator,
    make_env,
    to_source,
)
from rlserve.errors import ConfigError

pytestmark = pytest.mark.timeout(30)


def test_instance_is_used_as_is() -> None:
    env = gym.make("CartPole-v1")
    assert make_env(env) is env
    source = to_source(env, seed=0)
    assert isinstance(source, InProcessVectorSource)
    assert source.envs == [env]
    source.close()


def test_registered_id_gets_env_config_as_keywords() -> None:
    env = make_env("CartPole-v1", {"max_episode_steps": 7})
    assert env.spec is not None and env.spec.max_episode_steps == 7
    env.close()


def test_class_with_env_config_rllib_style() -> None:
    env = make_env(Float64Env, {"length": 9})
    assert isinstance(env, Float64Env) and env.length == 9


def test_gymnasium_style_class_takes_keywords_and_render_mode() -> None:
    env = make_env(CartPoleEnv, render_mode="rgb_array")
    assert isinstance(env, CartPoleEnv) and env.render_mode == "rgb_array"


def test_zero_arg_callable() -> None:
    env = make_env(lambda: gym.make("CartPole-v1"))
    assert env.observation_space.shape == (4,)


def test_creator_gets_env_context_per_copy() -> None:
    source = InProcessVectorSource(RecordContext, {"x": 5}, num_envs=3, seed=0)
    obs, _ = source.reset_all()
    np.testing.assert_array_equal(obs, [[0, 0, 5], [0, 1, 5], [0, 2, 5]])
    ctx = EnvContext({"a": 1}, worker_index=2, vector_index=3)
    assert dict(ctx) == {"a": 1} and (ctx.worker_index, ctx.vector_index) == (2, 3)
    other = ctx.copy_with(vector_index=4)
    assert (other.worker_index, other.vector_index, other["a"]) == (2, 4, 1)


def test_unregistered_id_suggests_close_matches() -> None:
    with pytest.raises(ConfigError, match="CartPole-v1"):
        make_env("CartPol-v1")


@pytest.mark.parametrize("bad", [42, None, ["CartPole-v1"]])
def test_not_an_env_form(bad: Any) -> None:
    with pytest.raises(ConfigError, match="registered id"):
        make_env(bad)


def test_creator_returning_something_else() -> None:
    with pytest.raises(ConfigError, match=r"not a gymnasium\.Env"):
        make_env(lambda: object())
    with pytest.raises(ConfigError, match="cannot host a object"):
        to_source(lambda: object())


def test_zero_arg_callable_with_env_config() -> None:
    with pytest.raises(ConfigError, match="takes no arguments"):
        make_env(lambda: gym.make("CartPole-v1"), {"x": 1})


def test_env_config_must_be_a_dict() -> None:
    with pytest.raises(ConfigError, match="must be a dict"):
        make_env(Float64Env, [("length", 3)])  # type: ignore[arg-type]


def test_instance_cannot_be_copied() -> None:
    env = gym.make("CartPole-v1")
    with pytest.raises(ConfigError, match=r"one copy"):
        to_source(env, num_envs=2)
    with pytest.raises(ConfigError, match="sub-processes"):
        to_source(env, remote=True)
    with pytest.raises(ConfigError, match="cannot be copied"):
        env_creator(env)


def test_remote_only_options_need_remote() -> None:
    with pytest.raises(ConfigError, match="remote=True"):
        to_source("CartPole-v1", step_timeout=3.0)


def test_to_source_paths() -> None:
    class Mine(InProcessVectorSource):
        pass

    existing = Mine("CartPole-v1")
    assert to_source(existing) is existing
    local = to_source("CartPole-v1", num_envs=2, seed=0, render_mode="rgb_array")
    assert isinstance(local, InProcessVectorSource) and local.num_envs == 2
    assert local.envs[1].render_mode == "rgb_array"
    remote = to_source(Float64Env, {"length": 3}, num_envs=3, remote=True, envs_per_process=2)
    try:
        assert isinstance(remote, ProcessVectorSource) and isinstance(remote, EnvSource)
        obs, _ = remote.reset_all(0)
        assert obs.shape == (3, 3) and obs.dtype == np.float32
    finally:
        remote.close()
