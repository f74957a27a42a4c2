"""The comparison helper of tests/float_paths.py."""

from __future__ import annotations

import numpy as np
import pytest

from float_paths import assert_same_choices


def test_choices_may_differ_only_where_values_nearly_tie() -> None:
    values = np.array([[0.5, 0.50001, -1.0], [2.0, 0.0, 1.0]])
    assert_same_choices([1, 0], [1, 0], values, tol=1e-4)
    assert_same_choices([0, 0], [1, 0], values, tol=1e-4)  # 1e-5 apart: either will do
    with pytest.raises(AssertionError, match=r"rows \[1\] choose \[2\] instead of \[0\]"):
        assert_same_choices([1, 2], [1, 0], values, tol=1e-4)
