"""StackedBoxCheck: check_batch's result and errors, for a stacked batch of one Box."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from gymnasium import spaces

from rlserve.errors import SpaceError
from rlserve.protocol.spaces import check_batch
from rlserve.protocol.stacked_checks import StackedBoxCheck

BOX = spaces.Box(
    np.array([-1.0, -np.inf], np.float32), np.array([1.0, np.inf], np.float32), (2,), np.float32
)
GRID = spaces.Box(0.0, 1.0, (2, 2), np.float32)


def _error(fn: Any, *args: Any) -> str:
    with pytest.raises(SpaceError) as caught:
        fn(*args)
    return str(caught.value)


def test_a_valid_batch_is_returned_flat_as_check_batch_does() -> None:
    rng = np.random.default_rng(0)
    batch = rng.uniform(0.0, 1.0, (3, 2, 2)).astype(np.float32)
    got = StackedBoxCheck(GRID, 3, "observation")(batch)
    np.testing.assert_array_equal(got, check_batch(GRID, batch, 3, "observation"))
    assert got.shape == (3, 4) and got.dtype == np.float32


def test_other_dtypes_are_cast_as_check_batch_does() -> None:
    batch = np.array([[0.5, 1e30], [-1.0, 0.0]], np.float64)
    got = StackedBoxCheck(BOX, 2, "observation")(batch)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, check_batch(BOX, batch, 2, "observation"))


@pytest.mark.parametrize(
    "batch",
    [
        np.zeros((3, 2), np.float32),  # wrong count
        np.zeros((2, 3), np.float32),  # wrong shape
        np.array([[0.0, np.nan], [0.0, 0.0]], np.float32),
        np.array([[0.0, np.inf], [0.0, 0.0]], np.float32),
        np.array([[0.0, 0.0], [1.5, 0.0]], np.float32),  # above the high bound
        np.array([["a", "b"], ["c", "d"]]),
        [[0.0, 0.0], [0.0, 0.0], [0.0]],
    ],
)
def test_a_bad_batch_gives_check_batchs_error(batch: Any) -> None:
    check = StackedBoxCheck(BOX, 2, "observation")
    assert _error(check, batch) == _error(check_batch, BOX, batch, 2, "observation")


@pytest.mark.parametrize("count", [1, 8, 300])  # 300 x 64 values: bounds broadcast per row
def test_every_value_of_a_batch_is_checked_whatever_its_size(count: int) -> None:
    box = spaces.Box(-1.0, 1.0, (8, 8), np.float32)
    check = StackedBoxCheck(box, count, "observation")
    batch = np.zeros((count, 8, 8), np.float32)
    assert check(batch).shape == (count, 64)
    for bad in (np.nan, 1.5, -1.5):
        wrong = batch.copy()
        wrong[count - 1, 7, 7] = bad
        assert _error(check, wrong) == _error(check_batch, box, wrong, count, "observation")
