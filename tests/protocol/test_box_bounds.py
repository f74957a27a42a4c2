"""Unit tests of a Box's prepared bounds and the per-step test against them."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium import spaces

from rlserve.protocol.box_bounds import SMALL_BOX_VALUES, finite_bounds, fits_float32_box

SMALL = spaces.Box(
    np.array([-1.0, -np.inf], np.float32), np.array([1.0, np.inf], np.float32), dtype=np.float32
)
LARGE = spaces.Box(-1.0, 1.0, (SMALL_BOX_VALUES + 1,), np.float32)


def test_finite_bounds_replace_infinities_with_the_dtype_extremes() -> None:
    low, high = finite_bounds(SMALL)
    big = np.finfo(np.float32).max
    np.testing.assert_array_equal(low, np.array([-1.0, -big], np.float32))
    np.testing.assert_array_equal(high, np.array([1.0, big], np.float32))
    assert low.dtype == np.float32 and high.dtype == np.float32


@pytest.mark.parametrize("space", [SMALL, LARGE], ids=["python-floats", "numpy"])
def test_a_float32_value_inside_the_bounds_fits(space: spaces.Box) -> None:
    value = np.zeros(space.shape, np.float32)
    value[0] = 1.0  # on the bound
    assert fits_float32_box(space, value)


@pytest.mark.parametrize("space", [SMALL, LARGE], ids=["python-floats", "numpy"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf, np.nextafter(np.float32(1), 2)])
def test_nan_infinity_and_a_value_past_a_bound_do_not_fit(space: spaces.Box, bad: float) -> None:
    value = np.zeros(space.shape, np.float32)
    value[0] = bad
    assert not fits_float32_box(space, value)


def test_another_dtype_or_shape_or_a_box_not_float32_leaves_it_to_the_full_check() -> None:
    assert not fits_float32_box(SMALL, np.zeros(2, np.float64))
    assert not fits_float32_box(SMALL, np.zeros(2, np.dtype(">f4")))  # big-endian float32
    assert not fits_float32_box(SMALL, np.zeros((1, 2), np.float32))
    assert not fits_float32_box(spaces.Box(0, 255, (2,), np.uint8), np.zeros(2, np.float32))
