"""One BLAS thread for the numpy forward passes' large products, whatever the process's default.

numpy's OpenBLAS hands each matrix product above a small size to a pool of one thread per core.
The conv encoders' products (a few hundred rows by a few hundred columns per frame) are just big
enough to be handed over and far too small to gain from it: on a busy machine each hand-over
waits for a worker thread to be scheduled, and a frame took 11-45 ms instead of 0.37 ms on one
thread (docs/benchmarks.md, "Image throughput"). The pool's size can only be set before numpy
loads (``OPENBLAS_NUM_THREADS``) or, afterwards, through the BLAS library's own entry point,
which threadpoolctl finds among the loaded libraries. So :func:`one_blas_thread` limits the pool
for the duration of one conv forward pass (or one product of a layer too large to split into
row blocks, :mod:`rlserve.policy.matmul`) with threadpoolctl, leaving the rest of the process (a
simulator's own numpy work) as it was; without threadpoolctl (the client's optional extra
``rlserve[images]``) it warns once and names the fix.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Callable
from typing import Any

_limit: Callable[[], contextlib.AbstractContextManager[Any]] | None = None


def _make_limit() -> Callable[[], contextlib.AbstractContextManager[Any]]:
    # OpenBLAS sizes its pool from OPENBLAS_NUM_THREADS, or else OMP_NUM_THREADS, at load.
    sized = os.environ.get("OPENBLAS_NUM_THREADS", os.environ.get("OMP_NUM_THREADS"))
    if sized == "1":
        return contextlib.nullcontext
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:
        warnings.warn(
            "rlserve: the conv policy's numpy forward pass runs on numpy's default BLAS "
            "threads, which makes it 30-100x slower on a busy machine; install threadpoolctl "
            "(pip install -e '.[images]' in the checkout, or add [images] to the wheel) or set "
            "OPENBLAS_NUM_THREADS=1 before starting Python",
            RuntimeWarning,
            stacklevel=3,
        )
        return contextlib.nullcontext
    controller = ThreadpoolController()
    return lambda: controller.limit(limits=1, user_api="blas")


def one_blas_thread() -> contextlib.AbstractContextManager[Any]:
    """A context in which numpy's BLAS runs matrix products on the calling thread only.

    The controller is found once per process (threadpoolctl scans the loaded libraries); each
    context then costs a few microseconds, against a conv forward pass's hundreds.
    """
    global _limit
    if _limit is None:
        _limit = _make_limit()
    return _limit()
