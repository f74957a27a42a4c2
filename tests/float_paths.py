"""Comparing what two computation paths (numpy, torch, ONNX Runtime) make of the same inputs.

float32 results differ in their last digits between such paths, and between CPUs and BLAS
kernels for one path, so a comparison across paths needs a tolerance. Values that are only copied
(a codec, a checkpoint, published weights) and a seeded computation repeated on one path in one
process stay exact.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def assert_same_choices(got: Any, want: Any, values: Any, tol: float) -> None:
    """Each row's choice ``got`` is ``want``, but where the two tie within ``tol``.

    ``values`` are one path's ``[N, K]`` logits or action values and ``got``/``want`` choice
    indices. Two paths that agree on the values to ``tol / 2`` may break a near-tie (two values
    closer than their rounding differences) either way; every other row must choose the same.
    """
    got, want = np.asarray(got), np.asarray(want)
    values = np.asarray(values, dtype=np.float64)
    assert got.shape == want.shape == values.shape[:1]
    rows = np.flatnonzero(got != want)
    gaps = np.abs(values[rows, got[rows]] - values[rows, want[rows]])
    assert (gaps <= tol).all(), (
        f"rows {rows[gaps > tol].tolist()} choose {got[rows][gaps > tol].tolist()} instead of "
        f"{want[rows][gaps > tol].tolist()}, whose values differ by {gaps[gaps > tol].tolist()}"
    )
