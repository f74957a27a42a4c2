"""Conv encoders in the torch models: the numpy policy computes what they compute."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlserve.errors import ConfigError
from rlserve.learners.dqn import DQNLearner
from rlserve.learners.dqn_config import DQNSettings
from rlserve.learners.models import ActorCritic, QNetwork
from rlserve.learners.ppo import PPOLearner
from rlserve.learners.ppo_config import PPOSettings
from rlserve.policy import NumpyPolicy
from rlserve.policy.encoder_choice import choose_encoder, settings_encoder

IMAGES = {
    "hwc_uint8": gym.spaces.Box(0, 255, (9, 8, 3), np.uint8),
    "chw_uint8": gym.spaces.Box(0, 255, (2, 8, 9), np.uint8),
    "hwc_float": gym.spaces.Box(-1.0, 1.0, (10, 10, 4), np.float32),
    "chw_float": gym.spaces.Box(0.0, 1.0, (3, 7, 7), np.float32),
}


def _observations(space: gym.spaces.Box, rows: int) -> np.ndarray:
    rng = np.random.default_rng(1)
    if space.dtype == np.uint8:
        values = rng.integers(0, 256, (rows, *space.shape))
    else:
        values = rng.uniform(-1.0, 1.0, (rows, *space.shape))
    return values.reshape(rows, -1).astype(np.float32)  # as the server flattens them


def _spread(model: torch.nn.Module) -> None:
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)


@pytest.mark.parametrize("name", list(IMAGES))
@pytest.mark.parametrize("filters", [None, [[4, 3, 2], [6, 2, 1]]], ids=["auto", "custom"])
def test_numpy_forward_matches_the_actor_critic(name: str, filters: Any) -> None:
    space = IMAGES[name]
    image = choose_encoder(space, conv_filters=filters)
    assert image is not None
    model = ActorCritic(space, gym.spaces.Discrete(5), (16,), "tanh", image=image)
    _spread(model)
    obs = _observations(space, 7)
    policy = NumpyPolicy(model.spec(), model.actor_arrays(), 0)
    with torch.no_grad():
        want = model.params(torch.from_numpy(obs)).numpy()
    np.testing.assert_allclose(policy.forward(obs), want, rtol=1e-5, atol=1e-5)


def test_numpy_forward_matches_the_nature_stack() -> None:
    space = gym.spaces.Box(0, 255, (36, 40, 2), np.uint8)
    image = choose_encoder(space)
    assert image is not None and image.images[0].layers[-1].kind == "linear"
    model = QNetwork(space, gym.spaces.Discrete(3), (8,), "relu", dueling=True, image=image)
    obs = _observations(space, 3)
    policy = NumpyPolicy(model.spec(0.0), model.q_arrays(), 0)
    with torch.no_grad():
        want = model(torch.from_numpy(obs)).numpy()
    np.testing.assert_allclose(policy.forward(obs), want, rtol=1e-5, atol=1e-5)


def test_a_dict_of_images_and_vectors_matches_too() -> None:
    space = gym.spaces.Dict(
        {
            "a_camera": IMAGES["hwc_uint8"],
            "b_speed": gym.spaces.Box(-5.0, 5.0, (3,), np.float32),
            "c_map": IMAGES["chw_float"],
            "d_gear": gym.spaces.Discrete(4),
        }
    )
    image = choose_encoder(space)
    assert image is not None and len(image.images) == 2
    model = ActorCritic(space, gym.spaces.Box(-1.0, 1.0, (2,)), (16,), image=image)
    _spread(model)
    space.seed(0)
    obs = np.stack([gym.spaces.flatten(space, space.sample()) for _ in range(5)]).astype(np.float32)
    policy = NumpyPolicy(model.spec(), model.actor_arrays(), 0)
    with torch.no_grad():
        want = model.params(torch.from_numpy(obs)).numpy()
    np.testing.assert_allclose(policy.forward(obs), want, rtol=1e-5, atol=1e-5)


def test_the_encoder_is_shared_and_an_mlp_model_has_none() -> None:
    space = IMAGES["chw_float"]
    model = ActorCritic(space, gym.spaces.Discrete(2), (8,), image=choose_encoder(space))
    assert sum(name.startswith("encoder.") for name in model.state_dict()) == 6
    assert model.actor[0].in_features == model.critic[0].in_features == 64 * 4 * 4
    flat = ActorCritic(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2), (8,))
    layers = [
        f"{n}.{i}.{p}" for n in ("actor", "critic") for i in (0, 2) for p in ("weight", "bias")
    ]
    assert sorted(flat.state_dict()) == sorted([*layers, "log_std"])


@pytest.mark.parametrize(
    ("settings", "field"),
    [(PPOSettings, "conv_filters"), (DQNSettings, "conv_filters")],
)
@pytest.mark.parametrize("bad", [[[16, 2]], [[16, 2, 0]], [["a", 2, 1]], []])
def test_malformed_conv_filters_are_refused(settings: Any, field: str, bad: Any) -> None:
    with pytest.raises(ConfigError, match="conv_filters"):
        settings(**{field: bad})


def test_unknown_encoder_setting_is_refused() -> None:
    with pytest.raises(ConfigError, match="encoder must be one of"):
        DQNSettings(encoder="resnet")


def test_normalize_observations_on_with_an_image_names_the_fix() -> None:
    space = IMAGES["hwc_uint8"]
    with pytest.raises(ConfigError, match="turn normalize_observations off"):
        settings_encoder(DQNSettings(normalize_observations=True), space)
    learner = PPOLearner(space, gym.spaces.Discrete(2), PPOSettings(device="cpu"))
    assert learner.obs_normalization is None and learner.model.image is not None


def test_learners_publish_conv_weights_the_numpy_policy_reads() -> None:
    space = IMAGES["hwc_uint8"]
    obs = _observations(space, 4)
    for learner in (
        PPOLearner(space, gym.spaces.Discrete(3), PPOSettings(device="cpu", hidden=(8,))),
        DQNLearner(space, gym.spaces.Discrete(3), DQNSettings(device="cpu", hidden=(8,))),
    ):
        package = learner.weights()
        assert package.spec.encoder is not None
        policy = NumpyPolicy(package.spec, package.arrays, package.version)
        assert policy.forward(obs).shape == (4, 3)


def test_an_image_beside_a_legal_move_mask_matches_too() -> None:
    image = IMAGES["chw_uint8"]
    space = gym.spaces.Dict({"action_mask": gym.spaces.MultiBinary(4), "observations": image})
    model = QNetwork(space, gym.spaces.Discrete(4), (8,), image=choose_encoder(space))
    _spread(model)
    rng = np.random.default_rng(3)
    mask = (rng.random((6, 4)) < 0.5).astype(np.float32)
    mask[:, 0] = 1.0
    obs = np.concatenate([mask, _observations(image, 6)], axis=1)
    policy = NumpyPolicy(model.spec(0.0), model.q_arrays(), 0)
    with torch.no_grad():
        x = torch.from_numpy(obs)
        want = model.legal_values(x, model(x)).numpy()
    np.testing.assert_allclose(policy.forward(obs), model(x).detach().numpy(), rtol=1e-5, atol=1e-5)
    greedy = policy.compute_actions(obs, explore=False).actions
    np.testing.assert_array_equal(greedy, want.argmax(axis=1))
    assert (mask[np.arange(6), greedy] == 1).all()
