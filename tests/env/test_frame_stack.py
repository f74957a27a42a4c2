"""Frame stacking along the channel axis (rlserve.env.frame_stack), read by the conv encoder."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.utils.env_checker import check_env

from rlserve import PPOConfig
from rlserve.env import FrameStack, FrameStacker
from rlserve.env.frame_stack import stacked_space
from rlserve.errors import ConfigError
from rlserve.policy.encoder_choice import choose_encoder
from rlserve.policy.model_spec import ModelSpec
from rlserve.policy.numpy_policy import NumpyPolicy


@pytest.mark.parametrize(
    ("shape", "n", "stacked", "first"),
    [
        ((8, 8, 3), 2, (8, 8, 6), False),
        ((3, 8, 8), 2, (6, 8, 8), True),
        ((10, 10), 4, (4, 10, 10), True),
    ],
)
def test_stacked_images_are_images_the_encoder_reads_with_all_channels(
    shape: tuple[int, ...], n: int, stacked: tuple[int, ...], first: bool
) -> None:
    space = stacked_space(spaces.Box(0, 255, shape, np.uint8), n)
    assert space.shape == stacked and space.dtype == np.uint8
    encoder = choose_encoder(space, conv_filters=[[4, 2, 1]])
    assert encoder is not None
    (image,) = encoder.images
    assert image.shape == stacked and image.channels_first is first


def test_frames_are_stacked_oldest_first_and_the_first_fills_the_stack() -> None:
    stacker = FrameStacker(spaces.Box(0, 255, (4, 4, 1), np.uint8), 3)
    frames = [np.full((4, 4, 1), v, np.uint8) for v in (10, 20, 30)]
    assert stacker.reset(frames[0])[0, 0].tolist() == [10, 10, 10]
    assert stacker.push(frames[1])[0, 0].tolist() == [10, 10, 20]
    out = stacker.push(frames[2])
    assert out[0, 0].tolist() == [10, 20, 30] and out.dtype == np.uint8
    assert stacker.space.contains(out)
    assert stacker.reset(frames[2])[0, 0].tolist() == [30, 30, 30]  # a new episode


def test_vectors_get_a_new_first_axis() -> None:
    stacker = FrameStacker(spaces.Box(-1, 1, (2,), np.float32), 2)
    assert stacker.space.shape == (2, 2)
    stacker.reset([0.5, -0.5])
    assert stacker.push([0.25, 0.0]).tolist() == [[0.5, -0.5], [0.25, 0.0]]
    assert choose_encoder(stacker.space) is None


def test_a_stack_that_would_be_read_in_another_layout_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"stack at most 2 frames"):
        stacked_space(spaces.Box(0, 255, (7, 7, 3), np.uint8), 3)
    with pytest.raises(ConfigError, match=r"whole number from 1 \(off\) to 64"):
        stacked_space(spaces.Box(0, 1, (2,)), 0)
    with pytest.raises(ConfigError, match=r"whole number from 1 \(off\) to 64"):
        stacked_space(spaces.Box(0, 1, (2,)), 65)
    with pytest.raises(ConfigError, match="needs a Box"):
        stacked_space(spaces.Discrete(3), 2)
    with pytest.raises(RuntimeError, match="reset"):
        FrameStacker(spaces.Box(0, 1, (2,)), 2).push([0.0, 0.0])


class Motion(gym.Env[np.ndarray, int]):
    """A lit pixel on a 6x6 uint8 image moves one column left or right (wrapping around) after the
    first step; the second step pays 1 for action 1 when it moved right, for action 0 when left.
    One frame cannot tell the direction (every position is as likely either way); two can."""

    observation_space = gym.spaces.Box(0, 255, (6, 6, 1), np.uint8)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, config: Any = None) -> None:
        self.rng = np.random.default_rng(0)

    def _obs(self) -> np.ndarray:
        image = np.zeros((6, 6, 1), np.uint8)
        image[self.row, self.column, 0] = 255
        return image

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        super().reset(seed=seed)
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.row, self.column = (int(v) for v in self.rng.integers(0, 6, 2))
        self.right = int(self.rng.integers(0, 2))
        self.steps = 0
        return self._obs(), {}

    def step(self, action: int) -> Any:
        self.steps += 1
        if self.steps == 1:
            self.column = (self.column + (1 if self.right else -1)) % 6
            return self._obs(), 0.0, False, False, {}
        return self._obs(), float(int(action) == self.right), True, False, {}


@pytest.mark.filterwarnings("ignore:.*different from the unwrapped")
def test_the_wrapper_is_a_valid_env() -> None:
    env = FrameStack(Motion(), 2)
    check_env(env, skip_render_check=True)
    obs, _ = env.reset(seed=3)
    assert obs.shape == (6, 6, 2) and (obs[..., 0] == obs[..., 1]).all()
    obs, *_ = env.step(0)
    assert not (obs[..., 0] == obs[..., 1]).all()


def test_a_numpy_policy_runs_on_stacked_frames() -> None:
    space = FrameStack(Motion(), 2).observation_space
    encoder = choose_encoder(space, conv_filters=[[4, 2, 1]])
    assert encoder is not None
    spec = ModelSpec(72, ("actor.0",), "tanh", "categorical", 2, encoder=encoder)
    rng = np.random.default_rng(0)
    weights = {
        "encoder.0.0.weight": rng.normal(size=(4, 2, 2, 2)).astype(np.float32),
        "encoder.0.0.bias": np.zeros(4, np.float32),
        "actor.0.weight": rng.normal(size=(2, encoder.output_dim)).astype(np.float32),
        "actor.0.bias": np.zeros(2, np.float32),
    }
    obs = FrameStack(Motion(), 2).reset(seed=0)[0].reshape(1, -1).astype(np.float32)
    assert NumpyPolicy(spec, weights, 0).compute_actions(obs).actions.shape == (1,)


def _accuracy(algo: Any, n: int) -> float:
    env = FrameStack(Motion(), n)
    hits = 0
    for episode in range(100):
        env.reset(seed=100 + episode)
        obs, *_ = env.step(0)
        hits += int(algo.compute_single_action(obs, explore=False)) == env.unwrapped.right
    return hits / 100


@pytest.mark.timeout(300)
@pytest.mark.parametrize("n", [2, 1])
def test_hosted_ppo_learns_the_direction_from_two_stacked_frames_only(n: int) -> None:
    config = (
        PPOConfig()
        .environment(lambda env_config: FrameStack(Motion(env_config), n))
        .debugging(seed=0)
        .training(
            train_batch_size=256,
            minibatch_size=64,
            num_epochs=4,
            lr=3e-3,
            hidden=[16],
            model={"conv_filters": [[8, 2, 1], [8, 2, 2]]},
        )
    )
    with config.build() as algo:
        for _ in range(3):
            algo.train()
        accuracy = _accuracy(algo, n)
    assert accuracy > 0.9 if n == 2 else accuracy < 0.7  # one frame cannot tell the direction
