from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from toy_envs import Float64Env, OldGymApi

from rlserve.env import SINGLE_AGENT, InProcessVectorSource, to_source
from rlserve.errors import EnvError

pytestmark = pytest.mark.timeout(30)


def test_float64_obs_cast_to_space_dtype() -> None:
    source = InProcessVectorSource(Float64Env, {"length": 3}, num_envs=2, seed=1)
    obs, infos = source.reset_all()
    assert obs.dtype == np.float32 and infos == [{}, {}]
    for _ in range(3):
        batch = source.step_all([0, 1])
    assert batch.obs.dtype == np.float32
    assert all(v.dtype == np.float32 for v in batch.final_obs.values())


def test_terminated_and_truncated_together_count_as_terminated() -> None:
    source = InProcessVectorSource(Float64Env, {"length": 2}, num_envs=2, seed=0)
    source.reset_all()
    first = source.step_all([1, 1])
    assert not first.terminated.any() and not first.truncated.any() and not first.final_obs
    batch = source.step_all([1, 0])
    assert batch.terminated.tolist() == [True, True]
    assert batch.truncated.tolist() == [False, False]
    np.testing.assert_array_equal(batch.rewards, [1.0, 0.0])
    assert set(batch.final_obs) == {0, 1} and batch.final_obs[0][0] == 2
    assert batch.obs[:, 0].tolist() == [0, 0]  # the next episodes' first obs
    assert batch.infos == {0: {"t": 2}, 1: {"t": 2}}  # odd steps had empty infos: absent


def test_differential_against_single_envs_stepped_by_hand() -> None:
    """Final obs, reset obs, rewards and flags equal those of single envs with the same seeds."""
    num, seed, steps = 3, 11, 120
    source = to_source("CartPole-v1", {"max_episode_steps": 15}, num_envs=num, seed=seed)
    assert isinstance(source, InProcessVectorSource)
    singles = [gym.make("CartPole-v1", max_episode_steps=15) for _ in range(num)]
    obs, _ = source.reset_all()
    expected = [env.reset(seed=seed + i)[0] for i, env in enumerate(singles)]
    np.testing.assert_array_equal(obs, np.stack(expected))
    rng = np.random.default_rng(0)
    ended = {"terminated": 0, "truncated": 0}
    for _ in range(steps):
        actions = rng.integers(0, 2, num)
        batch = source.step_all(actions)
        for i, env in enumerate(singles):
            o, r, term, trunc, _ = env.step(int(actions[i]))
            assert batch.rewards[i] == r
            assert (batch.terminated[i], batch.truncated[i]) == (term, trunc and not term)
            if term or trunc:
                ended["terminated" if term else "truncated"] += 1
                np.testing.assert_array_equal(batch.final_obs[i], o)
                o, _ = env.reset()
            else:
                assert i not in batch.final_obs
            np.testing.assert_array_equal(batch.obs[i], o)
    assert ended["terminated"] > 0 and ended["truncated"] > 0


def _run(seed: int, steps: int = 40) -> list[np.ndarray]:
    source = InProcessVectorSource("CartPole-v1", num_envs=4, seed=seed)
    out = [source.reset_all()[0]]
    rng = np.random.default_rng(3)
    for _ in range(steps):
        out.append(source.step_all(rng.integers(0, 2, 4)).obs)
    source.close()
    return out


def test_seeding_is_deterministic() -> None:
    a, b, c = _run(5), _run(5), _run(6)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a[0], c[0])
    # Copy i is seeded with seed + i: copy 1 of seed 5 starts like copy 0 of seed 6.
    np.testing.assert_array_equal(a[0][1], c[0][0])


def test_reset_all_seeds_action_spaces() -> None:
    source = InProcessVectorSource("CartPole-v1", num_envs=2)
    source.reset_all(seed=4)
    first = [source.action_space.sample() for _ in range(10)]
    source.reset_all(seed=4)
    assert [source.action_space.sample() for _ in range(10)] == first


def test_generic_poll_interface() -> None:
    source = InProcessVectorSource(Float64Env, {"length": 1}, num_envs=2, seed=0)
    poll = source.poll()
    assert set(poll.obs) == {0, 1}
    source.send_actions({0: {SINGLE_AGENT: 1}, 1: {SINGLE_AGENT: 0}})
    poll = source.poll()
    assert poll.episode_over(0) and poll.episode_over(1)
    assert poll.rewards[0][SINGLE_AGENT] == 1.0
    assert set(poll.reset_obs) == {0, 1}


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"reset": "obs"}, r"OldGymApi.reset\(\) must return \(obs, info\).*got ndarray of shape"),
        ({"step": 4}, r"OldGymApi.step\(\) must return \(obs, reward, .*got a tuple of 4"),
    ],
)
def test_an_env_of_the_old_gym_api_is_named_with_the_fix(
    config: dict[str, Any], message: str
) -> None:
    source = InProcessVectorSource(OldGymApi, config, num_envs=2, seed=0)
    with pytest.raises(EnvError, match=message):
        source.reset_all()
        source.step_all(np.zeros(2, np.int64))
    source.close()
