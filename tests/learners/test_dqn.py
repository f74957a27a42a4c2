"""DQN's maths against hand-computed values, and the learner's schedule, guards and checkpoint."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from float_paths import assert_same_choices
from rlserve.errors import ConfigError, UnsupportedSpaceError
from rlserve.learners.dqn import DQNLearner, q_targets, value_bounds
from rlserve.learners.dqn_config import DQNSettings
from rlserve.learners.models import QNetwork
from rlserve.learners.registry import algorithm
from rlserve.policy import ModelSpec, NumpyPolicy
from rlserve.protocol.fragment import Fragment

OBS = gym.spaces.Box(-1.0, 1.0, (3,))
ACT = gym.spaces.Discrete(3)


def _fragment(
    steps: int,
    terminated: bool = False,
    seed: int = 0,
    actions: np.ndarray | None = None,
    logged: bool = False,
) -> Fragment:
    """``steps`` random steps; the policy's actions, or with ``logged`` another controller's."""
    rng = np.random.default_rng(seed)
    return Fragment(
        episode_id=f"e{seed}",
        agent_id="agent0",
        policy_id="default",
        obs=rng.uniform(-1, 1, (steps + 1, 3)).astype(np.float32),
        actions=rng.integers(0, 3, steps) if actions is None else actions,
        rewards=rng.normal(0, 1, steps).astype(np.float32),
        behaviour_logp=np.full(steps, np.nan if logged else np.log(1 / 3), np.float32),
        policy_chosen=np.full(steps, not logged),
        weights_version=np.zeros(steps, np.int64),
        terminated=terminated,
        truncated=False,
    )


def _settings(**overrides: object) -> DQNSettings:
    values: dict[str, object] = {
        "hidden": (16,),
        "buffer_size": 500,
        "learning_starts": 40,
        "batch_size": 8,
        "train_every": 10,
        "updates_per_step": 0.25,
        "device": "cpu",
    }
    return DQNSettings(**{**values, **overrides})  # type: ignore[arg-type]


# -- the targets -----------------------------------------------------------------------------


def test_double_q_target_by_hand() -> None:
    rewards = torch.tensor([1.0, 0.5])
    discounts = torch.tensor([0.9, 0.0])
    next_target = torch.tensor([[1.0, 5.0, 2.0], [7.0, 7.0, 7.0]])
    next_online = torch.tensor([[0.0, 1.0, 3.0], [1.0, 0.0, 0.0]])
    # Double-Q: the online network picks choice 2 in row 0; the target network values it 2.0.
    double = q_targets(rewards, discounts, next_target, next_online)
    torch.testing.assert_close(double, torch.tensor([1.0 + 0.9 * 2.0, 0.5]))
    # Plain DQN: the target network's own maximum, 5.0.
    plain = q_targets(rewards, discounts, next_target, None)
    torch.testing.assert_close(plain, torch.tensor([1.0 + 0.9 * 5.0, 0.5]))


def test_bootstrap_values_are_clamped_to_the_returns_the_rewards_allow() -> None:
    # Rewards seen in [0, 1] with gamma 0.9: every return lies in [0, 10].
    assert value_bounds(0.0, 1.0, 0.9) == pytest.approx((0.0, 10.0))
    assert value_bounds(-2.0, -1.0, 0.5) == pytest.approx((-4.0, 0.0))  # it may end at once
    assert value_bounds(0.0, 1.0, 1.0) is None
    rewards = torch.tensor([1.0, 1.0, 1.0])
    discounts = torch.tensor([0.9, 0.9, 0.0])
    next_target = torch.tensor([[50.0, 0.0], [-3.0, 4.0], [99.0, 99.0]])
    # Plain DQN picks 50 (clamped to 10), 4 (inside), and 99 after a terminal (discount 0).
    clamped = q_targets(rewards, discounts, next_target, None, (0.0, 10.0))
    torch.testing.assert_close(clamped, torch.tensor([1.0 + 0.9 * 10.0, 1.0 + 0.9 * 4.0, 1.0]))


def test_the_learner_keeps_the_reward_range_it_took_in_across_a_checkpoint(
    tmp_path: Path,
) -> None:
    learner = DQNLearner(OBS, ACT, _settings(learning_starts=0))
    fragment = _fragment(20)
    fragment.rewards = np.linspace(-1.0, 3.0, 20).astype(np.float32)
    inside = _fragment(5, seed=1)
    inside.rewards = np.full(5, 0.5, np.float32)
    learner.ingest([fragment, inside])
    assert learner._reward_range == pytest.approx((-1.0, 3.0))
    learner.save(tmp_path / "ckpt.pt", {})
    twin = DQNLearner(OBS, ACT, _settings())
    twin.load(tmp_path / "ckpt.pt")
    assert twin._reward_range == pytest.approx((-1.0, 3.0))


def test_the_loss_is_huber_with_its_delta() -> None:
    q = torch.tensor([0.0, 0.0])
    target = torch.tensor([0.5, 3.0])
    # delta 1: 0.5 * 0.5^2 and 1 * (3 - 0.5) -> mean (0.125 + 2.5) / 2.
    loss = torch.nn.functional.huber_loss(q, target, delta=1.0)
    assert loss.item() == pytest.approx((0.125 + 2.5) / 2)


def test_a_gradient_step_moves_q_towards_the_hand_computed_n_step_target() -> None:
    # One transition, rewards 1, 1 then terminal; n = 2, gamma 0.5: target 1 + 0.5 = 1.5.
    settings = _settings(
        learning_starts=1,
        batch_size=1,
        train_every=1,
        updates_per_step=1.0,
        n_step=2,
        gamma=0.5,
        lr=0.05,
        hidden=(),
        target_update_interval=1000,
    )
    learner = DQNLearner(OBS, ACT, settings)
    fragment = _fragment(2, terminated=True, actions=np.array([1, 1]))
    learner.ingest([fragment])
    batch = learner.replay.state()
    np.testing.assert_allclose(
        batch["rewards"],
        [fragment.rewards[0] + 0.5 * fragment.rewards[1], fragment.rewards[1]],
        rtol=1e-6,
    )
    np.testing.assert_allclose(batch["discounts"], [0.0, 0.0])
    obs = torch.as_tensor(fragment.obs[:2])
    with torch.no_grad():
        before = learner.model(obs)[:, 1].numpy()
    for _ in range(50):
        learner._scheduled_steps = 1
        learner.update()
    with torch.no_grad():
        after = learner.model(obs)[:, 1].numpy()
    targets = batch["rewards"]
    assert (np.abs(after - targets) < np.abs(before - targets)).all()


# -- the network and its numpy form ----------------------------------------------------------


@pytest.mark.parametrize("dueling", [False, True])
def test_the_published_q_values_match_torch(dueling: bool) -> None:
    torch.manual_seed(0)
    model = QNetwork(OBS, ACT, (16, 8), "relu", dueling)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5)
    policy = NumpyPolicy(model.spec(0.1), model.q_arrays(), version=1)
    obs = np.random.default_rng(0).normal(0, 1, (32, 3)).astype(np.float32)
    with torch.no_grad():
        expected = model(torch.as_tensor(obs)).numpy()
    np.testing.assert_allclose(policy.forward(obs), expected, atol=1e-5, rtol=1e-5)
    greedy = policy.compute_actions(obs, explore=False)
    # Torch and numpy agree on the values to about 1e-5, not bit for bit: a near-tie may go
    # either way.
    assert_same_choices(greedy.actions, expected.argmax(axis=1), expected, tol=1e-4)
    np.testing.assert_allclose(greedy.logp, math.log(1 - 0.1 + 0.1 / 3), rtol=1e-6)


def test_dueling_combines_value_and_mean_centred_advantages() -> None:
    model = QNetwork(OBS, ACT, (), "relu", dueling=True)
    with torch.no_grad():
        model.value_head.weight.zero_()
        model.value_head.bias.fill_(2.0)
        model.advantage_head.weight.zero_()
        model.advantage_head.bias.copy_(torch.tensor([1.0, 2.0, 6.0]))
    # Q = V + A - mean(A) = 2 + [1, 2, 6] - 3.
    q = model(torch.zeros(1, 3))
    torch.testing.assert_close(q, torch.tensor([[0.0, 1.0, 5.0]]))


# -- the learner -----------------------------------------------------------------------------


def test_registry_builds_dqn_for_discrete_actions_only() -> None:
    entry = algorithm("dqn")
    assert entry.off_policy
    learner = entry.make_learner(OBS, ACT, _settings())
    assert isinstance(learner, DQNLearner) and learner.sample_steps == 10
    with pytest.raises(UnsupportedSpaceError, match="Discrete action spaces only"):
        entry.make_learner(OBS, gym.spaces.Box(-1.0, 1.0, (2,)), _settings())


def test_a_warm_up_longer_than_the_buffer_is_refused() -> None:
    """It would never end: no training, and pacing would hold the clients for good."""
    with pytest.raises(
        ConfigError,
        match=r"learning_starts 600 is larger than buffer_size 500.*lower learning_starts "
        "or raise buffer_size",
    ):
        _settings(learning_starts=600)
    assert _settings(learning_starts=500).learning_starts == 500


def test_training_follows_the_warm_up_and_the_schedule() -> None:
    learner = DQNLearner(OBS, ACT, _settings())
    learner.ingest([_fragment(30)])
    assert not learner.ready()  # 30 stored < learning_starts 40
    learner.ingest([_fragment(15, seed=1)])
    assert not learner.ready()  # only 5 steps past the warm-up
    learner.ingest([_fragment(5, seed=2)])
    assert learner.ready() and learner.owed_steps == 10 and learner.buffered_steps == 0
    metrics = learner.update()
    # 10 steps past the warm-up at 0.25 gradient steps each: 2 steps, 0.5 carried over.
    assert metrics["learner/gradient_steps"] == 2 and learner.version == 1
    assert metrics["learner/batch_steps"] == 50 and not learner.ready()
    learner.ingest([_fragment(10, seed=3)])
    assert learner.update()["learner/gradient_steps"] == 2 + 3  # 2.5 + 0.5 carried


def test_old_and_logged_steps_are_all_stored() -> None:
    learner = DQNLearner(OBS, ACT, _settings())
    fragment = _fragment(12, logged=True)
    fragment.weights_version[:] = -50  # very stale weights: nothing is dropped
    learner.ingest([fragment])
    assert len(learner.replay) == 12


def test_epsilon_follows_the_schedule_and_ships_with_the_weights() -> None:
    learner = DQNLearner(
        OBS, ACT, _settings(epsilon_start=1.0, epsilon_end=0.1, exploration_steps=100)
    )
    assert learner.weights().spec.epsilon == 1.0
    learner.ingest([_fragment(50)])
    spec = ModelSpec.from_wire(learner.weights().to_wire()["spec"])
    assert spec.distribution == "epsilon_greedy" and spec.epsilon == pytest.approx(0.55)


def test_each_round_applies_the_scheduled_learning_rate() -> None:
    learner = DQNLearner(
        OBS, ACT, _settings(lr=1e-2, lr_end=1e-3, lr_decay_steps=100, learning_starts=0)
    )
    learner.ingest([_fragment(50)])
    assert learner.ready()
    metrics = learner.update()
    assert metrics["learner/lr"] == pytest.approx(5.5e-3)  # 50 of 100 decay steps taken in
    assert learner.optimizer.param_groups[0]["lr"] == pytest.approx(5.5e-3)
    learner.ingest([_fragment(60, seed=1)])
    assert learner.update()["learner/lr"] == pytest.approx(1e-3)


@pytest.mark.parametrize(
    ("field", "value", "problem"),
    [
        ("obs", np.full((5, 3), np.nan, np.float32), "obs holds nan"),
        ("actions", np.array([0, 1, 3, 0]), "outside the choices 0..2"),
        ("actions", np.array([0.5, 1, 1, 0]), "not a choice index"),
        ("rewards", np.array([1e12, 0, 0, 0], np.float32), "beyond max_abs_input"),
        ("obs", np.zeros((4, 3), np.float32), "obs has shape"),
        ("policy_chosen", np.ones(3, bool), "policy_chosen has shape"),
    ],
)
def test_broken_fragments_are_excluded_and_counted(
    field: str, value: np.ndarray, problem: str
) -> None:
    fragment = _fragment(4)
    setattr(fragment, field, value)
    learner = DQNLearner(OBS, ACT, _settings(max_abs_input=1e9))
    checked, why = learner.sanitise(fragment)
    assert checked is None and problem in why
    learner.ingest([fragment, _fragment(6, seed=1)])
    counters = learner.counters()
    assert counters["fragments_excluded_invalid"] == 1
    assert len(learner.replay) == 6


def test_a_non_finite_loss_skips_the_step_and_keeps_the_version() -> None:
    learner = DQNLearner(OBS, ACT, _settings(learning_starts=0, train_every=8))
    learner.ingest([_fragment(8)])
    learner.replay._rewards[:] = np.inf  # a corrupt buffer: every target is infinite
    before = [p.detach().clone() for p in learner.model.parameters()]
    metrics = learner.update()
    assert learner.version == 0
    assert metrics["learner/gradient_steps_skipped_nonfinite"] == 2
    assert metrics["learner/updates_skipped_nonfinite"] == 1
    for p, q in zip(before, learner.model.parameters(), strict=True):
        torch.testing.assert_close(p, q)


def test_the_target_network_copies_on_its_interval() -> None:
    learner = DQNLearner(
        OBS, ACT, _settings(target_update_interval=3, updates_per_step=0.2, train_every=10)
    )
    learner.ingest([_fragment(50)])
    learner.update()  # 2 gradient steps: no copy yet
    online = learner.model.head.weight
    assert not torch.equal(learner.target.head.weight, online)
    learner.ingest([_fragment(10, seed=1)])
    learner.update()  # steps 3 and 4: copied at 3, then one more step
    assert learner.counters()["gradient_steps"] == 4
    assert not torch.equal(learner.target.head.weight, online)
    learner.sync_target(0.5)
    learner.sync_target(1.0)
    torch.testing.assert_close(learner.target.head.weight, online)


@pytest.mark.parametrize("with_replay", [False, True])
def test_checkpoints_restore_the_run_and_optionally_the_replay(
    tmp_path: Path, with_replay: bool
) -> None:
    settings = _settings(checkpoint_replay=with_replay)
    learner = DQNLearner(OBS, ACT, settings)
    learner.ingest([_fragment(60)])
    learner.update()
    path = tmp_path / "ckpt.pt"
    learner.save(path, {"note": 1})
    twin = DQNLearner(OBS, ACT, _settings(checkpoint_replay=with_replay, seed=5))
    assert twin.load(path) == {"note": 1}
    assert twin.counters() == learner.counters() and twin.version == 1
    assert len(twin.replay) == (60 if with_replay else 0)
    obs = torch.as_tensor(_fragment(3).obs)
    torch.testing.assert_close(twin.model(obs), learner.model(obs))
    torch.testing.assert_close(twin.target(obs), learner.target(obs))
    if with_replay:
        np.testing.assert_array_equal(twin.replay.sample(4).obs, learner.replay.sample(4).obs)
    fresh = DQNLearner(OBS, ACT, _settings())
    fresh.initialise_from(path)
    torch.testing.assert_close(fresh.target(obs), learner.model(obs))
    with pytest.raises(ValueError, match="no Q-network of this policy's shape"):
        DQNLearner(OBS, ACT, _settings(hidden=(4,))).initialise_from(path)


def test_a_checkpoints_replay_of_other_n_step_sums_is_left_out_and_the_rest_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    learner = DQNLearner(OBS, ACT, _settings(checkpoint_replay=True))
    learner.ingest([_fragment(60)])
    learner.update()
    path = tmp_path / "ckpt.pt"
    learner.save(path, {})
    other = DQNLearner(OBS, ACT, _settings(checkpoint_replay=True, n_step=2, seed=5))
    with caplog.at_level(logging.WARNING, logger="rlserve.learner"):
        other.load(path)
    assert "replay buffer not restored" in caplog.text and "keep n_step and gamma" in caplog.text
    assert len(other.replay) == 0 and other.version == 1
    obs = torch.as_tensor(_fragment(3).obs)
    torch.testing.assert_close(other.model(obs), learner.model(obs))


def test_the_log_position_settles_as_soon_as_steps_are_stored(tmp_path: Path) -> None:
    """Steps in the replay buffer are the checkpoint's (their owed training is in its schedule):
    a restart must not read them from the log again, even mid-schedule."""
    from rlserve.training.policy_learner import PolicyLearner

    learner = DQNLearner(OBS, ACT, _settings())
    policy = PolicyLearner(
        {"policy_id": "default", "checkpoint_dir": str(tmp_path)}, learner, {}, 1
    )
    policy.take(1, _fragment(47, seed=1))  # past the warm-up of 40: 7 steps scheduled
    policy.ingest_taken()
    policy.settle(1, 47)
    assert learner.owed_steps == 7 and not learner.ready()  # a round is 10 steps
    assert policy.settled == 1
    policy.take(2, _fragment(5, seed=2))
    policy.ingest_taken()
    learner.update()  # 12 scheduled: one round of 10, 2 still owed
    policy.settle(2, 52)
    assert learner.owed_steps == 2
    assert policy.settled == 2


def test_ingest_joins_the_n_step_sums_of_an_episodes_fragments() -> None:
    learner = DQNLearner(OBS, ACT, _settings(gamma=0.5, n_step=3))
    whole = _fragment(6, terminated=True)
    first, second = _fragment(4), _fragment(2, terminated=True)
    first.obs, first.rewards = whole.obs[:5], whole.rewards[:4]
    second.obs, second.rewards = whole.obs[4:], whole.rewards[4:]
    first.episode_id = second.episode_id = whole.episode_id
    learner.ingest([first, second])
    joined = learner.replay.state()
    # As if the episode had come in one piece: 3-step sums right up to its terminal state.
    one_piece = DQNLearner(OBS, ACT, _settings(gamma=0.5, n_step=3))
    one_piece.ingest([whole])
    for name in ("rewards", "next_obs", "discounts"):
        np.testing.assert_allclose(joined[name], one_piece.replay.state()[name], rtol=1e-6)


def test_n_step_sums_stop_before_a_logged_action() -> None:
    """The sum of the step before a logged action bootstraps there: the logged controller's
    rewards say nothing of the greedy policy's value (a logged step may start a sum)."""
    learner = DQNLearner(OBS, ACT, _settings(gamma=0.5, n_step=3))
    fragment = _fragment(4, terminated=True)
    fragment.policy_chosen[2] = False
    learner.ingest([fragment])
    state = learner.replay.state()
    r = fragment.rewards.astype(np.float64)
    np.testing.assert_allclose(
        state["rewards"], [r[0] + 0.5 * r[1], r[1], r[2] + 0.5 * r[3], r[3]], rtol=1e-6
    )
    np.testing.assert_array_equal(state["next_obs"], fragment.obs[[2, 2, 4, 4]])
    np.testing.assert_allclose(state["discounts"], [0.25, 0.5, 0.0, 0.0])


def test_n_step_through_logged_lets_the_sums_follow_the_logged_controller() -> None:
    learner = DQNLearner(OBS, ACT, _settings(gamma=0.5, n_step=3, n_step_through_logged=True))
    fragment = _fragment(4, terminated=True, logged=True)
    learner.ingest([fragment])
    state = learner.replay.state()
    r = fragment.rewards.astype(np.float64)
    sums = [r[0] + 0.5 * r[1] + 0.25 * r[2], r[1] + 0.5 * r[2] + 0.25 * r[3], r[2] + 0.5 * r[3]]
    np.testing.assert_allclose(state["rewards"], [*sums, r[3]], rtol=1e-6)
    np.testing.assert_allclose(state["discounts"], [0.125, 0.0, 0.0, 0.0])


def test_image_observations_are_stored_as_bytes_and_other_values_refused() -> None:
    image = gym.spaces.Box(0, 255, (6, 6, 1), np.uint8)
    learner = DQNLearner(image, ACT, _settings(max_abs_input=1e9, conv_filters=((4, 3, 1),)))
    assert learner.replay.obs_dtype == np.uint8
    fragment = _fragment(4)
    fragment.obs = np.random.default_rng(0).integers(0, 256, (5, 36)).astype(np.float32)
    checked, why = learner.sanitise(fragment)
    assert checked is not None and why == ""
    fragment.obs[2, 7] = 300.0
    checked, why = learner.sanitise(fragment)
    assert checked is None and "[0, 255]" in why
    assert DQNLearner(OBS, ACT, _settings()).replay.obs_dtype == np.float32
