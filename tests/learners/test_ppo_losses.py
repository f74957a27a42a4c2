"""PPO's minibatches cut from one gather per epoch, and an update's metrics read in one go."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlserve.learners.ppo_losses import (
    UpdateStats,
    epoch_minibatches,
    minibatch_indices,
    minibatch_sizes,
)


@pytest.mark.parametrize(("size", "minibatch"), [(64, 16), (81, 16), (79, 16), (9, 16), (1, 4)])
def test_minibatch_sizes_are_the_equal_split_of_tensor_split(size: int, minibatch: int) -> None:
    parts = torch.tensor_split(torch.arange(size), max(1, -(-size // minibatch)))
    assert minibatch_sizes(size, minibatch) == [len(p) for p in parts]


@pytest.mark.parametrize(("size", "minibatch"), [(64, 16), (81, 16), (5, 2)])
def test_epoch_minibatches_are_the_rows_the_indices_name(size: int, minibatch: int) -> None:
    rng = np.random.default_rng(0)
    columns = {
        "obs": torch.as_tensor(rng.normal(size=(size, 3)).astype(np.float32)),
        "actions": torch.as_tensor(rng.integers(0, 4, size)),
        "policy": torch.as_tensor(rng.random(size) < 0.5),
    }
    by_index, by_epoch = torch.Generator(), torch.Generator()
    by_index.manual_seed(3)
    by_epoch.manual_seed(3)
    for _ in range(3):  # each epoch draws its own order, from the same stream
        indices = minibatch_indices(size, minibatch, by_index)
        parts = list(epoch_minibatches(columns, minibatch, by_epoch))
        assert len(parts) == len(indices)
        for idx, part in zip(indices, parts, strict=True):
            assert set(part) == set(columns)
            for name, column in columns.items():
                assert torch.equal(part[name], column[idx])


def _reference(
    minibatches: list[tuple[float, float, float, torch.Tensor | None, float | None]], clip: float
) -> dict[str, float]:
    """The metrics as read one minibatch at a time: the mean of each minibatch's value."""
    out = {
        "policy_loss": float(np.mean([m[0] for m in minibatches])),
        "value_loss": float(np.mean([m[1] for m in minibatches])),
        "entropy": float(np.mean([m[2] for m in minibatches])),
    }
    ratios = [m[3] for m in minibatches if m[3] is not None]
    if ratios:
        out["approx_kl"] = float(np.mean([float(((r - 1) - r.log()).mean()) for r in ratios]))
        clipped = [float(((r - 1).abs() > clip).float().mean()) for r in ratios]
        out["clip_frac"] = float(np.mean(clipped))
    bc = [m[4] for m in minibatches if m[4] is not None]
    if bc:
        out["bc_loss"] = float(np.mean(bc))
    return out


def test_update_stats_are_the_means_of_each_minibatchs_metrics() -> None:
    rng = np.random.default_rng(1)
    clip = 0.2
    minibatches: list[tuple[float, float, float, torch.Tensor | None, float | None]] = []
    stats = UpdateStats(clip)
    for i, size in enumerate([14, 13, 13, 0, 7]):  # unequal sizes; one without ratios
        values = rng.uniform(0.6, 1.4, size)
        ratio = torch.as_tensor(values, dtype=torch.float32) if size else None
        bc = float(rng.normal()) if i % 2 else None
        losses = [float(x) for x in rng.normal(size=3).astype(np.float32)]
        minibatches.append((*losses, ratio, bc))
        loss = torch.tensor(losses, requires_grad=True)
        stats.add(loss[0], loss[1], loss[2], ratio, None if bc is None else torch.tensor(bc))
    assert stats.applied == 5
    expected = _reference(minibatches, clip)
    got = stats.means()
    assert list(got) == list(expected)
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key
    last = minibatches[-1][3]
    assert last is not None
    kl = float(((last - 1) - last.log()).mean())
    assert stats.last_approx_kl() == pytest.approx(kl, rel=1e-6)


def test_update_stats_without_minibatches_or_ratios() -> None:
    stats = UpdateStats(0.2)
    assert stats.means() == {} and stats.last_approx_kl() is None
    stats.add(torch.tensor(1.0), torch.tensor(2.0), torch.tensor(3.0), None, None)
    assert stats.means() == {"policy_loss": 1.0, "value_loss": 2.0, "entropy": 3.0}
    assert stats.last_approx_kl() is None
