"""Issue 23's image target at half its budget: PPO's defaults learn MiniGrid's DoorKey-5x5.

The benchmark (``bench/minigrid_doorkey.py``, 300,000 env steps) has every seed past a last-100
mean of 0.9 within 55,000. Here, seed 0: the reported mean return reached 0.93 at 73,728 env
steps (the view is ``ImgObsWrapper``'s 7x7x3 uint8 grid, read by the automatic conv encoder).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import pytest

from rlserve import PPOConfig

minigrid = pytest.importorskip("minigrid")
# A hang catcher, not a speed check: the run takes 2-5 minutes on a 2-core VM under the suite's
# load (285 s and a 300-s timeout on its slowest phase), and stops as soon as it learns.
pytestmark = pytest.mark.timeout(900)

BUDGET = 150_000


def _door_key(config: Any) -> gym.Env[Any, Any]:
    from minigrid.wrappers import ImgObsWrapper

    return ImgObsWrapper(gym.make("MiniGrid-DoorKey-5x5-v0"))


def test_ppo_defaults_learn_doorkey_from_its_partial_view(learning_device: str) -> None:
    config = (
        PPOConfig()
        .environment(_door_key)
        .training(torch_threads=1, device=learning_device)
        .debugging(seed=0)
    )
    best = 0.0
    with config.build() as algo:
        while algo.env_steps_sampled < BUDGET and best < 0.9:
            result = algo.train()
            best = max(best, float(result["env_runners"].get("episode_return_mean") or 0.0))
    assert best >= 0.9, best
