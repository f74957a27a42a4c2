"""SAC over image observations: conv encoders for the actor and the critics, kept apart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlserve.errors import ConfigError
from rlserve.learners.sac import SACLearner
from rlserve.learners.sac_config import SACSettings
from rlserve.policy import NumpyPolicy
from rlserve.policy.encoder_choice import NATURE_FILTERS, SMALL_FILTERS
from rlserve.policy.weights import WeightsPackage
from rlserve.protocol.codec import decode, encode
from rlserve.protocol.fragment import Fragment

pytestmark = pytest.mark.timeout(120)

GRID = gym.spaces.Box(0, 255, (8, 8, 1), np.uint8)
ACT = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
MIX = gym.spaces.Dict(
    {
        "camera": gym.spaces.Box(0, 255, (6, 6, 2), np.uint8),
        "speed": gym.spaces.Box(-2.0, 2.0, (3,), np.float32),
        "map": gym.spaces.Box(0.0, 1.0, (2, 5, 5), np.float32),
    }
)


def _settings(**overrides: Any) -> SACSettings:
    values: dict[str, Any] = {
        "hidden": (16,),
        "batch_size": 8,
        "learning_starts": 8,
        "train_every": 4,
        "buffer_size": 200,
        "device": "cpu",
    }
    values.update(overrides)
    return SACSettings(**values)


def _observations(space: gym.Space[Any], rows: int, seed: int = 1) -> np.ndarray:
    space.seed(seed)
    flat = [np.asarray(gym.spaces.flatten(space, space.sample())) for _ in range(rows)]
    return np.stack(flat).astype(np.float32)  # as the server flattens them


def _fragment(space: gym.Space[Any], steps: int, seed: int = 0) -> Fragment:
    rng = np.random.default_rng(seed)
    return Fragment(
        episode_id=f"e{seed}",
        agent_id="agent0",
        policy_id="default",
        obs=_observations(space, steps + 1, seed),
        actions=rng.uniform(-1, 1, (steps, 1)).astype(np.float32),
        rewards=rng.normal(size=steps).astype(np.float32),
        behaviour_logp=np.zeros(steps, np.float32),
        policy_chosen=np.ones(steps, bool),
        weights_version=np.zeros(steps, np.int64),
        terminated=False,
        truncated=False,
    )


def _names(module: torch.nn.Module) -> set[str]:
    return {name for name, _ in module.named_parameters()}


def test_an_image_gets_an_encoder_for_the_actor_and_one_shared_by_the_critics() -> None:
    learner = SACLearner(GRID, ACT, _settings())
    actor, critic, target = learner.actor, learner.critic, learner.critic_target
    for model in (actor, critic, target):
        assert model.image is not None and len(model.image.images) == 1
        convs = [
            (layer.size, layer.kernel[0], layer.stride[0]) for layer in model.image.images[0].layers
        ]
        assert tuple(convs) == SMALL_FILTERS  # 8x8: the small stack
    # Separate modules, no tensor in common (the target is a copy of the critic's).
    actor_ids = {id(p) for p in actor.parameters()}
    assert not actor_ids & {id(p) for p in critic.parameters()}
    assert not {id(p) for p in critic.parameters()} & {id(p) for p in target.parameters()}
    # One encoder for both critic heads: their first batched layer reads its features.
    assert critic.image is not None
    width = critic.image.output_dim
    assert width == 64 * 5 * 5
    assert critic.weights[0].shape == (2, width + 1, 16)
    assert actor.actor[0].in_features == width
    assert sum(name.startswith("encoder.") for name in _names(critic)) == 6
    assert learner.replay.obs_dtype == np.uint8  # bytes in the ring, as without an encoder


def test_a_large_image_gets_the_nature_stack_and_mlp_keeps_the_flat_model() -> None:
    big = gym.spaces.Box(0, 255, (36, 36, 1), np.uint8)
    learner = SACLearner(big, ACT, _settings())
    layers = learner.actor.image.images[0].layers  # type: ignore[union-attr]
    assert tuple((x.size, x.kernel[0], x.stride[0]) for x in layers[:3]) == NATURE_FILTERS
    assert layers[-1].kind == "linear" and layers[-1].size == 512
    flat = SACLearner(GRID, ACT, _settings(encoder="mlp"))
    assert flat.actor.image is None and flat.critic.image is None
    assert flat.actor.actor[0].in_features == 64 and not any(
        name.startswith("encoder.") for name in _names(flat.critic)
    )


def test_a_dict_of_images_and_a_vector_gets_one_encoder_per_image() -> None:
    learner = SACLearner(MIX, ACT, _settings())
    image = learner.critic.image
    assert image is not None and [x.shape for x in image.images] == [(6, 6, 2), (2, 5, 5)]
    # The speed's 3 values pass beside the two images' features.
    features = sum(x.output_dim for x in image.images)
    assert image.output_dim == features + 3
    assert learner.actor.actor[0].in_features == image.output_dim
    assert learner.critic.weights[0].shape[1] == image.output_dim + 1
    assert learner.replay.obs_dtype == np.float32  # the float parts keep the ring in float


def _spread(model: torch.nn.Module) -> None:
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)  # outputs that reach the tanh's curve and the log-std clamp


@pytest.mark.parametrize(
    "space",
    [GRID, gym.spaces.Box(-1.0, 1.0, (3, 7, 9), np.float32), MIX],
    ids=["hwc_uint8", "chw_float", "dict"],
)
def test_the_published_actor_computes_what_the_torch_actor_does(space: gym.Space[Any]) -> None:
    act = gym.spaces.Box(np.array([-3.0, 0.0]), np.array([3.0, 0.5]), dtype=np.float32)
    learner = SACLearner(space, act, _settings(conv_filters=((4, 3, 1), (6, 2, 1))))
    _spread(learner.actor)
    published = learner.weights()
    assert published.spec.encoder == learner.actor.image
    assert any(name.startswith("encoder.") for name in published.arrays)
    # As a client receives it: through the codec, the spec and arrays rebuilt.
    package = WeightsPackage.from_wire(decode(encode({"weights": published.to_wire()}))["weights"])
    assert package.spec == published.spec
    policy = NumpyPolicy(package.spec, package.arrays, package.version)
    x = _observations(space, 9)
    with torch.no_grad():
        mean, log_std = learner.actor.params(torch.from_numpy(x))
        greedy = learner.actor.deterministic(torch.from_numpy(x)).numpy()
    out = policy.forward(x)
    np.testing.assert_allclose(out[:, :2], mean.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.clip(out[:, 2:], -20.0, 2.0), log_std.numpy(), atol=1e-5)
    actions = policy.to_env_actions(policy.compute_actions(x, explore=False).actions)
    want = act.low + (greedy + 1.0) / 2.0 * (act.high - act.low)
    np.testing.assert_allclose(actions, want, rtol=1e-5, atol=1e-5)


def test_each_encoder_is_trained_by_its_own_sides_loss_only() -> None:
    """Every gradient that reaches a parameter, by the backward pass that computed it."""
    learner = SACLearner(GRID, ACT, _settings(train_every=2))
    learner.ingest([_fragment(GRID, 20)])
    phase = ["critic"]
    reached: dict[str, set[str]] = {"critic": set(), "actor": set(), "alpha": set()}
    for side, model in (("actor", learner.actor), ("critic", learner.critic)):
        for name, p in model.named_parameters():
            label = f"{side}:{name}"
            p.register_hook(lambda grad, label=label: reached[phase[0]].add(label))
    # A gradient step's order: critic backward and step, actor backward and step, alpha's.
    steps = (
        (learner.critic_optimizer, "actor"),
        (learner.actor_optimizer, "alpha"),
        (learner.alpha_optimizer, "critic"),
    )
    for optimizer, then in steps:
        step = optimizer.step

        def stepped(*args: Any, _step: Any = step, _then: str = then, **kwargs: Any) -> Any:
            result = _step(*args, **kwargs)
            phase[0] = _then
            return result

        optimizer.step = stepped  # type: ignore[method-assign]
    assert learner.update()["learner/gradient_steps"] == 2.0
    critic = {f"critic:{n}" for n in _names(learner.critic)}
    actor = {f"actor:{n}" for n in _names(learner.actor)}
    assert reached["critic"] == critic  # the critics' loss: their encoder and heads, no actor
    assert reached["actor"] == actor  # the actor's loss: its encoder and MLP, no critic
    assert "critic:encoder.0.0.weight" in critic and "actor:encoder.0.0.weight" in actor
    assert reached["alpha"] == set()  # the temperature's loss reads log-densities detached


def test_a_checkpoint_with_encoders_resumes_the_same_training(tmp_path: Path) -> None:
    first = SACLearner(GRID, ACT, _settings(seed=3, checkpoint_replay=True))
    first.ingest([_fragment(GRID, 20)])
    first.update()
    path = tmp_path / "sac.pt"
    first.save(path, {})
    second = SACLearner(GRID, ACT, _settings(seed=9, checkpoint_replay=True))
    second.load(path)
    assert second.replay.obs_dtype == np.uint8 and len(second.replay) == 20
    for learner in (first, second):
        learner.ingest([_fragment(GRID, 8, seed=7)])
        learner.update()
    for one, two in ((first.actor, second.actor), (first.critic_target, second.critic_target)):
        for a, b in zip(one.parameters(), two.parameters(), strict=True):
            torch.testing.assert_close(a, b)
    flat = SACLearner(GRID, ACT, _settings(encoder="mlp"))
    with pytest.raises(ValueError, match="holds no SAC model of this policy's shape"):
        flat.initialise_from(path)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_trains_on_cuda_with_encoders(tmp_path: Path) -> None:
    learner = SACLearner(GRID, ACT, _settings(device="auto"))
    for model in (learner.actor, learner.critic, learner.critic_target):
        assert {p.device.type for p in model.parameters()} == {"cuda"}
    learner.ingest([_fragment(GRID, 20)])
    assert np.isfinite(learner.update()["learner/critic_loss"])
    learner.save(tmp_path / "sac.pt", {})
    twin = SACLearner(GRID, ACT, _settings(device="cpu"))
    twin.load(tmp_path / "sac.pt")
    package = learner.weights()
    x = _observations(GRID, 4)
    np.testing.assert_allclose(
        NumpyPolicy(package.spec, package.arrays, 0).forward(x),
        NumpyPolicy(twin.weights().spec, twin.weights().arrays, 0).forward(x),
        atol=1e-5,
    )


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (
            {"conv_filters": [[8, 4, 2], [16, 4, 2]]},
            r"shrink the \(8, 8, 1\) image to nothing; use",
        ),
        ({"normalize_observations": True}, "turn normalize_observations off"),
    ],
)
def test_settings_that_cannot_read_the_image_name_the_fix(
    overrides: dict[str, Any], match: str
) -> None:
    with pytest.raises(ConfigError, match=match):
        SACLearner(GRID, ACT, _settings(**overrides))


def test_malformed_encoder_settings_are_refused() -> None:
    with pytest.raises(ConfigError, match="encoder must be one of"):
        SACSettings(encoder="resnet")
    with pytest.raises(ConfigError, match="conv_filters must be"):
        SACSettings(conv_filters=[[16, 2]])  # type: ignore[arg-type]


def _lit_pixels(rng: np.random.Generator, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """8x8 images with one lit pixel, flattened, and the action each asks for: its column."""
    images = np.zeros((rows, 8, 8, 1), np.float32)
    row, column = rng.integers(0, 8, rows), rng.integers(0, 8, rows)
    images[np.arange(rows), row, column, 0] = 255.0
    return images.reshape(rows, -1), (column / 3.5 - 1.0).astype(np.float32)


def test_learns_to_point_at_the_lit_pixels_column() -> None:
    """One-step episodes; the reward is minus the distance between action and column."""
    learner = SACLearner(
        GRID,
        ACT,
        _settings(
            hidden=(32,),
            conv_filters=((8, 2, 1), (16, 2, 1)),
            batch_size=64,
            learning_starts=128,
            train_every=64,
            buffer_size=4096,
            gamma=0.0,
            lr=1e-3,
            seed=0,
        ),
    )
    rng = np.random.default_rng(0)
    for step in range(30):  # 1,920 env steps
        package = learner.weights()
        policy = NumpyPolicy(package.spec, package.arrays, package.version, seed=step)
        obs, target = _lit_pixels(rng, 64)
        actions = policy.to_env_actions(policy.compute_actions(obs).actions)
        rewards = -np.abs(actions[:, 0] - target)
        fragments = []
        for i in range(64):
            fragment = _fragment(GRID, 1)
            fragment.obs = np.stack([obs[i], obs[i]])
            fragment.actions = actions[i : i + 1].astype(np.float32)
            fragment.rewards = rewards[i : i + 1].astype(np.float32)
            fragment.episode_id = f"{step}-{i}"
            fragment.terminated = True
            fragments.append(fragment)
        learner.ingest(fragments)
        while learner.ready():
            learner.update()
    package = learner.weights()
    greedy = NumpyPolicy(package.spec, package.arrays, package.version)
    obs, target = _lit_pixels(np.random.default_rng(1), 256)
    actions = greedy.to_env_actions(greedy.compute_actions(obs, explore=False).actions)
    # A policy blind to the image scores about -0.57 at best (the median column).
    assert float(np.mean(-np.abs(actions[:, 0] - target))) > -0.2
