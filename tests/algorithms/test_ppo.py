"""PPO: the loss functions by hand, and the learner on fragments from a tiny environment."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from gymnasium import spaces

from rlserve.algorithms.ppo import PPOConfig, PPOLearner, clipped_policy_loss, value_loss
from rlserve.episodes import EpisodeTable
from rlserve.errors import ConfigError
from rlserve.policy import NumpyPolicy
from rlserve.samples import Fragment

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
    ],
    ids=str,
)
def test_config_rejects_bad_values(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        PPOConfig(**kwargs)


# -- learner on a tiny environment -----------------------------------------------------------


def _config(**overrides: Any) -> PPOConfig:
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
    return PPOConfig(**values)


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
        "version": 1,
    }
    # The weights moved, and the buffer was consumed.
    after = _params(learner)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert not learner.ready()


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


def test_unknown_behaviour_logp_takes_the_current_policy() -> None:
    learner = PPOLearner(OBS_SPACE, DISCRETE, _config())
    fragments = [_fragment([0] * 16, logp=float("nan")) for _ in range(3)]
    fragments.append(_fragment([0] * 16))
    learner.ingest(fragments)
    assert learner.ready()
    # The batch replaces NaN with the current policy's log-probability (first ratio 1).
    batch = learner._build_batch()
    assert not torch.isnan(batch["logp"]).any()
    with torch.no_grad():
        current, _ = learner.model.log_prob_entropy(batch["obs"], batch["actions"])
    np.testing.assert_allclose(batch["logp"][:48].numpy(), current[:48].numpy(), rtol=1e-6)
    np.testing.assert_allclose(batch["logp"][48:].numpy(), -0.7)
    # And a full update on such steps stays finite.
    learner.ingest(fragments)
    metrics = learner.update()
    _assert_metrics_finite(metrics)
    for value in learner.model.state_dict().values():
        assert torch.isfinite(value).all()


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
