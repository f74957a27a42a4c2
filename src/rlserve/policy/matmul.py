"""Matrix products of a policy's small layers, kept on one BLAS thread.

Used by the numpy forward passes (:mod:`rlserve.policy.numpy_policy`,
:mod:`rlserve.policy.memory`).
"""

from __future__ import annotations

import numpy as np

from rlserve.policy.blas_threads import one_blas_thread

SERIAL_MATMUL_WORK = 1 << 18
"""Multiply-adds (rows x inputs x outputs) up to which a matrix product runs on one thread.

OpenBLAS (numpy's BLAS) hands a product of more than ``65536 * 4`` multiply-adds to its worker
threads. For a policy's small layers that gains nothing even on idle cores and costs a great
deal on busy ones: the worker threads spin waiting for work, and a batch waits for a thread that
the learner or another process holds (a forward pass of 256 observations through 64 x 64 layers
took 0.4-0.9 ms instead of 0.05 ms on 2 busy cores). So a large batch goes through a small layer
in row blocks that each stay under this bound; a layer too large for two rows per block (a
256-cell LSTM's 256 x 1024 recurrent weights) runs inside a one-thread limit instead
(:func:`rlserve.policy.blas_threads.one_blas_thread`: 64 rows of it took 23 ms on the BLAS pool
of 2 busy cores)."""


def serial_matmul(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``x @ w`` for ``[N, in]`` and ``[in, out]``, in row blocks the BLAS runs on one thread.

    See :data:`SERIAL_MATMUL_WORK`.
    """
    rows = x.shape[0]
    per_row = w.shape[0] * w.shape[1]
    if rows * per_row <= SERIAL_MATMUL_WORK:
        return np.asarray(x @ w)
    if 2 * per_row > SERIAL_MATMUL_WORK:
        with one_blas_thread():
            return np.asarray(x @ w)
    step = SERIAL_MATMUL_WORK // per_row
    out = np.empty((rows, w.shape[1]), dtype=np.result_type(x, w))
    for start in range(0, rows, step):
        np.matmul(x[start : start + step], w, out=out[start : start + step])
    return out
