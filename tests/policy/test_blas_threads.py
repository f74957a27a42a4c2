"""The conv forward pass runs on one BLAS thread (rlserve.policy.blas_threads)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

threadpoolctl = pytest.importorskip("threadpoolctl")


def _blas_threads() -> list[int]:
    return [
        info["num_threads"]
        for info in threadpoolctl.threadpool_info()
        if info["user_api"] == "blas"
    ]


def _run(code: str, **environment: str) -> subprocess.CompletedProcess[str]:
    env = {
        k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")
    }
    env.update(environment)
    return subprocess.run(
        [sys.executable, "-W", "error::RuntimeWarning", "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_limit_holds_inside_and_is_lifted_after() -> None:
    code = (
        "import numpy, threadpoolctl\n"
        "from rlserve.policy.blas_threads import one_blas_thread\n"
        "def blas(): return [i['num_threads'] for i in threadpoolctl.threadpool_info() "
        "if i['user_api'] == 'blas']\n"
        "threadpoolctl.threadpool_limits(2, user_api='blas')\n"
        "before = blas()\n"
        "with one_blas_thread(): inside = blas()\n"
        "print(before, inside, blas())\n"
    )
    done = _run(code)
    assert done.returncode == 0, done.stderr
    before, inside, after = done.stdout.strip().split("] [")
    assert "1" in inside and set(inside.strip("[]").split(", ")) == {"1"}
    assert before.strip("[]") == after.strip("[]")


def test_a_pool_sized_by_the_environment_is_left_alone() -> None:
    code = (
        "import contextlib\n"
        "from rlserve.policy.blas_threads import one_blas_thread\n"
        "print(isinstance(one_blas_thread(), contextlib.nullcontext))\n"
    )
    done = _run(code, OPENBLAS_NUM_THREADS="1")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"


def test_without_threadpoolctl_it_warns_once_and_names_the_fix() -> None:
    code = (
        "import sys, warnings\n"
        "sys.modules['threadpoolctl'] = None\n"
        "from rlserve.policy.blas_threads import one_blas_thread\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    for _ in range(3):\n"
        "        with one_blas_thread(): pass\n"
        "print(len(caught)); print(caught[0].message)\n"
    )
    done = _run(code)
    assert done.returncode == 0, done.stderr
    count, message = done.stdout.strip().split("\n", 1)
    assert count == "1"
    assert "'.[images]'" in message and "OPENBLAS_NUM_THREADS=1" in message


def test_the_current_process_keeps_its_own_pool() -> None:
    from rlserve.policy.blas_threads import one_blas_thread

    before = _blas_threads()
    with one_blas_thread():
        pass
    assert _blas_threads() == before
