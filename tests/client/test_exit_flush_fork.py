"""A forked child never flushes (or closes) the clients it copied from its parent at its exit."""

from __future__ import annotations

import os

import pytest

from rlserve.client import exit_flush


class _Engine:
    def __init__(self, report: int) -> None:
        self.report = report

    def close_at_exit(self, timeout: float) -> None:
        os.write(self.report, b"closed")


@pytest.mark.timeout(30)
# The child runs one function and _exits; Python 3.12+ warns about any fork with threads around.
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_forked_child_leaves_its_parents_clients_alone() -> None:
    read_end, write_end = os.pipe()
    engine = _Engine(write_end)
    exit_flush.track_unclosed(engine)
    try:
        pid = os.fork()
        if pid == 0:  # the child: what its interpreter's exit would run
            try:
                exit_flush._close_open()
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        os.close(write_end)
        assert os.read(read_end, 100) == b""  # the child closed nothing
    finally:
        exit_flush.forget_closed(engine)
        os.close(read_end)
