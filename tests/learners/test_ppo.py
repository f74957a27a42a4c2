"""PPO: the loss functions by hand, and the learner on fragments from a tiny environment."""

from __future__ import annotations

import dataclasses
import logging
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from gymnasium import spaces

from rlserve.errors import ConfigError
from rlserve.experience.episodes import EpisodeTable
from rlserve.learners import common
from rlserve.learners.advantages import gae
from rlserve.learners.common import WARN_INTERVAL_S
from rlserve.learners.ppo import (
    PPOLearner,
    PPOSettings,
    clipped_policy_loss,
    minibatch_indices,
    normalise_advantages,
    value_loss,
)
from rlserve.learners.ppo_batch import (
    behaviour_kl,
    importance_log_ratio,
    importance_weights,
    trace_coefficients,
)
from rlserve.learners.ppo_losses import UpdateStats
from rlserve.policy import NumpyPolicy
from rlserve.policy.action_layout import actions_to_space
from rlserve.protocol.fragment import Fragment

OBS_SPACE = spaces.Box(-1.0, 1.0, (2,), np.float32)
DISCRETE = spaces.Discrete(2)
BOX_ACTIONS = spaces.Box(-1.0, 1.0, (2,), np.float32)


# -- loss functions by hand ------------------------------------------------------------------


def _loss(ratios: list[float], advantages: list[float], clip: float = 0.2) -> tuple[float, Any]:
    behaviour = torch.zeros(len(ratios), dtype=torch.float64)
    logp = torch.log(torch.tensor(ratios, dtype=torch.float64))
    loss, ratio = clipped_policy_loss(
        logp, behaviour, torch.tensor(advantages, dtype=torch.float64), clip
    )
    return loss.item(), ratio


@pytest.mark.parametrize(
    ("ratio", "advantage", "expected"),
    [
        (1.1, 1.0, -1.1),  # inside the clip: -A * r
        (0.9, -2.0, 1.8),  # inside the clip, negative advantage
        (1.5, 1.0, -1.2),  # A > 0, r above 1 + c: clipped at 1.2
        (0.5, 1.0, -0.5),  # A > 0, r below 1 - c: unclipped (pessimistic) term wins
        (0.5, -1.0, 0.8),  # A < 0, r below 1 - c: clipped at 0.8
        (1.5, -1.0, 1.5),  # A < 0, r above 1 + c: unclipped (pessimistic) term wins
        (1.0, 3.0, -3.0),
    ],
)
def test_clipped_policy_loss_single(ratio: float, advantage: float, expected: float) -> None:
    loss, r = _loss([ratio], [advantage])
    assert loss == pytest.approx(expected, rel=1e-9)
    assert r.item() == pytest.approx(ratio, rel=1e-9)


def test_clipped_policy_loss_is_the_mean() -> None:
    # Terms: -1.1, -1.2, 0.8, -0.5, 1.5, -1.4  -> sum -1.9, mean -0.316666...
    loss, ratio = _loss([1.1, 1.5, 0.5, 0.5, 1.5, 0.7], [1.0, 1.0, -1.0, 1.0, -1.0, 2.0])
    assert loss == pytest.approx(-1.9 / 6, rel=1e-9)
    np.testing.assert_allclose(ratio.numpy(), [1.1, 1.5, 0.5, 0.5, 1.5, 0.7], rtol=1e-12)


def test_clipped_policy_loss_other_clip() -> None:
    # clip 0.1: r = 1.5, A = 2 -> max(-3.0, -2.2) = -2.2
    loss, _ = _loss([1.5], [2.0], clip=0.1)
    assert loss == pytest.approx(-2.2, rel=1e-9)


def test_clipped_policy_loss_gradient_is_zero_when_clipped() -> None:
    logp = torch.tensor([math.log(1.5), math.log(1.1)], dtype=torch.float64, requires_grad=True)
    loss, _ = clipped_policy_loss(
        logp,
        torch.zeros(2, dtype=torch.float64),
        torch.tensor([1.0, 1.0], dtype=torch.float64),
        0.2,
    )
    loss.backward()
    assert logp.grad is not None
    # d/dlogp of -A * r / N = -A * r / N for the unclipped one; zero for the clipped one.
    np.testing.assert_allclose(logp.grad.numpy(), [0.0, -1.1 / 2], rtol=1e-9)


def test_value_loss_by_hand() -> None:
    values = torch.tensor([1.0, 2.0, 0.0])
    returns = torch.tensor([0.0, 4.0, 0.5])
    # errors 1, -2, -0.5 -> squares 1, 4, 0.25 -> mean 1.75 -> half 0.875
    assert value_loss(values, returns).item() == pytest.approx(0.875)
    assert value_loss(returns, returns).item() == 0.0


# -- config ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"minibatch_size": 0},
        {"train_batch_size": -1},
        {"train_batch_size": 64, "minibatch_size": 128},
        {"activation": "gelu"},
        {"device": "tpu"},
        {"max_abs_input": 0.0},
        {"max_abs_input": float("nan")},
        {"train_batch_size": 64, "minibatch_size": 16, "max_steps_per_update": 32},
        {"importance_weight_cap": 0.0},
        {"logged_steps": "ignore"},
        {"bc_coef": -1.0},
    ],
    ids=str,
)
def test_config_rejects_bad_values(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        PPOSettings(**kwargs)


# -- learner on a tiny environment -----------------------------------------------------------


def _config(**overrides: Any) -> PPOSettings:
    values: dict[str, Any] = {
        "train_batch_size": 64,
        "minibatch_size": 16,
        "num_epochs": 2,
        "hidden": (16,),
        "device": "cpu",
        "seed": 0,
        "lr": 3e-3,
    }
    values.update(overrides)
    return PPOSettings(**values)


class ChainEnv:
    """A tiny deterministic env: move a point on [-1, 1]; reward for being near zero."""

    def __init__(self, seed: int, continuous: bool) -> None:
        self.rng = np.random.default_rng(seed)
        self.continuous = continuous

    def reset(self) -> np.ndarray:
        self.x = float(self.rng.uniform(-1, 1))
        self.t = 0
        return self._obs()

    def _obs(self) -> np.ndarray:
        return np.array([self.x, self.t / 10], dtype=np.float32)

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool]:
        move = float(np.clip(action, -1, 1)[0]) if self.continuous else (1.0 if action else -1.0)
        self.x = float(np.clip(self.x + 0.2 * move, -1, 1))
        self.t += 1
        reward = 1.0 - abs(self.x)
        terminated = abs(self.x) >= 1.0
        truncated = self.t >= 10
        return self._obs(), reward, terminated, truncated


def collect(
    learner: PPOLearner,
    steps: int,
    seed: int = 0,
    version: int | None = None,
    continuous: bool = False,
    fragment_length: int = 8,
) -> list[Fragment]:
    """Run the env with the learner's published actor through an EpisodeTable."""
    package = learner.weights()
    policy = NumpyPolicy(package.spec, package.arrays, package.version, seed=seed)
    version = package.version if version is None else version
    env = ChainEnv(seed, continuous)
    sink: list[Fragment] = []
    table = EpisodeTable(fragment_length, 10, 10, sink.append, clock=lambda: 0.0)
    taken = 0
    episode = 0
    while taken < steps:
        eid = f"s{seed}-e{episode}"
        episode += 1
        table.start(eid, True, "default", "test")
        ep = table.get(eid)
        obs = env.reset()
        reward: float | None = None
        while True:
            table.observe(ep, obs, reward)
            out = policy.compute_actions(obs[None])
            action = out.actions[0] if continuous else int(out.actions[0])
            table.act(ep, action, float(out.logp[0]), True, version)
            taken += 1
            obs, reward, terminated, truncated = env.step(
                policy.to_env_actions(out.actions)[0] if continuous else action
            )
            if terminated or truncated or taken >= steps:
                table.end(ep, obs, truncated=not terminated, reward=reward)
                break
    assert sum(len(f) for f in sink) == steps
    return sink


def _assert_metrics_finite(metrics: dict[str, float]) -> None:
    assert metrics
    for name, value in metrics.items():
        assert name.startswith("learner/"), name
        assert math.isfinite(value), (name, value)


def _params(learner: PPOLearner) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in learner.model.state_dict().items()}


def test_ready_at_train_batch_size() -> None:
    learner = PPOLearner(OBS_SPACE, DISCRETE, _config())
    fragments = collect(learner, 64)
    total = 0
    for f in fragments:
        assert not learner.ready()
        learner.ingest([f])
        total += len(f)
        assert learner.ready() is (total >= 64)
    assert learner.ready()


def test_update_increments_version_and_returns_finite_metrics() -> None:
    learner = PPOLearner(OBS_SPACE, DISCRETE, _config())
    before = _params(learner)
    learner.ingest(collect(learner, 64))
    metrics = learner.update()
    assert learner.version == 1
    assert learner.weights().version == 1
    _assert_metrics_finite(metrics)
    for key in (
        "policy_loss",
        "value_loss",
        "entropy",
        "approx_kl",
        "clip_frac",
        "explained_variance",
        "batch_steps",
        "weights_version",
        "steps_trained",
    ):
        assert f"learner/{key}" in metrics
    assert metrics["learner/batch_steps"] == 64
    assert metrics["learner/weights_version"] == 1
    assert metrics["learner/entropy"] > 0
    assert learner.counters() == {
        "updates": 1,
        "steps_trained": 64,
        "steps_dropped_stale": 0,
        "steps_dropped_cap": 0,
        "steps_logged": 0,
        "fragments_excluded_invalid": 0,
        "steps_excluded_invalid": 0,
        "minibatches_skipped_nonfinite": 0,
        "updates_skipped_nonfinite": 0,
        "version": 1,
    }
    # The weights moved, and the buffer was consumed.
    after = _params(learner)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert not learner.ready()


@pytest.mark.parametrize(
    ("size", "minibatch"), [(64, 16), (81, 16), (79, 16), (2047, 256), (9, 16)]
)
def test_each_epoch_splits_a_fresh_permutation_into_equal_minibatches(
    size: int, minibatch: int
) -> None:
    generator = torch.Generator().manual_seed(0)
    epochs = [minibatch_indices(size, minibatch, generator) for _ in range(3)]
    for parts in epochs:
        sizes = [len(part) for part in parts]
        assert len(parts) == math.ceil(size / minibatch)
        assert max(sizes) - min(sizes) <= 1 and max(sizes) <= minibatch
        np.testing.assert_array_equal(np.sort(torch.cat(parts).numpy()), np.arange(size))
    assert not torch.equal(torch.cat(epochs[0]), torch.cat(epochs[1]))  # a fresh order


def test_an_update_makes_no_small_remainder_minibatch() -> None:
    """A batch of 81 steps with minibatches of 16: six of 13 or 14 steps, no step-sized one."""
    learner = PPOLearner(OBS_SPACE, DISCRETE, _config(minibatch_size=16, num_epochs=3))
    sizes: list[int] = []
    minibatch = learner._minibatch

    def recorded(rows: dict[str, torch.Tensor], *args: Any) -> bool:
        sizes.append(len(rows["obs"]))
        return minibatch(rows, *args)

    learner._minibatch = recorded  # type: ignore[method-assign]
    learner.ingest(collect(learner, 81))
    learner.update()
    assert len(sizes) == 3 * 6 and set(sizes) <= {13, 14} and sum(sizes) == 3 * 81


def test_update_twice() -> None:
    learner = PPOLearner(OBS_SPACE, DISCRETE, _config())
    for expected in (1, 2):
        learner.ingest(collect(learner, 64, seed=expected))
        _assert_metrics_finite(learner.update())
        assert learner.version == expected
    assert learner.counters()["steps_trained"] == 128


def test_update_with_box_actions() -> None:
    learner = PPOLearner(OBS_SPACE, BOX_ACTIONS, _config())
    fragments = collect(learner, 64, continuous=True)
    assert fragments[0].actions.dtype == np.float32
    assert fragments[0].actions.shape[1:] == (2,)
    learner.ingest(fragments)
    _assert_metrics_finite(learner.update())
    assert learner.version == 1


def test_published_weights_are_numpy_float32() -> None:
    learner = PPOLearner(OBS_SPACE, BOX_ACTIONS, _config())
    package = learner.weights()
    assert package.version == 0
    assert package.spec.obs_dim == 2
    assert package.spec.distribution == "gaussian"
    assert "log_std" in package.arrays
    assert all(a.dtype == np.float32 for a in package.arrays.values())


def _fragment(versions: list[int], logp: float = -0.7) -> Fragment:
    steps = len(versions)
    rng = np.random.default_rng(steps)
    return Fragment(
        episode_id="e",
        agent_id="agent0",
        policy_id="default",
        obs=rng.uniform(-1, 1, (steps + 1, 2)).astype(np.float32),
        actions=(np.arange(steps) % 2).astype(np.int64),
        rewards=np.linspace(0, 1, steps, dtype=np.float32),
        behaviour_logp=np.full(steps, logp, np.float32),
        policy_chosen=np.full(steps, not math.isnan(logp)),
        weights_version=np.asarray(versions, np.int64),
        terminated=False,
        truncated=True,
    )


def test_stale_steps_are_dropped_and_counted() -> None:
    learner = PPOLearner(OBS_SPACE, DISCRETE, _config(max_policy_lag=1))
    for _ in range(2):
        learner.ingest(collect(learner, 64))
        learner.update()
    assert learner.version == 2
    # version 2, lag 1: steps of version 0 are stale, version 1 and 2 are fresh.
    learner.ingest([_fragment([0] * 10)])
    assert learner.counters()["steps_dropped_stale"] == 10
    learner.ingest([_fragment([0, 0, 0, 1, 1, 2])])
    assert learner.counters()["steps_dropped_stale"] == 13
    learner.ingest([_fragment([1] * 30), _fragment([2] * 27)])
    assert not learner.ready()  # 3 + 30 + 27 = 60 fresh steps < 64
    learner.ingest([_fragment([2] * 4)])
    assert learner.ready()
    metrics = learner.update()
    # Only the fresh steps are trained on.
    assert metrics["learner/batch_steps"] == 64
    assert metrics["learner/steps_dropped_stale"] == 13
    assert learner.counters()["steps_dropped_stale"] == 13


def test_max_policy_lag_zero_drops_previous_version() -> None:
    learner = PPOLearner(OBS_SPACE, DISCRETE, _config(max_policy_lag=0))
    learner.ingest(collect(learner, 64))
    learner.update()
    learner.ingest([_fragment([0] * 5), _fragment([1] * 5)])
    assert learner.counters()["steps_dropped_stale"] == 5


def _logged(fragment: Fragment, steps: list[int], logp: float = float("nan")) -> Fragment:
    """``fragment`` with ``steps`` logged: not chosen by the policy, behaviour ``logp``."""
    chosen = fragment.policy_chosen.copy()
    chosen[steps] = False
    return _with(
        fragment,
        policy_chosen=chosen,
        behaviour_logp=_set(fragment.behaviour_logp, steps, logp),
    )


def _current_logp(learner: PPOLearner, fragment: Fragment) -> np.ndarray:
    with torch.no_grad():
        logp, _ = learner.model.log_prob_entropy(
            torch.as_tensor(fragment.obs[:-1]), torch.as_tensor(fragment.actions)
        )
    return logp.numpy()


def _values(learner: PPOLearner, fragment: Fragment) -> np.ndarray:
    with torch.no_grad():
        return learner.model.value(torch.as_tensor(fragment.obs)).numpy()


def test_logged_steps_on_policy_take_the_proximal_policy() -> None:
    learner = PPOLearner(OBS_SPACE, DISCRETE, _config(logged_steps="on_policy"))
    fragments = [_fragment([0] * 16, logp=float("nan")) for _ in range(3)]
    fragments.append(_logged(_fragment([0] * 16), [3], logp=-0.1))  # a finite one is ignored
    learner.ingest(fragments)
    assert learner.ready()
    batch = learner._build_batch()
    assert batch is not None
    assert batch["policy"].all() and batch["logged"][:48].all()
    assert int(batch["logged"].sum()) == 49
    # A logged step's weight is 1: its behaviour policy is taken to be the proximal one.
    current = np.concatenate([_current_logp(learner, f) for f in fragments])
    np.testing.assert_allclose(batch["prox_logp"].numpy(), current, rtol=1e-6)
    np.testing.assert_allclose(batch["weights"][:48].numpy(), 1.0)
    assert batch["weights"][48 + 3].item() == pytest.approx(1.0)
    expected = np.minimum(np.exp(current[48:] - np.float32(-0.7)), 1.0)
    expected[3] = 1.0
    np.testing.assert_allclose(batch["weights"][48:].numpy(), expected, rtol=1e-5)
    # And a full update on such steps stays finite.
    learner.ingest(fragments)
    metrics = learner.update()
    _assert_metrics_finite(metrics)
    assert metrics["learner/steps_logged"] == 49 * 2
    _assert_params_finite(learner)


def test_a_batch_of_only_logged_steps_says_how_to_learn_from_them(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The default leaves log_action steps out: not a non-finite update, and the fix named."""
    caplog.set_level(logging.WARNING, logger="rlserve.learner")
    learner = PPOLearner(OBS_SPACE, DISCRETE, _config(train_batch_size=16, minibatch_size=16))
    learner.ingest([_logged(_fragment([0] * 16), list(range(16)))])
    metrics = learner.update()
    assert metrics["learner/updates_skipped_nonfinite"] == 0
    assert metrics["learner/updates"] == 0 and metrics["learner/steps_logged"] == 16
    (line,) = [r.getMessage() for r in caplog.records if r.name == "rlserve.learner"]
    assert "PPO trained on none of these steps" in line and "--ppo-logged-steps" in line
    assert line.endswith("16 logged steps left out")


@pytest.mark.parametrize("mode", ["exclude", "value", "bc"])
def test_logged_steps_leave_the_surrogate_and_cut_the_trace(mode: str) -> None:
    config = _config(
        logged_steps=mode, truncated_traces=False, train_batch_size=16, minibatch_size=16
    )
    learner = PPOLearner(OBS_SPACE, DISCRETE, config)
    # Steps 5 and 6 logged (one with a finite log-probability, which changes nothing).
    fragment = _logged(_fragment([0] * 16), [5, 6])
    fragment.behaviour_logp[6] = -0.2
    learner.ingest([fragment])
    batch = learner._build_batch()
    assert batch is not None
    values = _values(learner, fragment)
    traces = np.ones(16, np.float32)
    traces[[5, 6]] = 0.0
    advantages, returns = gae(
        fragment.rewards, values[:16], float(values[16]), config.gamma, config.gae_lambda, traces
    )
    kept = np.ones(16, bool)
    if mode == "exclude":
        kept[[5, 6]] = False
        assert not batch["logged"].any()
        assert batch["policy"].all()
    else:
        np.testing.assert_array_equal(batch["logged"].numpy(), ~kept | np.isin(range(16), [5, 6]))
        np.testing.assert_array_equal(batch["policy"].numpy(), ~batch["logged"].numpy())
    np.testing.assert_allclose(batch["advantages"].numpy(), advantages[kept], rtol=1e-5)
    np.testing.assert_allclose(batch["returns"].numpy(), returns[kept], rtol=1e-5)
    # The step before a logged step has the one-step TD error as its advantage.
    delta_4 = fragment.rewards[4] + config.gamma * values[5] - values[4]
    assert advantages[4] == pytest.approx(delta_4, rel=1e-5)
    learner.ingest([fragment])
    metrics = learner.update()
    _assert_metrics_finite(metrics)
    assert metrics["learner/batch_steps"] == (14 if mode == "exclude" else 16)
    assert metrics["learner/steps_logged"] == 4
    assert ("learner/bc_loss" in metrics) is (mode == "bc")


def test_logged_steps_are_never_stale() -> None:
    learner = PPOLearner(OBS_SPACE, DISCRETE, _config(max_policy_lag=0))
    learner.ingest(collect(learner, 64))
    learner.update()
    # Version 1, lag 0: version-0 steps are stale unless logged.
    learner.ingest([_logged(_fragment([0] * 10), [2, 3, 4])])
    assert learner.counters()["steps_dropped_stale"] == 7
    assert learner.buffered_steps == 3


def _logged_action_probability(learner: PPOLearner, fragment: Fragment) -> float:
    return float(np.exp(_current_logp(learner, fragment)).mean())


@pytest.mark.parametrize(("mode", "rises"), [("bc", True), ("value", False), ("exclude", False)])
def test_behaviour_cloning_learns_the_logged_actions(mode: str, rises: bool) -> None:
    learner = PPOLearner(OBS_SPACE, DISCRETE, _config(logged_steps=mode, bc_coef=1.0))
    fragment = _logged(_fragment([0] * 64), list(range(64)))
    fragment.actions[:] = 1
    before = _logged_action_probability(learner, fragment)
    for _ in range(3):
        learner.ingest(
            [
                dataclasses.replace(
                    fragment, weights_version=fragment.weights_version * 0 + learner.version
                )
            ]
        )
        learner.update()
    after = _logged_action_probability(learner, fragment)
    if rises:
        assert after > before + 0.1
    else:
        assert after == pytest.approx(before, abs=1e-6)


def _one_step_episode(version: int, action: int, reward: float, logged: bool) -> Fragment:
    """An episode of one step from the one state ``[1, 1]``, terminated after it."""
    return Fragment(
        episode_id=f"{version}-{action}-{reward}-{logged}",
        agent_id="agent0",
        policy_id="default",
        obs=np.ones((2, 2), np.float32),
        actions=np.array([action], np.int64),
        rewards=np.array([reward], np.float32),
        behaviour_logp=np.array([np.nan if logged else np.log(0.5)], np.float32),
        policy_chosen=np.array([not logged]),
        weights_version=np.array([version], np.int64),
        terminated=True,
        truncated=False,
    )


def test_by_default_logged_actions_do_not_bias_the_policys_value() -> None:
    """One state; every action of the policy is worth 0.5, so it stays at 50/50 and its value
    is 0.5. Half the episodes are another controller's action, worth 1: the value function
    must learn the policy's value, not that of the mix (0.75)."""
    learner = PPOLearner(OBS_SPACE, DISCRETE, _config(train_batch_size=64, minibatch_size=16))
    for _ in range(40):
        version = learner.version
        fragments = [_one_step_episode(version, i % 2, 0.5, logged=False) for i in range(32)]
        fragments += [_one_step_episode(version, 1, 1.0, logged=True) for _ in range(32)]
        learner.ingest(fragments)
        learner.update()
    with torch.no_grad():
        value = float(learner.model.value(torch.ones((1, 2)))[0])
        logp, _ = learner.model.log_prob_entropy(torch.ones((2, 2)), torch.tensor([0, 1]))
    np.testing.assert_allclose(logp.exp().numpy(), [0.5, 0.5], atol=0.05)
    assert value == pytest.approx(0.5, abs=0.05)


def _stale_learner(lag: int, **overrides: Any) -> tuple[PPOLearner, list[Fragment]]:
    """A learner ``lag`` updates past the weights that collected the fragments it returns."""
    learner = PPOLearner(OBS_SPACE, DISCRETE, _config(max_policy_lag=lag, lr=3e-2, **overrides))
    stale = collect(learner, 64, seed=5)
    for update in range(lag):
        learner.ingest(collect(learner, 64, seed=update))
        learner.update()
    assert learner.version == lag
    return learner, stale


def test_decoupled_batch_is_centred_on_the_proximal_policy() -> None:
    learner, stale = _stale_learner(2, importance_weight_cap=1.5)
    learner.ingest(stale)
    batch = learner._build_batch()
    assert batch is not None
    current = np.concatenate([_current_logp(learner, f) for f in stale])
    behaviour = np.concatenate([f.behaviour_logp for f in stale])
    np.testing.assert_allclose(batch["prox_logp"].numpy(), current, rtol=1e-6)
    rho = np.exp(current.astype(np.float64) - behaviour)
    assert rho.min() < 0.95 and rho.max() > 1.05  # the weights moved since
    np.testing.assert_allclose(batch["weights"].numpy(), np.minimum(rho, 1.5), rtol=1e-5)
    stats = learner._batch_stats
    assert stats["lag_2"] == 1.0 and stats["lag_0"] == stats["lag_1"] == stats["lag_3plus"] == 0
    kl = float(np.mean(rho - 1 - np.log(rho)))
    assert stats["behaviour_kl"] == pytest.approx(kl, rel=1e-4)
    assert stats["importance_weight_mean"] == pytest.approx(np.minimum(rho, 1.5).mean(), rel=1e-5)


def test_approx_kl_is_zero_before_the_first_gradient_step_on_stale_data() -> None:
    learner, stale = _stale_learner(2)
    learner.ingest(stale)
    batch = learner._build_batch()
    assert batch is not None
    stats = UpdateStats(clip_coef=0.2)
    assert learner._minibatch({k: v[:16] for k, v in batch.items()}, stats)
    means = stats.means()
    assert means["approx_kl"] == pytest.approx(0.0, abs=1e-6)
    assert means["clip_frac"] == 0.0
    assert learner._batch_stats["behaviour_kl"] > 1e-3  # against the behaviour it is not 0
    # The classic (coupled) ratio against the behaviour policy starts far from 1.
    _, classic = clipped_policy_loss(
        batch["prox_logp"],
        torch.as_tensor(np.concatenate([f.behaviour_logp for f in stale])),
        batch["advantages"],
        0.2,
    )
    assert ((classic - 1).abs() > 0.05).any()


def test_update_reports_the_lag_histogram() -> None:
    learner, stale = _stale_learner(1)
    learner.ingest(stale)  # 64 steps of version 0 (lag 1)
    learner.ingest(collect(learner, 32, seed=9))  # 32 steps of version 1 (lag 0)
    metrics = learner.update()
    assert metrics["learner/lag_0"] == pytest.approx(1 / 3)
    assert metrics["learner/lag_1"] == pytest.approx(2 / 3)
    assert metrics["learner/lag_2"] == metrics["learner/lag_3plus"] == 0.0
    _assert_metrics_finite(metrics)


def test_steps_beyond_the_cap_are_the_oldest_and_counted() -> None:
    learner = PPOLearner(OBS_SPACE, DISCRETE, _config(max_steps_per_update=64))
    learner.ingest(collect(learner, 64))
    learner.update()
    newer = _fragment([1] * 40)
    older = _fragment([0] * 40)
    older.obs[:] = 0.5
    learner.ingest([newer, older])  # the newer arrive first: versions outrank arrival
    batch = learner._build_batch()
    assert batch is not None and batch["obs"].shape[0] == 64
    np.testing.assert_array_equal(batch["obs"][:40].numpy(), newer.obs[:40])
    np.testing.assert_array_equal(batch["obs"][40:].numpy(), older.obs[16:40])  # its newest 24
    assert learner.counters()["steps_dropped_cap"] == 16
    assert learner._batch_stats["lag_0"] == pytest.approx(40 / 64)
    assert learner._batch_stats["lag_1"] == pytest.approx(24 / 64)
    # Arrival decides between steps of one version: the last 64 of 80 stay.
    first, second = _fragment([1] * 40), _fragment([1] * 40)
    learner.ingest([first, second])
    batch = learner._build_batch()
    assert batch is not None
    np.testing.assert_array_equal(batch["obs"][:24].numpy(), first.obs[16:40])
    assert learner.counters()["steps_dropped_cap"] == 32
    assert learner.buffered_steps == 0


def test_default_cap_is_twice_the_batch() -> None:
    assert _config().step_cap == 128
    assert _config(max_steps_per_update=100).step_cap == 100


def test_importance_weights_and_traces_by_hand() -> None:
    log_ratio = np.log(np.array([0.5, 1.0, 1.5, 3.0], np.float32))
    np.testing.assert_allclose(importance_weights(log_ratio, 2.0), [0.5, 1.0, 1.5, 2.0], rtol=1e-6)
    np.testing.assert_allclose(importance_weights(log_ratio, 1.0), [0.5, 1.0, 1.0, 1.0], rtol=1e-6)
    np.testing.assert_allclose(trace_coefficients(log_ratio), [0.5, 1.0, 1.0, 1.0], rtol=1e-6)
    # rho = 2 and 0.5: (1 - ln 2) + (-0.5 + ln 2) = 0.5, mean 0.25.
    assert behaviour_kl(np.log(np.array([2.0, 0.5]))) == pytest.approx(0.25, rel=1e-9)
    assert math.isnan(behaviour_kl(np.zeros(0)))
    # The log-ratio is clamped, and unknown (NaN) behaviour stays NaN.
    clamped = importance_log_ratio(np.array([0.0, 0.0, -1.0]), np.array([-1e30, 1e30, np.nan]))
    np.testing.assert_array_equal(clamped[:2], [20.0, -20.0])
    assert np.isnan(clamped[2])


def test_decoupled_policy_loss_by_hand() -> None:
    # r = pi / pi_prox = [1.1, 1.5, 0.5], A = [1, 1, -1], w = [0.5, 2, 1]:
    # terms w * max(-A r, -A clip(r, 0.8, 1.2)) = 0.5 * -1.1, 2 * -1.2, 1 * 0.8
    #       = -0.55, -2.4, 0.8 -> mean -2.15 / 3
    prox = torch.tensor([-0.3, -1.2, -2.0], dtype=torch.float64)
    logp = prox + torch.log(torch.tensor([1.1, 1.5, 0.5], dtype=torch.float64))
    advantages = torch.tensor([1.0, 1.0, -1.0], dtype=torch.float64)
    weights = torch.tensor([0.5, 2.0, 1.0], dtype=torch.float64)
    loss, ratio = clipped_policy_loss(logp, prox, advantages, 0.2, weights)
    assert loss.item() == pytest.approx(-2.15 / 3, rel=1e-9)
    np.testing.assert_allclose(ratio.numpy(), [1.1, 1.5, 0.5], rtol=1e-12)
    # Without weights it is classic PPO's loss: (-1.1 - 1.2 + 0.8) / 3.
    unweighted, _ = clipped_policy_loss(logp, prox, advantages, 0.2)
    assert unweighted.item() == pytest.approx(-1.5 / 3, rel=1e-9)


def test_terminated_fragment_does_not_bootstrap() -> None:
    learner = PPOLearner(OBS_SPACE, DISCRETE, _config(train_batch_size=1, minibatch_size=1))
    f = _fragment([0])
    f.rewards[:] = 1.0
    with torch.no_grad():
        values = learner.model.value(torch.as_tensor(f.obs)).numpy()
    f.terminated, f.truncated = True, False
    learner.ingest([f])
    batch = learner._build_batch()
    assert batch["returns"][0].item() == pytest.approx(1.0, abs=1e-6)
    f.terminated, f.truncated = False, True
    learner.ingest([f])
    batch = learner._build_batch()
    expected = 1.0 + learner.config.gamma * float(values[1])
    assert batch["returns"][0].item() == pytest.approx(expected, abs=1e-6)


# -- hostile and broken experience ------------------------------------------------------------


def _assert_params_finite(learner: PPOLearner) -> None:
    for name, value in learner.model.state_dict().items():
        assert torch.isfinite(value).all(), name


def _with(fragment: Fragment, **fields: Any) -> Fragment:
    return dataclasses.replace(fragment, **fields)


def _set(array: np.ndarray, index: Any, value: Any) -> np.ndarray:
    out = array.copy()
    out[index] = value
    return out


def _bad_discrete(good: Fragment, case: str) -> Fragment:
    steps = len(good)
    match case:
        case "rewards 3e38":
            return _with(good, rewards=_set(good.rewards, 2, 3e38))
        case "rewards -inf":
            return _with(good, rewards=_set(good.rewards, 0, -np.inf))
        case "rewards nan":
            return _with(good, rewards=_set(good.rewards, 1, np.nan))
        case "obs 1e38":
            return _with(good, obs=_set(good.obs, (3, 0), 1e38))
        case "obs float64 1e39":
            return _with(good, obs=_set(good.obs.astype(np.float64), (1, 1), 1e39))
        case "obs nan in the last":
            return _with(good, obs=_set(good.obs, (steps, 0), np.nan))
        case "obs wrong width":
            return _with(good, obs=np.zeros((steps + 1, 3), np.float32))
        case "obs no next":
            return _with(good, obs=good.obs[:steps])
        case "action out of range":
            return _with(good, actions=_set(good.actions, 0, 7))
        case "action negative":
            return _with(good, actions=_set(good.actions, 0, -1))
        case "action not whole":
            return _with(good, actions=_set(good.actions.astype(np.float64), 0, 0.5))
        case "action text":
            return _with(good, actions=np.array(["left"] * steps))
        case "versions float":
            return _with(good, weights_version=good.weights_version.astype(np.float64))
        case "rewards scalar":
            return _with(good, rewards=np.float32(1.0))
        case "rewards ragged":
            return _with(good, rewards=[1.0, [2.0, 3.0]])
    raise AssertionError(case)


DISCRETE_CASES = [
    "rewards 3e38",
    "rewards -inf",
    "rewards nan",
    "obs 1e38",
    "obs float64 1e39",
    "obs nan in the last",
    "obs wrong width",
    "obs no next",
    "action out of range",
    "action negative",
    "action not whole",
    "action text",
    "versions float",
    "rewards scalar",
    "rewards ragged",
]


@pytest.mark.parametrize("case", DISCRETE_CASES)
def test_a_fragment_that_cannot_be_trained_on_is_excluded_and_counted(case: str) -> None:
    learner = PPOLearner(OBS_SPACE, DISCRETE, _config())
    good = collect(learner, 64)
    bad = _bad_discrete(_fragment([0] * 8), case)
    learner.ingest([bad, *good])
    counters = learner.counters()
    assert counters["fragments_excluded_invalid"] == 1
    assert counters["steps_excluded_invalid"] == (
        0 if case.startswith("rewards s") or case.endswith("ragged") else 8
    )
    assert learner.buffered_steps == 64
    metrics = learner.update()
    _assert_metrics_finite(metrics)
    _assert_params_finite(learner)
    assert learner.version == 1
    assert metrics["learner/steps_trained"] == 64
    assert metrics["learner/fragments_excluded_invalid"] == 1
    assert metrics["learner/minibatches_skipped_nonfinite"] == 0


@pytest.mark.parametrize("value", [1e38, np.nan, np.inf, -2e9])
def test_a_box_action_that_cannot_be_trained_on_is_excluded(value: float) -> None:
    learner = PPOLearner(OBS_SPACE, BOX_ACTIONS, _config())
    good = collect(learner, 64, continuous=True)
    bad = _with(good[0], actions=_set(good[0].actions, (0, 1), value))
    learner.ingest([bad, *good[1:]])
    assert learner.counters()["fragments_excluded_invalid"] == 1
    _assert_metrics_finite(learner.update())
    _assert_params_finite(learner)


def test_values_of_other_dtypes_are_cast_and_trained() -> None:
    learner = PPOLearner(OBS_SPACE, DISCRETE, _config())
    fragments = [
        _with(f, obs=f.obs.astype(np.float64), rewards=f.rewards.astype(np.float64))
        for f in collect(learner, 64)
    ]
    learner.ingest(fragments)
    _assert_metrics_finite(learner.update())
    assert learner.counters()["fragments_excluded_invalid"] == 0
    assert learner.version == 1


def test_absurd_behaviour_logp_is_clamped_or_taken_as_unknown() -> None:
    learner = PPOLearner(OBS_SPACE, DISCRETE, _config())
    fragments = collect(learner, 64)
    fragments[0] = _with(fragments[0], behaviour_logp=np.full(len(fragments[0]), -1e30, np.float32))
    fragments[1] = _with(fragments[1], behaviour_logp=np.full(len(fragments[1]), 1e30, np.float32))
    fragments[2] = _with(fragments[2], behaviour_logp=_set(fragments[2].behaviour_logp, 0, -np.inf))
    fragments[3] = _with(fragments[3], behaviour_logp=_set(fragments[3].behaviour_logp, 1, np.inf))
    sanitised, _ = learner.sanitise(fragments[2])
    assert sanitised is not None
    assert np.isnan(sanitised.behaviour_logp[0])  # unknown: the current policy's is used
    assert np.isfinite(sanitised.behaviour_logp[1:]).all()
    learner.ingest(fragments)
    assert learner.counters()["fragments_excluded_invalid"] == 0
    metrics = learner.update()
    _assert_metrics_finite(metrics)
    _assert_params_finite(learner)
    assert metrics["learner/minibatches_skipped_nonfinite"] == 0
    assert learner.version == 1


def test_clipped_policy_loss_is_finite_for_an_absurd_behaviour_logp() -> None:
    logp = torch.tensor([-0.5, -0.7], requires_grad=True)
    loss, ratio = clipped_policy_loss(
        logp, torch.tensor([-1e30, 1e30]), torch.tensor([-1.0, 1.0]), 0.2
    )
    loss.backward()
    assert torch.isfinite(loss)
    assert torch.isfinite(ratio).all()
    assert logp.grad is not None and torch.isfinite(logp.grad).all()


def test_advantage_normalisation_never_divides_by_zero() -> None:
    assert torch.equal(normalise_advantages(torch.full((8,), 3.0)), torch.zeros(8))
    tiny = normalise_advantages(torch.tensor([1.0, 1.0000001, 1.0, 1.0000001]))
    assert torch.isfinite(tiny).all() and tiny.abs().max() < 1.0
    normal = normalise_advantages(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    assert normal.mean().item() == pytest.approx(0.0, abs=1e-6)
    assert normal.std().item() == pytest.approx(1.0, rel=1e-5)


def _nonfinite_loss(fragment: Fragment) -> Fragment:
    # Finite and within a raised max_abs_input, but the value loss squares it past float32.
    return _with(fragment, rewards=np.full(len(fragment), 1e30, np.float32))


def test_a_batch_whose_every_step_is_nonfinite_changes_nothing() -> None:
    learner = PPOLearner(OBS_SPACE, DISCRETE, _config(max_abs_input=3e38))
    before = _params(learner)
    optimizer_before = learner.optimizer.state_dict()
    learner.ingest([_nonfinite_loss(f) for f in collect(learner, 64)])
    metrics = learner.update()
    # No step applied: same weights, same optimiser state, same version, buffer consumed.
    after = _params(learner)
    assert all(torch.equal(before[k], after[k]) for k in before)
    _optimizer_state_equal(optimizer_before, learner.optimizer.state_dict())
    assert learner.version == 0
    assert learner.weights().version == 0
    assert not learner.ready()
    assert metrics["learner/minibatches_skipped_nonfinite"] == 8  # 2 epochs x 4 minibatches
    assert metrics["learner/updates_skipped_nonfinite"] == 1
    assert metrics["learner/weights_version"] == 0
    assert metrics["learner/updates"] == 0
    assert metrics["learner/steps_trained"] == 0
    assert "learner/policy_loss" not in metrics
    assert all(math.isfinite(v) for v in metrics.values())
    # A normal batch afterwards trains normally.
    learner.ingest(collect(learner, 64, seed=3))
    metrics = learner.update()
    _assert_metrics_finite(metrics)
    assert learner.version == 1
    assert metrics["learner/steps_trained"] == 64
    assert metrics["learner/updates_skipped_nonfinite"] == 1
    after_normal = _params(learner)
    assert any(not torch.equal(before[k], after_normal[k]) for k in before)


@pytest.mark.parametrize("kind", ["loss", "gradient"])
def test_a_nonfinite_minibatch_skips_its_step_and_the_rest_train(kind: str) -> None:
    continuous = kind == "gradient"
    learner = PPOLearner(
        OBS_SPACE, BOX_ACTIONS if continuous else DISCRETE, _config(max_abs_input=3e38)
    )
    fragments = collect(learner, 64, continuous=continuous, fragment_length=1)
    if continuous:
        # The log-probability is -inf, clamped in the ratio, but its gradient is NaN.
        fragments[5] = _with(fragments[5], actions=np.full((1, 2), 1e38, np.float32))
    else:
        fragments[5] = _nonfinite_loss(fragments[5])
    learner.ingest(fragments)
    metrics = learner.update()
    # The one bad step sits in exactly one minibatch of each of the 2 epochs.
    assert metrics["learner/minibatches_skipped_nonfinite"] == 2
    assert metrics["learner/updates_skipped_nonfinite"] == 0
    _assert_metrics_finite(metrics)
    _assert_params_finite(learner)
    assert learner.version == 1
    learner.ingest(collect(learner, 64, seed=4, continuous=continuous))
    metrics = learner.update()
    assert metrics["learner/minibatches_skipped_nonfinite"] == 2
    assert learner.version == 2
    _assert_params_finite(learner)


def test_overflowing_advantages_exclude_the_fragment() -> None:
    learner = PPOLearner(OBS_SPACE, DISCRETE, _config(max_abs_input=3.4e38))
    fragments = collect(learner, 64)
    fragments[0] = _with(fragments[0], rewards=np.full(len(fragments[0]), 3e38, np.float32))
    learner.ingest(fragments)
    metrics = learner.update()
    assert metrics["learner/fragments_excluded_invalid"] == 1
    assert metrics["learner/steps_excluded_invalid"] == len(fragments[0])
    assert metrics["learner/steps_trained"] == 64 - len(fragments[0])
    _assert_metrics_finite(metrics)
    _assert_params_finite(learner)


def test_problems_are_logged_once_per_interval_with_counts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    learner = PPOLearner(OBS_SPACE, DISCRETE, _config(max_abs_input=3e38))
    now = [1000.0]
    learner._warnings.clock = lambda: now[0]
    caplog.set_level(logging.WARNING, logger="rlserve.learner")

    def records() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == "rlserve.learner"]

    bad = _bad_discrete(_fragment([0] * 8), "rewards nan")
    learner.ingest([bad, bad])
    assert len(records()) == 1
    assert "2 fragments excluded" in records()[0]
    assert "rewards holds nan" in records()[0]
    # Within the interval: counted, not logged.
    now[0] += 1.0
    learner.ingest([_nonfinite_loss(f) for f in collect(learner, 64)])
    learner.update()
    learner.ingest([bad])
    assert len(records()) == 1
    # After the interval, the next call logs everything gathered since, in one line.
    now[0] += WARN_INTERVAL_S
    learner.ingest(collect(learner, 64, seed=1))
    assert len(records()) == 2
    line = records()[1]
    assert "8 minibatch steps skipped" in line
    assert "1 updates that applied no step" in line
    assert "1 fragments excluded" in line
    learner.update()
    assert len(records()) == 2


# -- checkpoints -----------------------------------------------------------------------------


def _optimizer_state_equal(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a["param_groups"] == b["param_groups"]
    assert a["state"].keys() == b["state"].keys()
    for key in a["state"]:
        sa, sb = a["state"][key], b["state"][key]
        assert sa.keys() == sb.keys()
        for name in sa:
            assert torch.equal(torch.as_tensor(sa[name]), torch.as_tensor(sb[name])), name


def test_save_load_round_trip(tmp_path: Path) -> None:
    a = PPOLearner(OBS_SPACE, DISCRETE, _config(seed=0))
    a.ingest(collect(a, 64))
    a.update()
    a.ingest(collect(a, 64, seed=1))
    a.update()
    a.ingest([_fragment([-5] * 3)])  # counted as stale
    path = tmp_path / "ckpt.pt"
    a.save(path, {"step": 12, "note": "hi"})
    assert path.exists()
    assert not path.with_suffix(".tmp").exists()

    b = PPOLearner(OBS_SPACE, DISCRETE, _config(seed=1))
    assert any(
        not torch.equal(x, y)
        for x, y in zip(a.model.state_dict().values(), b.model.state_dict().values(), strict=True)
    )
    extra = b.load(path)
    assert extra == {"step": 12, "note": "hi"}
    assert b.version == a.version == 2
    assert b.counters() == a.counters()
    assert b.counters()["steps_dropped_stale"] == 3
    for (ka, va), (kb, vb) in zip(
        a.model.state_dict().items(), b.model.state_dict().items(), strict=True
    ):
        assert ka == kb
        assert torch.equal(va, vb), ka
    _optimizer_state_equal(a.optimizer.state_dict(), b.optimizer.state_dict())
    np.testing.assert_array_equal(
        a.weights().arrays["actor.0.weight"], b.weights().arrays["actor.0.weight"]
    )


def test_loaded_learner_continues_identically(tmp_path: Path) -> None:
    a = PPOLearner(OBS_SPACE, DISCRETE, _config(seed=0))
    a.ingest(collect(a, 64))
    a.update()
    path = tmp_path / "ckpt.pt"
    a.save(path, {})
    batch = collect(a, 64, seed=5)

    # The next update draws minibatch orders from torch's generator; load restores it.
    a.ingest(batch)
    metrics_a = a.update()
    b = PPOLearner(OBS_SPACE, DISCRETE, _config(seed=3))
    b.load(path)
    b.ingest(batch)
    metrics_b = b.update()
    metrics_a.pop("learner/update_seconds")
    metrics_b.pop("learner/update_seconds")
    assert metrics_a == metrics_b
    for va, vb in zip(a.model.state_dict().values(), b.model.state_dict().values(), strict=True):
        assert torch.equal(va, vb)
    _optimizer_state_equal(a.optimizer.state_dict(), b.optimizer.state_dict())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_cuda_learner_trains_and_resumes_on_cuda_and_on_the_cpu(tmp_path: Path) -> None:
    # torch.load's map_location moved the minibatch generator's state to the GPU, and a CPU
    # generator refused it: every resume of a CUDA run fell back to a fresh start.
    a = PPOLearner(OBS_SPACE, DISCRETE, _config(device="cuda"))
    a.save(tmp_path / "untrained.pt", {})  # no optimiser built yet: none saved, none loaded
    a.load(tmp_path / "untrained.pt")
    a.ingest(collect(a, 64))
    _assert_metrics_finite(a.update())
    path = tmp_path / "ckpt.pt"
    a.save(path, {})
    for device in ("cuda", "cpu"):
        b = PPOLearner(OBS_SPACE, DISCRETE, _config(device=device, seed=1))
        b.load(path)
        b.ingest(collect(b, 64, seed=1))
        _assert_metrics_finite(b.update())
        assert b.version == 2


def test_a_checkpoint_saved_before_any_update_resumes_and_trains(tmp_path: Path) -> None:
    a = PPOLearner(OBS_SPACE, DISCRETE, _config())
    path = tmp_path / "untrained.pt"
    a.save(path, {})
    b = PPOLearner(OBS_SPACE, DISCRETE, _config())
    b.ingest(collect(b, 64))
    b.update()  # its optimiser is built and has a state, which the load resets

    def adam_steps() -> set[float]:
        return {float(s["step"]) for s in b.optimizer.state_dict()["state"].values()}

    steps_of_one_update = adam_steps()
    b.load(path)
    assert b.version == 0
    b.ingest(collect(b, 64, seed=1))
    _assert_metrics_finite(b.update())
    assert b.version == 1
    assert adam_steps() == steps_of_one_update  # counted from 0 again, not carried on


def test_checkpoint_loads_with_weights_only(tmp_path: Path) -> None:
    learner = PPOLearner(OBS_SPACE, BOX_ACTIONS, _config())
    learner.ingest(collect(learner, 64, continuous=True))
    learner.update()
    path = tmp_path / "ckpt.pt"
    learner.save(path, {"run": "abc", "numbers": [1, 2.5]})
    state = torch.load(path, weights_only=True)
    assert set(state) >= {"model", "optimizer", "counters"}
    assert state["counters"]["version"] == 1
    assert state["extra"] == {"run": "abc", "numbers": [1, 2.5]}


def test_load_uses_weights_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    learner = PPOLearner(OBS_SPACE, DISCRETE, _config())
    path = tmp_path / "ckpt.pt"
    learner.save(path, {})
    seen: list[Any] = []
    real_load = torch.load

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs.get("weights_only"))
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    learner.load(path)
    assert seen == [True]


# -- structured actions ------------------------------------------------------------------------

STRUCTURED_ACTIONS = spaces.Dict(
    {"pick": spaces.MultiDiscrete([3, 3], start=[1, 1]), "flags": spaces.MultiBinary(2)}
)


def _bandit_reward(context: int, action: dict[str, Any]) -> float:
    """One point per element that matches the context: the optimum is 4, random play 5/3."""
    target_pick = [1 + (context + i) % 3 for i in range(2)]
    target_flags = [context, 1 - context]
    return float(
        sum(int(a == b) for a, b in zip(action["pick"], target_pick, strict=True))
        + sum(int(a == b) for a, b in zip(action["flags"], target_flags, strict=True))
    )


def test_ppo_learns_a_contextual_bandit_with_dict_actions() -> None:
    """MultiDiscrete and MultiBinary parts learned together, from a Discrete observation."""
    obs_space = spaces.Discrete(2)
    learner = PPOLearner(obs_space, STRUCTURED_ACTIONS, _config(train_batch_size=128, lr=1e-2))
    rng = np.random.default_rng(0)
    recent: list[float] = []
    for update in range(40):
        package = learner.weights()
        policy = NumpyPolicy(package.spec, package.arrays, package.version, seed=update)
        fragments = []
        for k in range(128):
            context = int(rng.integers(2))
            obs = spaces.flatten(obs_space, context).astype(np.float32)
            out = policy.compute_actions(obs[None])
            env = actions_to_space(STRUCTURED_ACTIONS, policy.to_env_actions(out.actions))[0]
            assert STRUCTURED_ACTIONS.contains(env)
            reward = _bandit_reward(context, env)
            recent.append(reward)
            fragments.append(
                Fragment(
                    episode_id=f"u{update}-{k}",
                    agent_id="agent0",
                    policy_id="default",
                    obs=np.stack([obs, obs]),
                    actions=out.actions,
                    rewards=np.array([reward], np.float32),
                    behaviour_logp=out.logp,
                    policy_chosen=np.ones(1, bool),
                    weights_version=np.full(1, package.version, np.int64),
                    terminated=True,
                    truncated=False,
                )
            )
        learner.ingest(fragments)
        learner.update()
        if np.mean(recent[-256:]) >= 3.6:
            break
    assert np.mean(recent[-256:]) >= 3.6, np.mean(recent[-256:])


def test_an_update_gives_up_the_cpu_after_each_minibatch(monkeypatch: pytest.MonkeyPatch) -> None:
    """A waiting process (the serving one) gets a core between gradient steps, not per slice."""
    yields: list[int] = []
    monkeypatch.setattr(common, "_SCHED_YIELD", lambda: yields.append(1))
    learner = PPOLearner(OBS_SPACE, DISCRETE, _config(minibatch_size=16, num_epochs=3))
    learner.ingest(collect(learner, 64))
    learner.update()
    assert len(yields) == 3 * 4
