"""``learner_niceness``: the learner process can yield the CPU to serving (a higher niceness)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from e2e_support import learner_pid

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(180),
    pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc"),
]


def _niceness(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[16])  # the 19th field of stat; the first two are before the split


@pytest.mark.parametrize(("flags", "added"), [((), 0), (("--learner-niceness", "5"), 5)])
def test_the_learner_runs_at_the_configured_niceness_above_the_server(
    launch_server: Any, flags: tuple[str, ...], added: int
) -> None:
    server = launch_server(*flags)
    server.wait_for_weights(0)  # the learner has read its setup and published
    base = _niceness(server.process.pid)
    expected = min(19, base + added)
    assert _niceness(learner_pid(server)) == expected


def test_a_niceness_out_of_range_is_refused_with_the_range(run_rlserve: Any) -> None:
    done = run_rlserve("serve", "--spaces-from", "CartPole-v1", "--learner-niceness", "25")
    assert done.returncode != 0
    assert "learner-niceness must be from 0 (share the CPU equally) to 19" in done.stderr
