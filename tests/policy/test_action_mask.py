"""Legal-move masks: detection from the spaces, the spec's wire form, and the numpy policy."""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any

import numpy as np
import pytest
import torch
from gymnasium import spaces

from rlserve.errors import ConfigError, SpaceError, UnsupportedSpaceError
from rlserve.learners.models import ActorCritic
from rlserve.learners.sac_config import check_sac_spaces
from rlserve.policy import ModelSpec, NumpyPolicy
from rlserve.policy.action_mask import (
    MASKED_LOGIT,
    LegalMoves,
    action_mask_slice,
    illegal_action_problem,
)
from rlserve.policy.space_distribution import check_learnable, epsilon_greedy

FEATURES = spaces.Box(-np.inf, np.inf, (3,), np.float32)
DISCRETE = spaces.Discrete(5)
MULTI = spaces.MultiDiscrete([3, 4])


def _masked_space(n: int, key: str = "observations", mask: Any = None) -> spaces.Dict:
    return spaces.Dict({"action_mask": mask or spaces.MultiBinary(n), key: FEATURES})


def test_detects_rllib_and_pettingzoo_conventions() -> None:
    assert action_mask_slice(_masked_space(5), DISCRETE) == (0, 5)
    assert action_mask_slice(_masked_space(5, "observation"), DISCRETE) == (0, 5)
    assert action_mask_slice(_masked_space(7), MULTI) == (0, 7)  # sum(nvec)
    box_mask = spaces.Box(0.0, 1.0, (5,), np.float32)
    assert action_mask_slice(_masked_space(5, mask=box_mask), DISCRETE) == (0, 5)
    # PettingZoo classic (tictactoe): int8 Box(0, 1) mask beside an 'observation' board.
    board = spaces.Box(0, 1, (3, 3, 2), np.int8)
    pettingzoo = spaces.Dict({"observation": board, "action_mask": spaces.Box(0, 1, (9,), np.int8)})
    assert action_mask_slice(pettingzoo, spaces.Discrete(9)) == (0, 9)
    assert action_mask_slice(FEATURES, DISCRETE) is None
    assert action_mask_slice(spaces.Dict({"a": FEATURES, "b": FEATURES}), DISCRETE) is None


def test_the_slice_follows_the_flattened_order() -> None:
    # An OrderedDict keeps its order: the mask comes after the observation's 3 values.
    ordered = spaces.Dict(
        OrderedDict([("observations", FEATURES), ("action_mask", spaces.MultiBinary(5))])
    )
    assert action_mask_slice(ordered, DISCRETE) == (3, 5)
    sample = ordered.sample()
    flat = spaces.flatten(ordered, sample)
    np.testing.assert_array_equal(flat[3:8], sample["action_mask"])
    assert LegalMoves.of(ordered, DISCRETE) == LegalMoves((3, 5), (5,))


@pytest.mark.parametrize(
    ("observation_space", "action_space", "message"),
    [
        (_masked_space(4), DISCRETE, "has 4 values but the action space"),
        (_masked_space(5), spaces.Box(-1, 1, (2,)), "Discrete or one-dimensional MultiDiscrete"),
        (_masked_space(2), spaces.MultiBinary(2), "Discrete or one-dimensional MultiDiscrete"),
        (
            spaces.Dict({"action_mask": spaces.MultiBinary(5), "obs": FEATURES}),
            DISCRETE,
            "exactly 'action_mask' and 'observations'",
        ),
        (
            spaces.Dict(
                {"action_mask": spaces.MultiBinary(5), "observations": FEATURES, "x": FEATURES}
            ),
            DISCRETE,
            "put everything else under 'observations'",
        ),
        (_masked_space(5, mask=spaces.Box(-1.0, 1.0, (5,))), DISCRETE, "Box\\(0, 1, \\(n,\\)\\)"),
        (_masked_space(5, mask=spaces.MultiBinary((5, 1))), DISCRETE, "MultiBinary\\(n\\)"),
    ],
)
def test_bad_mask_spaces_are_refused_before_listening(
    observation_space: spaces.Space[Any], action_space: spaces.Space[Any], message: str
) -> None:
    with pytest.raises(UnsupportedSpaceError, match=message):
        check_learnable(observation_space, action_space)


def test_sac_refuses_a_mask_naming_ppo_and_dqn() -> None:
    with pytest.raises(UnsupportedSpaceError, match="ppo \\(or dqn"):
        check_sac_spaces(_masked_space(2), spaces.Box(-1, 1, (2,), np.float32))


def _spec(mask: tuple[int, int] | None) -> ModelSpec:
    return ModelSpec(8, ("a.0",), "tanh", "categorical", 5, action_mask=mask)


def test_the_spec_carries_the_mask_on_the_wire_only_when_it_has_one() -> None:
    masked = _spec((0, 5))
    wire = masked.to_wire()
    assert wire["action_mask"] == {"start": 0, "size": 5}
    assert ModelSpec.from_wire(wire) == masked
    assert masked.input_dim == 3
    plain = _spec(None)
    assert "action_mask" not in plain.to_wire()  # as before masks: old clients see no change
    assert ModelSpec.from_wire(plain.to_wire()) == plain
    assert plain.input_dim == 8


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"start": 0, "size": 4}, "action_mask"),  # not action_dim
        ({"start": 5, "size": 5}, "action_mask"),  # past obs_dim
        ({"start": "0", "size": 5}, "malformed"),
        ([0, 5], "malformed"),
        ({"start": True, "size": 5}, "malformed"),
    ],
)
def test_bad_wire_masks_are_refused(raw: Any, message: str) -> None:
    wire = _spec(None).to_wire() | {"action_mask": raw}
    with pytest.raises(ConfigError, match=message):
        ModelSpec.from_wire(wire)


def test_only_discrete_distributions_take_a_mask() -> None:
    with pytest.raises(ConfigError, match="gaussian policy cannot have an action_mask"):
        ModelSpec(8, ("a.0",), "tanh", "gaussian", 5, action_mask=(0, 5))


def _model(action_space: spaces.Space[Any], n: int, seed: int = 0) -> ActorCritic:
    torch.manual_seed(seed)
    model = ActorCritic(_masked_space(n), action_space, (16,), "tanh")
    with torch.no_grad():
        for p in model.actor.parameters():
            p.normal_(0.0, 0.8)
    return model


def _obs(rows: int, n: int, seed: int = 1, legal_share: float = 0.4) -> np.ndarray:
    """Flattened masked observations: a random legal set per row (at least one legal)."""
    rng = np.random.default_rng(seed)
    mask = (rng.random((rows, n)) < legal_share).astype(np.float32)
    mask[np.arange(rows), rng.integers(0, n, rows)] = 1.0
    return np.concatenate([mask, rng.normal(0, 1.5, (rows, 3)).astype(np.float32)], axis=1)


def _multi_obs(rows: int, seed: int = 1) -> np.ndarray:
    """Masked observations for MultiDiscrete([3, 4]): at least one legal choice per sub-action."""
    first = _obs(rows, 3, seed)[:, :3]
    second = _obs(rows, 4, seed + 1)[:, :4]
    features = np.random.default_rng(seed + 2).normal(0, 1.5, (rows, 3)).astype(np.float32)
    return np.concatenate([first, second, features], axis=1)


def _policy(model: ActorCritic, seed: int = 0) -> NumpyPolicy:
    return NumpyPolicy(model.spec(), model.actor_arrays(), version=1, seed=seed)


@pytest.mark.parametrize("rows", [1, 2, 300])
def test_discrete_sampling_never_takes_an_illegal_action(rows: int) -> None:
    policy = _policy(_model(DISCRETE, 5))
    taken = np.zeros(5, np.int64)
    for draw in range(2000 // rows):
        obs = _obs(rows, 5, seed=draw)
        out = policy.compute_actions(obs)
        assert obs[np.arange(rows), out.actions].all(), "an illegal action was sampled"
        taken += np.bincount(out.actions, minlength=5)
        np.testing.assert_allclose(out.logp, policy.log_prob(obs, out.actions), atol=1e-5)
    assert (taken > 0).all()  # every choice is taken where it is legal


def test_two_choices_and_one_legal_choice() -> None:
    policy = _policy(_model(spaces.Discrete(2), 2))
    obs = _obs(500, 2, seed=3, legal_share=0.0)  # exactly one legal choice per row
    out = policy.compute_actions(obs)
    np.testing.assert_array_equal(out.actions, obs[:, :2].argmax(axis=1))
    np.testing.assert_allclose(out.logp, 0.0, atol=1e-6)  # the only legal choice: p = 1


def test_multi_discrete_sampling_never_takes_an_illegal_action() -> None:
    policy = _policy(_model(MULTI, 7))
    for draw in range(20):
        obs = _multi_obs(100, seed=draw)
        out = policy.compute_actions(obs)
        rows = np.arange(100)
        assert obs[rows, out.actions[:, 0].astype(int)].all()
        assert obs[rows, 3 + out.actions[:, 1].astype(int)].all()
        assert illegal_action_problem(obs, out.actions, (0, 7), (3, 4)) == ""


def test_greedy_takes_the_best_legal_action() -> None:
    model = _model(DISCRETE, 5)
    policy = _policy(model)
    obs = _obs(200, 5, seed=4)
    logits = policy.forward(obs)
    expected = np.where(obs[:, :5] > 0.5, logits, -np.inf).argmax(axis=1)
    out = policy.compute_actions(obs, explore=False)
    np.testing.assert_array_equal(out.actions, expected)
    assert (expected != logits.argmax(axis=1)).any()  # the mask changed some choices


def test_log_prob_matches_torch_masked_logits() -> None:
    model = _model(MULTI, 7)
    policy = _policy(model)
    obs = _multi_obs(64)
    actions = policy.compute_actions(obs).actions
    with torch.no_grad():
        expected, entropy = model.log_prob_entropy(torch.as_tensor(obs), torch.as_tensor(actions))
    np.testing.assert_allclose(policy.log_prob(obs, actions), expected.numpy(), atol=1e-5)
    assert torch.isfinite(entropy).all()
    # By hand, one row: log-softmax over the legal logits of each sub-action.
    logits = policy.forward(obs[:1])[0]
    total = 0.0
    for begin, size, column in ((0, 3, 0), (3, 4, 1)):
        legal = obs[0, begin : begin + size] > 0.5
        block = logits[begin : begin + size][legal]
        chosen = logits[begin + int(actions[0, column])]
        total += chosen - math.log(np.exp(block - block.max()).sum()) - block.max()
    assert policy.log_prob(obs[:1], actions[:1])[0] == pytest.approx(total, abs=1e-5)


def test_a_sampler_at_the_edge_of_its_interval_still_takes_a_legal_action() -> None:
    class EdgeRandom:
        """A generator whose uniform draws are all 1: ``u * total`` is the total."""

        def random(self, size: int | None = None) -> Any:
            return 1.0 if size is None else np.ones(size)

    policy = _policy(_model(DISCRETE, 5))
    obs = _obs(20, 5, seed=6)
    obs[:, 4] = 0.0  # the last choice, where an edge draw lands, is illegal
    obs[:, 0] = 1.0
    policy._rng = EdgeRandom()  # type: ignore[assignment]
    for rows in (obs, obs[:1]):
        out = policy.compute_actions(rows)
        assert rows[np.arange(len(rows)), out.actions].all()
        np.testing.assert_allclose(out.logp, policy.log_prob(rows, out.actions), atol=1e-5)


def _q_policy(epsilon: float, seed: int = 0) -> NumpyPolicy:
    # Q-values are the 4 feature values: action i's value is obs[4 + i].
    spec = ModelSpec.for_distribution(
        8, ("head",), "relu", epsilon_greedy(spaces.Discrete(4), epsilon), action_mask=(0, 4)
    )
    weights = {"head.weight": np.eye(4, dtype=np.float32), "head.bias": np.zeros(4, np.float32)}
    return NumpyPolicy(spec, weights, version=1, seed=seed)


def test_epsilon_greedy_picks_the_best_legal_and_explores_only_legal_ones() -> None:
    obs = np.tile(np.array([[1, 0, 1, 0, 1.0, 9.0, 2.0, 8.0]], np.float32), (3000, 1))
    greedy = _q_policy(0.3).compute_actions(obs, explore=False)
    assert set(greedy.actions.tolist()) == {2}  # 9 and 8 are illegal
    np.testing.assert_allclose(greedy.logp, math.log(0.7 + 0.15), rtol=1e-6)
    for rows in (obs, obs[:1]):
        explored = _q_policy(1.0, seed=2).compute_actions(rows)
        assert set(explored.actions.tolist()) <= {0, 2}
    shares = np.bincount(_q_policy(1.0).compute_actions(obs).actions, minlength=4) / len(obs)
    np.testing.assert_allclose(shares, [0.5, 0.0, 0.5, 0.0], atol=0.04)
    policy = _q_policy(0.3)
    logp = policy.log_prob(obs[:4], np.array([0, 1, 2, 3]))
    np.testing.assert_allclose(logp, [math.log(0.15), -np.inf, math.log(0.85), -np.inf])


@pytest.mark.parametrize("rows", [1, 5])
def test_an_all_zero_mask_is_a_clear_error(rows: int) -> None:
    policy = _policy(_model(DISCRETE, 5))
    obs = _obs(rows, 5)
    obs[-1, :5] = 0.0
    with pytest.raises(SpaceError, match="no legal action; mark at least one legal action"):
        policy.compute_actions(obs)
    with pytest.raises(SpaceError, match="no legal action"):
        _q_policy(0.1).compute_actions(np.zeros((1, 8), np.float32))
    multi = _policy(_model(MULTI, 7))
    obs = _multi_obs(3)
    obs[1, 3:7] = 0.0
    with pytest.raises(SpaceError, match=r"\(row 1\).*for sub-action 1"):
        multi.compute_actions(obs)


def test_legal_moves_of_a_policy_and_masked_logit_is_finite() -> None:
    moves = LegalMoves.of(_masked_space(7), MULTI)
    assert moves is not None and moves.sizes == (3, 4)
    moves.check(_multi_obs(4), "get_action")
    assert LegalMoves.of(FEATURES, DISCRETE) is None
    assert math.isfinite(MASKED_LOGIT) and np.float32(MASKED_LOGIT) < -1e37
