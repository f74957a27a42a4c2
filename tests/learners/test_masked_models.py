"""Legal-move masks in the learners: torch against the numpy policy, DQN targets, normalisation."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlserve.experience.episodes import EpisodeTable
from rlserve.learners.dqn import DQNLearner, q_targets
from rlserve.learners.dqn_config import DQNSettings
from rlserve.learners.models import ActorCritic, QNetwork
from rlserve.learners.normalization import ObservationNormalization
from rlserve.learners.ppo import PPOLearner
from rlserve.learners.ppo_config import PPOSettings
from rlserve.policy import NumpyPolicy
from rlserve.policy.action_mask import MASKED_LOGIT
from rlserve.protocol.fragment import Fragment

FEATURES = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
TOLERANCE = 1e-5
"""float32 torch and numpy forward passes agree to this (absolute) on these small networks."""


def _space(n: int, mask_last: bool = False) -> gym.spaces.Dict:
    parts = [("action_mask", gym.spaces.MultiBinary(n)), ("observations", FEATURES)]
    return gym.spaces.Dict(OrderedDict(parts[::-1] if mask_last else parts))


def _obs(
    rows: int, n: int, mask_last: bool = False, seed: int = 1, sizes: tuple[int, ...] = ()
) -> np.ndarray:
    """Flattened observations whose masks leave one legal choice or more per part (``sizes``)."""
    rng = np.random.default_rng(seed)
    mask = (rng.random((rows, n)) < 0.4).astype(np.float32)
    begin = 0
    for size in sizes or (n,):
        mask[np.arange(rows), begin + rng.integers(0, size, rows)] = 1.0
        begin += size
    features = rng.normal(0, 2.0, (rows, 3)).astype(np.float32)
    return np.concatenate([features, mask] if mask_last else [mask, features], axis=1)


def _mask_of(obs: np.ndarray, n: int, mask_last: bool) -> np.ndarray:
    return obs[:, 3 : 3 + n] if mask_last else obs[:, :n]


def _spread(module: torch.nn.Module, seed: int = 0) -> None:
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0.0, 0.7)


@pytest.mark.parametrize("mask_last", [False, True], ids=["mask_first", "mask_last"])
@pytest.mark.parametrize(
    "action_space", [gym.spaces.Discrete(5), gym.spaces.MultiDiscrete([2, 3])], ids=str
)
def test_ppo_masked_logits_agree_with_the_numpy_policy(
    action_space: gym.spaces.Space[Any], mask_last: bool
) -> None:
    model = ActorCritic(_space(5, mask_last), action_space, (16, 8))
    _spread(model.actor)
    assert model.action_mask == ((3, 5) if mask_last else (0, 5))
    assert model.actor[0].in_features == 3  # the network reads the observation alone
    sizes = (2, 3) if isinstance(action_space, gym.spaces.MultiDiscrete) else (5,)
    obs = _obs(64, 5, mask_last, sizes=sizes)
    normalization = ObservationNormalization(model.obs_dim, 4.0, model.action_mask)
    normalization.observe(obs)
    normalization.freeze()
    spec = normalization.spec(model.spec())
    policy = NumpyPolicy(spec, model.actor_arrays(), version=1)
    with torch.no_grad():
        params = model.params(torch.as_tensor(normalization.numpy(obs))).numpy()
    out = policy.forward(obs)
    legal = _mask_of(obs, 5, mask_last) > 0.5
    np.testing.assert_allclose(params[legal], out[legal], atol=TOLERANCE)
    assert (params[~legal] == np.float32(MASKED_LOGIT)).all()
    actions = policy.compute_actions(obs).actions
    with torch.no_grad():
        logp, entropy = model.log_prob_entropy(
            torch.as_tensor(normalization.numpy(obs)), torch.as_tensor(actions)
        )
    np.testing.assert_allclose(policy.log_prob(obs, actions), logp.numpy(), atol=TOLERANCE)
    assert torch.isfinite(entropy).all() and (entropy >= 0).all()


def test_masked_entropy_counts_only_legal_choices() -> None:
    model = ActorCritic(_space(4), gym.spaces.Discrete(4), (8,))
    with torch.no_grad():
        model.actor[-1].weight.zero_()
        model.actor[-1].bias.zero_()  # uniform logits
    obs = torch.tensor([[1, 1, 0, 0, 0.5, 0.5, 0.5], [1, 1, 1, 1, 0, 0, 0]])
    logp, entropy = model.log_prob_entropy(obs, torch.tensor([1, 3]))
    np.testing.assert_allclose(entropy.detach().numpy(), [np.log(2), np.log(4)], rtol=1e-6)
    np.testing.assert_allclose(logp.detach().numpy(), [-np.log(2), -np.log(4)], rtol=1e-6)
    logp.sum().backward()  # finite gradients through the masked logits
    assert all(torch.isfinite(p.grad).all() for p in model.actor.parameters())


@pytest.mark.parametrize("dueling", [False, True])
def test_dqn_greedy_choice_agrees_with_the_numpy_policy(dueling: bool) -> None:
    model = QNetwork(_space(6), gym.spaces.Discrete(6), (16,), dueling=dueling)
    _spread(model)
    policy = NumpyPolicy(model.spec(0.0), model.q_arrays(), version=1)
    obs = _obs(200, 6)
    with torch.no_grad():
        tensor = torch.as_tensor(obs)
        values = model.legal_values(tensor, model(tensor)).numpy()
    greedy = policy.compute_actions(obs, explore=False).actions
    np.testing.assert_array_equal(greedy, values.argmax(axis=1))
    assert obs[np.arange(200), greedy].all()
    legal = obs[:, :6] > 0.5
    np.testing.assert_allclose(policy.forward(obs)[legal], values[legal], atol=TOLERANCE)


def test_dqn_targets_use_only_legal_next_actions() -> None:
    model = QNetwork(_space(3), gym.spaces.Discrete(3), (4,))
    next_obs = torch.tensor([[0, 1, 1, 0, 0, 0], [1, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0]])
    target = torch.tensor([[5.0, 1.0, 2.0], [-3.0, 7.0, 7.0], [4.0, 4.0, 4.0]])
    online = torch.tensor([[9.0, 3.0, 1.0], [0.0, 8.0, 8.0], [1.0, 1.0, 1.0]])
    rewards = torch.tensor([1.0, 1.0, 1.0])
    discounts = torch.tensor([0.5, 0.5, 0.5])
    masked_target = model.legal_values(next_obs, target)
    plain = q_targets(rewards, discounts, masked_target, None)
    # Row 0: the best legal value is 2 (5 is illegal); row 1: only action 0, -3; row 2: no
    # legal action (a finished game) bootstraps 0.
    np.testing.assert_allclose(plain.numpy(), [2.0, -0.5, 1.0])
    double = q_targets(rewards, discounts, masked_target, model.legal_values(next_obs, online))
    # The online net's best legal action is 1 (9 is illegal), valued 1 by the target net.
    np.testing.assert_allclose(double.numpy(), [1.5, -0.5, 1.0])


def test_normalisation_leaves_the_mask_untouched() -> None:
    for mask_last, mask in ((False, (0, 5)), (True, (3, 5))):
        obs = _obs(100, 5, mask_last) * np.float32(1.0)
        obs[:, (5 if not mask_last else 0) :][:, :3] += 40.0  # features far from 0
        normalization = ObservationNormalization(8, 3.0, mask)
        normalization.observe(obs)
        normalization.freeze()
        assert normalization.mean.shape == (3,)
        out = normalization.numpy(obs)
        start, size = mask
        np.testing.assert_array_equal(out[:, start : start + size], obs[:, start : start + size])
        features = np.delete(out, np.s_[start : start + size], axis=1)
        assert abs(features.mean()) < 0.1  # the features are normalised
        module_out = normalization.module()(torch.as_tensor(obs)).numpy()
        np.testing.assert_allclose(module_out, out, atol=1e-6)


def _fragment(obs: np.ndarray, actions: np.ndarray, logp: float = -1.0) -> Fragment:
    steps = len(actions)
    return Fragment(
        episode_id="e",
        agent_id="agent0",
        policy_id="default",
        obs=obs[: steps + 1],
        actions=actions,
        rewards=np.zeros(steps, np.float32),
        behaviour_logp=np.full(steps, logp, np.float32),
        policy_chosen=np.ones(steps, bool),
        weights_version=np.zeros(steps, np.int64),
        terminated=False,
        truncated=True,
    )


def test_learners_refuse_fragments_with_illegal_actions() -> None:
    obs = _obs(5, 4)
    obs[:, :4] = [1, 0, 1, 0]
    ppo = PPOLearner(_space(4), gym.spaces.Discrete(4), PPOSettings(hidden=(8,), device="cpu"))
    dqn = DQNLearner(_space(4), gym.spaces.Discrete(4), DQNSettings(hidden=(8,), device="cpu"))
    for learner in (ppo, dqn):
        kept, problem = learner.sanitise(_fragment(obs, np.array([0, 2, 0, 2])))
        assert kept is not None and problem == ""
        kept, problem = learner.sanitise(_fragment(obs, np.array([0, 2, 1, 2])))
        assert kept is None and "step 2 took action 1" in problem


class BestLegalEnv:
    """Choose one of 4 actions, action ``i`` paying ``i / 3``; a random half of them is legal.

    The network sees a constant observation: only the mask says what is legal, so the best
    policy prefers higher actions and relies on the mask to stay legal.
    """

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def observe(self) -> np.ndarray:
        mask = (self.rng.random(4) < 0.5).astype(np.float32)
        mask[self.rng.integers(0, 4)] = 1.0
        self.mask = mask
        return np.concatenate([mask, np.ones(3, np.float32)])

    def reward(self, action: int) -> float:
        assert self.mask[action] == 1.0, "an illegal action was taken"
        return action / 3.0


def _collect(learner: PPOLearner, env: BestLegalEnv, steps: int, seed: int) -> list[Fragment]:
    package = learner.weights()
    policy = NumpyPolicy(package.spec, package.arrays, package.version, seed=seed)
    sink: list[Fragment] = []
    table = EpisodeTable(8, 10, 10, sink.append, clock=lambda: 0.0)
    for episode in range(steps // 4):
        eid = f"e{seed}-{episode}"
        table.start(eid, True, "default", "test")
        ep = table.get(eid)
        reward: float | None = None
        for _ in range(4):
            obs = env.observe()
            table.observe(ep, obs, reward)
            out = policy.compute_actions(obs[None])
            action = int(out.actions[0])
            table.act(ep, action, float(out.logp[0]), True, package.version)
            reward = env.reward(action)
        table.end(ep, env.observe(), truncated=False, reward=reward)
    return sink


def test_ppo_learns_to_pick_the_best_legal_action() -> None:
    config = PPOSettings(
        train_batch_size=128, minibatch_size=32, num_epochs=4, hidden=(16,), lr=1e-2,
        device="cpu", seed=0,
    )  # fmt: skip
    learner = PPOLearner(_space(4), gym.spaces.Discrete(4), config)
    env = BestLegalEnv(0)
    for update in range(25):
        learner.ingest(_collect(learner, env, 128, seed=update))
        learner.update()
    package = learner.weights()
    assert package.spec.action_mask == (0, 4)
    policy = NumpyPolicy(package.spec, package.arrays, package.version, seed=99)
    obs = np.stack([env.observe() for _ in range(500)])
    best = 3 - obs[:, 3::-1].argmax(axis=1)  # the highest legal action
    greedy = policy.compute_actions(obs, explore=False).actions
    assert (greedy == best).mean() > 0.95
