"""SACLearner: the training schedule, exclusions, checkpoints and a small learning problem."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from gymnasium import spaces

from rlserve.errors import ConfigError, UnsupportedSpaceError
from rlserve.learners.registry import algorithm
from rlserve.learners.sac import SACLearner
from rlserve.learners.sac_config import SACSettings
from rlserve.policy import NumpyPolicy
from rlserve.protocol.fragment import Fragment

METRICS_DOC = Path(__file__).parents[2] / "docs" / "metrics.md"
OBS = spaces.Box(-np.inf, np.inf, (2,), np.float32)
WIDE = spaces.Box(-100.0, 100.0, (1,), np.float32)


def _settings(**overrides: object) -> SACSettings:
    values: dict[str, object] = {
        "hidden": (16, 16),
        "batch_size": 8,
        "learning_starts": 20,
        "train_every": 10,
        "buffer_size": 1000,
    }
    values.update(overrides)
    return SACSettings(**values)  # type: ignore[arg-type]


def _fragment(steps: int, seed: int = 0, terminated: bool = False) -> Fragment:
    rng = np.random.default_rng(seed)
    return Fragment(
        episode_id=f"e{seed}",
        agent_id="agent0",
        policy_id="default",
        obs=rng.normal(size=(steps + 1, 2)).astype(np.float32),
        actions=rng.uniform(-100, 100, (steps, 1)).astype(np.float32),
        rewards=rng.normal(size=steps).astype(np.float32),
        behaviour_logp=np.zeros(steps, np.float32),
        policy_chosen=np.ones(steps, bool),
        weights_version=np.zeros(steps, np.int64),
        terminated=terminated,
        truncated=False,
    )


def test_sac_is_registered_off_policy_and_refuses_discrete_actions() -> None:
    entry = algorithm("sac")
    assert entry.off_policy and entry.settings is SACSettings
    assert isinstance(entry.make_learner(OBS, WIDE, _settings()), SACLearner)
    with pytest.raises(UnsupportedSpaceError, match="learn these spaces: ppo, dqn"):
        entry.make_learner(OBS, spaces.Discrete(3), _settings())


def test_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match="batch_size 64 is larger than buffer_size 10"):
        SACSettings(batch_size=64, buffer_size=10)
    with pytest.raises(ConfigError, match="tau must be in"):
        SACSettings(tau=0.0)
    with pytest.raises(ConfigError, match="updates_per_step must be positive"):
        SACSettings(updates_per_step=0.0)
    # A warm-up the buffer cannot hold never ends: refused, with both values and the fix.
    with pytest.raises(
        ConfigError,
        match=r"learning_starts 2000 is larger than buffer_size 1000.*lower learning_starts "
        "or raise buffer_size",
    ):
        SACSettings(learning_starts=2000, buffer_size=1000)
    assert SACSettings(learning_starts=1000, buffer_size=1000).learning_starts == 1000
    assert SACSettings(train_every=10, updates_per_step=0.5).updates_per_hand_off == 5


def test_the_critics_take_their_own_learning_rate() -> None:
    default = SACLearner(OBS, WIDE, _settings())
    assert {g["lr"] for g in default.critic_optimizer.param_groups} == {1e-3}
    assert {g["lr"] for g in default.actor_optimizer.param_groups} == {3e-4}
    split = SACLearner(OBS, WIDE, _settings(lr=5e-4, critic_lr=2e-3))
    assert {g["lr"] for g in split.critic_optimizer.param_groups} == {2e-3}
    assert {g["lr"] for g in split.actor_optimizer.param_groups} == {5e-4}
    assert {g["lr"] for g in split.alpha_optimizer.param_groups} == {5e-4}
    with pytest.raises(ConfigError, match=r"critic_lr must be a finite number of 0\.0 or more"):
        SACSettings(critic_lr=float("nan"))


def test_warm_up_then_one_update_per_hand_off() -> None:
    learner = SACLearner(OBS, WIDE, _settings())
    assert learner.sample_steps == 10
    learner.ingest([_fragment(15)])
    assert not learner.ready() and learner.owed_steps == 0  # warming up (20 steps)
    assert learner.buffered_steps == 0  # stored in the replay buffer at once
    learner.ingest([_fragment(15, seed=1)])
    assert learner.ready()  # 30 steps in: the 10 past the warm-up owe 10 gradient steps
    metrics = learner.update()
    assert metrics["learner/gradient_steps"] == 10
    assert metrics["learner/replay_size"] == 30
    assert learner.version == 1 and learner.owed_steps == 0
    assert not learner.ready()
    for name in ("critic_loss", "actor_loss", "alpha_loss", "entropy", "q_mean", "alpha"):
        assert np.isfinite(metrics[f"learner/{name}"])


def test_a_backlog_is_paid_in_updates_of_one_hand_off() -> None:
    learner = SACLearner(OBS, WIDE, _settings(learning_starts=0, updates_per_step=2.0))
    learner.ingest([_fragment(25)])  # owes 50 gradient steps; one update pays 20
    paid = []
    while learner.ready():
        paid.append(learner.update()["learner/gradient_steps"])
    assert paid == [20, 40, 50]
    assert learner.version == 3


def test_broken_fragments_are_excluded_and_counted() -> None:
    learner = SACLearner(OBS, WIDE, _settings())
    nan_obs = _fragment(5)
    nan_obs.obs[2, 0] = np.nan
    wrong_actions = _fragment(5, seed=1)
    wrong_actions.actions = np.zeros((5, 3), np.float32)
    huge = _fragment(5, seed=2)
    huge.rewards[0] = 1e12
    learner.ingest([nan_obs, wrong_actions, huge, _fragment(4, seed=3)])
    counters = learner.counters()
    assert counters["fragments_excluded_invalid"] == 3
    assert counters["steps_excluded_invalid"] == 15
    assert len(learner.replay) == 4


def test_ingest_joins_the_n_step_sums_of_an_episodes_fragments() -> None:
    learner = SACLearner(OBS, WIDE, _settings(gamma=0.5, n_step=3))
    whole = _fragment(6, terminated=True)
    first, second = _fragment(4), _fragment(2, terminated=True)
    first.obs, first.actions, first.rewards = whole.obs[:5], whole.actions[:4], whole.rewards[:4]
    second.obs, second.actions, second.rewards = whole.obs[4:], whole.actions[4:], whole.rewards[4:]
    learner.ingest([first, second])
    joined = learner.replay.state()
    # As if the episode had come in one piece: 3-step sums right up to its terminal state.
    one_piece = SACLearner(OBS, WIDE, _settings(gamma=0.5, n_step=3))
    one_piece.ingest([whole])
    for name in ("rewards", "next_obs", "discounts"):
        np.testing.assert_allclose(joined[name], one_piece.replay.state()[name], rtol=1e-6)


def test_n_step_sums_stop_before_a_logged_action() -> None:
    learner = SACLearner(OBS, WIDE, _settings(gamma=0.5, n_step=3))
    fragment = _fragment(4)
    fragment.policy_chosen[1] = False
    learner.ingest([fragment])
    state = learner.replay.state()
    r = fragment.rewards.astype(np.float64)
    np.testing.assert_allclose(
        state["rewards"], [r[0], r[1] + 0.5 * r[2] + 0.25 * r[3], r[2] + 0.5 * r[3], r[3]]
    )
    np.testing.assert_array_equal(state["next_obs"], fragment.obs[[1, 4, 4, 4]])
    np.testing.assert_allclose(state["discounts"], [0.5, 0.125, 0.25, 0.5])


def test_actions_are_stored_in_squashed_units() -> None:
    learner = SACLearner(OBS, WIDE, _settings())
    fragment = _fragment(3)
    fragment.actions[:, 0] = [-100.0, 50.0, 250.0]  # the last beyond the bound: clipped
    learner.ingest([fragment])
    np.testing.assert_allclose(learner.replay.state()["actions"][:, 0], [-1.0, 0.5, 1.0])


def test_published_weights_act_within_the_box() -> None:
    learner = SACLearner(OBS, WIDE, _settings())
    package = learner.weights()
    assert package.spec.distribution == "squashed_gaussian"
    policy = NumpyPolicy(package.spec, package.arrays, package.version, seed=0)
    out = policy.compute_actions(np.zeros((50, 2), np.float32))
    assert out.actions.shape == (50, 1)
    assert (np.abs(out.actions) <= 100.0).all() and out.actions.std() > 10.0


def test_a_checkpoint_resumes_the_same_training(tmp_path: Path) -> None:
    first = SACLearner(OBS, WIDE, _settings(seed=3, checkpoint_replay=True))
    first.ingest([_fragment(30)])
    first.update()
    path = tmp_path / "sac.pt"
    first.save(path, {"note": "x"})
    second = SACLearner(OBS, WIDE, _settings(seed=99, checkpoint_replay=True))
    assert second.load(path) == {"note": "x"}
    assert second.counters() == first.counters() and len(second.replay) == 30
    for learner in (first, second):
        learner.ingest([_fragment(10, seed=7)])
        learner.update()
    for a, b in zip(first.actor.parameters(), second.actor.parameters(), strict=True):
        torch.testing.assert_close(a, b)
    assert first.alpha == second.alpha


def test_a_checkpoints_replay_of_other_n_step_sums_is_left_out_and_the_rest_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first = SACLearner(OBS, WIDE, _settings(checkpoint_replay=True))
    first.ingest([_fragment(30)])
    first.update()
    path = tmp_path / "sac.pt"
    first.save(path, {"note": "x"})
    other = SACLearner(OBS, WIDE, _settings(checkpoint_replay=True, n_step=3, seed=9))
    with caplog.at_level(logging.WARNING, logger="rlserve.learner"):
        assert other.load(path) == {"note": "x"}
    assert "replay buffer not restored" in caplog.text and "keep n_step and gamma" in caplog.text
    assert len(other.replay) == 0 and other.counters() == first.counters()
    for a, b in zip(first.actor.parameters(), other.actor.parameters(), strict=True):
        torch.testing.assert_close(a, b)
    for a, b in zip(first.critic.parameters(), other.critic.parameters(), strict=True):
        torch.testing.assert_close(a, b)


def _generators_on_their_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``torch.randn`` refuse a generator of another device, as its CUDA kernels do.

    Its CPU and meta kernels do not check: without a GPU, this is how a draw on the wrong device
    shows (``Expected a 'cuda' device type for generator but found 'cpu'`` on CUDA).
    """
    randn = torch.randn

    def strict(*args: Any, generator: Any = None, device: Any = None, **kwargs: Any) -> Any:
        drawn_on = torch.device("cpu" if device is None else device)
        if generator is not None and generator.device.type != drawn_on.type:
            raise RuntimeError(
                f"Expected a '{drawn_on.type}' device type for generator but found "
                f"'{generator.device.type}'"
            )
        return randn(*args, generator=generator, device=drawn_on, **kwargs)

    monkeypatch.setattr(torch, "randn", strict)


def test_the_learners_generator_draws_the_noise_of_an_actor_on_another_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The learner's generator is a CPU one; its actor may live on CUDA (device auto)."""
    _generators_on_their_device(monkeypatch)
    learner = SACLearner(OBS, WIDE, _settings(device="cpu"))
    generator = learner._generator
    assert generator.device.type == "cpu"
    actor = learner.actor.to("meta")  # any device but the generator's
    actions, logp = actor.sample(torch.zeros((4, 2), device="meta"), generator)
    assert actions.device.type == logp.device.type == "meta"
    assert actions.shape == (4, 1) and logp.shape == (4,)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_trains_and_resumes_on_cuda(tmp_path: Path) -> None:
    """A CUDA learner trains, and its checkpoint resumes on CUDA and on the CPU alike."""
    learner = SACLearner(OBS, WIDE, _settings(device="cuda", checkpoint_replay=True))
    assert next(learner.actor.parameters()).device.type == "cuda"
    learner.ingest([_fragment(30)])
    metrics = learner.update()
    assert learner.version == 1 and np.isfinite(metrics["learner/critic_loss"])
    path = tmp_path / "sac.pt"
    learner.save(path, {})
    for device in ("cuda", "cpu"):
        twin = SACLearner(OBS, WIDE, _settings(device=device, checkpoint_replay=True, seed=5))
        twin.load(path)
        twin.ingest([_fragment(10, seed=7)])
        assert np.isfinite(twin.update()["learner/critic_loss"]) and twin.version == 2


def test_initialise_from_takes_weights_only_and_refuses_other_shapes(tmp_path: Path) -> None:
    source = SACLearner(OBS, WIDE, _settings(seed=1))
    source.ingest([_fragment(30)])
    source.update()
    path = tmp_path / "sac.pt"
    source.save(path, {})
    fresh = SACLearner(OBS, WIDE, _settings(seed=2))
    fresh.initialise_from(path)
    assert fresh.version == 0 and len(fresh.replay) == 0
    for a, b in zip(fresh.actor.parameters(), source.actor.parameters(), strict=True):
        torch.testing.assert_close(a, b)
    other = SACLearner(OBS, WIDE, _settings(hidden=(8,)))
    with pytest.raises(ValueError, match="holds no SAC model of this policy's shape"):
        other.initialise_from(path)


def test_learns_the_best_action_of_a_wide_box() -> None:
    """A one-step task whose best action is 60 in Box(-100, 100): the rescaling lets SAC find
    it as readily as 0.6 in Box(-1, 1)."""
    learner = SACLearner(
        OBS,
        WIDE,
        _settings(batch_size=64, learning_starts=64, train_every=64, lr=3e-3, gamma=0.0),
    )
    rng = np.random.default_rng(0)
    obs = np.ones((1, 2), np.float32)
    for step in range(40):
        package = learner.weights()
        policy = NumpyPolicy(package.spec, package.arrays, package.version, seed=step)
        fragments = []
        for i in range(64):
            out = policy.compute_actions(obs)
            reward = -(((float(out.actions[0, 0]) - 60.0) / 100.0) ** 2)
            fragment = _fragment(1, seed=int(rng.integers(1 << 30)), terminated=True)
            fragment.obs[:] = 1.0
            fragment.actions = out.actions
            fragment.rewards[:] = reward
            fragment.episode_id = f"{step}-{i}"
            fragments.append(fragment)
        learner.ingest(fragments)
        while learner.ready():
            learner.update()
    package = learner.weights()
    greedy = NumpyPolicy(package.spec, package.arrays, package.version).compute_actions(
        obs, explore=False
    )
    assert greedy.actions[0, 0] == pytest.approx(60.0, abs=10.0)


def test_every_metric_of_an_update_is_documented() -> None:
    text = METRICS_DOC.read_text()
    ppo = text.partition("\n### DQN's learner")[0]
    sac = text.partition("\n### SAC's learner")[2].partition("\n## ")[0]
    row = re.compile(r"^\| `(learner/[a-z_0-9]+)` \|", re.M)
    item = re.compile(r"^- `(learner/[a-z_0-9]+)`:", re.M)
    documented = set(row.findall(ppo)) | set(item.findall(sac))
    learner = SACLearner(OBS, WIDE, _settings())
    learner.ingest([_fragment(30)])
    metrics = learner.update()
    assert set(metrics) <= documented, set(metrics) - documented
    assert set(item.findall(sac)) <= set(metrics)  # and the SAC list holds no stray name


def test_non_finite_losses_skip_their_gradient_steps_and_keep_the_version() -> None:
    learner = SACLearner(OBS, WIDE, _settings(learning_starts=0, max_abs_input=3e38))
    fragment = _fragment(10)
    fragment.rewards[:] = 2e38  # finite in float32; its squared error is not
    learner.ingest([fragment])
    before = [p.detach().clone() for p in learner.critic.parameters()]
    metrics = learner.update()
    assert metrics["learner/gradient_steps_skipped_nonfinite"] == 10
    assert metrics["learner/updates_skipped_nonfinite"] == 1
    assert learner.version == 0 and metrics["learner/gradient_steps"] == 0
    for a, b in zip(before, learner.critic.parameters(), strict=True):
        torch.testing.assert_close(a, b)
