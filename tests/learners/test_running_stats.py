"""Running statistics: Chan et al.'s merge against numpy, and the discounted-return scaler."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rlserve.learners import running_stats
from rlserve.learners.running_stats import (
    NORM_EPSILON,
    ReturnScaler,
    RunningMeanStd,
    scale_rewards,
)


def test_two_batches_merge_to_the_statistics_of_both_by_hand() -> None:
    stats = RunningMeanStd(())
    stats.update(np.array([1.0, 2.0, 3.0]))
    assert (stats.count, float(stats.mean), float(stats.var)) == (3.0, 2.0, 2.0 / 3.0)
    stats.update(np.array([4.0, 5.0]))
    # 1..5: mean 3, population variance (4 + 1 + 0 + 1 + 4) / 5 = 2.
    assert stats.count == 5.0
    assert float(stats.mean) == pytest.approx(3.0, abs=1e-15)
    assert float(stats.var) == pytest.approx(2.0, abs=1e-15)
    assert float(stats.std()) == pytest.approx(math.sqrt(2.0 + NORM_EPSILON), abs=1e-15)


def test_before_any_data_the_statistics_are_the_identity() -> None:
    stats = RunningMeanStd((3,))
    assert stats.count == 0
    np.testing.assert_array_equal(stats.mean, np.zeros(3))
    np.testing.assert_array_equal(stats.var, np.ones(3))
    stats.update(np.zeros((0, 3)))  # an empty batch changes nothing
    assert stats.count == 0


def test_many_uneven_batches_match_numpy_on_the_concatenation() -> None:
    """Batches of 0, 1 and many rows, far from zero: no loss of precision to the offset."""
    rng = np.random.default_rng(0)
    sizes = [0, 1, 7, 1, 300, 2, 0, 64, 1000, 3]
    offset = np.array([1e6, -3e5, 0.0])
    batches = [rng.normal(0.0, [1e-2, 5.0, 1.0], (n, 3)) + offset for n in sizes]
    stats = RunningMeanStd((3,))
    for batch in batches:
        stats.update(batch)
    everything = np.concatenate(batches)
    assert stats.count == everything.shape[0]
    np.testing.assert_allclose(stats.mean, everything.mean(axis=0), rtol=1e-13)
    np.testing.assert_allclose(stats.var, everything.var(axis=0), rtol=1e-7)


def test_merge_of_two_sets_equals_one_update_with_both() -> None:
    rng = np.random.default_rng(1)
    a, b = rng.normal(2.0, 3.0, (50, 2)), rng.normal(-1.0, 0.5, (20, 2))
    merged = RunningMeanStd((2,))
    merged.update(a)
    merged.merge(float(len(b)), b.mean(axis=0), b.var(axis=0))
    both = RunningMeanStd((2,))
    both.update(np.concatenate([a, b]))
    np.testing.assert_allclose(merged.mean, both.mean, rtol=1e-14)
    np.testing.assert_allclose(merged.var, both.var, rtol=1e-12)


def test_state_round_trip_and_refusals() -> None:
    stats = RunningMeanStd((2,))
    stats.update(np.array([[1.0, 10.0], [3.0, 30.0]]))
    state = stats.state()
    assert {k: v.dtype for k, v in state.items()} == dict.fromkeys(state, np.float64)
    copy = RunningMeanStd((2,))
    copy.load_state(state)
    assert (copy.count, copy.mean.tolist(), copy.var.tolist()) == (2.0, [2.0, 20.0], [1.0, 100.0])
    with pytest.raises(ValueError, match="expected"):
        RunningMeanStd((3,)).load_state(state)
    for key, bad in (("var", np.array([1.0, -1.0])), ("mean", np.array([np.nan, 0.0]))):
        with pytest.raises(ValueError, match="non-finite mean or a negative variance"):
            copy.load_state({**state, key: bad})
    with pytest.raises(ValueError, match="not a count"):
        copy.load_state({**state, "count": np.array(-1.0)})
    with pytest.raises(ValueError, match="malformed"):
        copy.load_state({"mean": state["mean"]})


def test_update_refuses_non_finite_values_and_wrong_shapes() -> None:
    stats = RunningMeanStd((2,))
    with pytest.raises(ValueError, match="finite"):
        stats.update(np.array([[1.0, np.inf]]))
    with pytest.raises(ValueError, match="shape"):
        stats.update(np.zeros((4, 3)))
    assert stats.count == 0


def test_return_scaler_follows_each_episode_across_fragments_by_hand() -> None:
    scaler = ReturnScaler(gamma=0.5, clip=10.0)
    scaler.observe(("e1", "a"), np.array([1.0, 1.0]), episode_ended=False)
    scaler.observe(("e2", "a"), np.array([2.0]), episode_ended=True)
    # e1 goes on from its return 1.5: 0.5 * 1.5 + 1 = 1.75, then the episode ends.
    scaler.observe(("e1", "a"), np.array([1.0]), episode_ended=True)
    # A new fragment of e1 (say its id came back) starts again from 0.
    scaler.observe(("e1", "a"), np.array([4.0]), episode_ended=True)
    returns = np.array([1.0, 1.5, 2.0, 1.75, 4.0])
    assert scaler.stats.count == 5
    assert float(scaler.stats.mean) == pytest.approx(returns.mean(), abs=1e-14)
    assert float(scaler.stats.var) == pytest.approx(returns.var(), abs=1e-14)
    assert scaler.scale() == pytest.approx(math.sqrt(returns.var() + NORM_EPSILON), abs=1e-14)


def test_return_scaler_forgets_the_oldest_open_episode_past_its_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(running_stats, "MAX_TRACKED_EPISODES", 2)
    scaler = ReturnScaler(gamma=1.0, clip=10.0)
    for name in ("a", "b", "c"):
        scaler.observe((name, "x"), np.array([1.0]), episode_ended=False)
    scaler.observe(("a", "x"), np.array([1.0]), episode_ended=True)  # forgotten: starts at 1
    scaler.observe(("c", "x"), np.array([1.0]), episode_ended=True)  # kept: goes on to 2
    np.testing.assert_allclose(scaler.stats.mean, np.mean([1, 1, 1, 1, 2]))


def test_scale_rewards_divides_then_clips() -> None:
    out = scale_rewards(np.array([1.0, -30.0, 50.0], np.float32), 2.0, 10.0)
    assert out.dtype == np.float32
    assert out.tolist() == [0.5, -10.0, 10.0]
