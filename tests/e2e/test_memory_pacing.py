"""A server with a recurrent PPO policy holds its clients near on-policy by default.

Further behind, every step a recurrent learner trained on came from weights a version old and
remote StatelessCartPole fell back after reaching 350 (docs/benchmarks.md, "Remote memory");
the default bound is then 256 env steps, and ``--max-learner-lag-steps`` still decides.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rlserve.server.pacing import RECURRENT_LAG_STEPS

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

CONFIG = """\
[ppo]
use_lstm = true
lstm_cell_size = 8
train_batch_size = 64
minibatch_size = 32
hidden = [16]
device = "cpu"
"""


@pytest.mark.parametrize(
    ("memory", "flags", "bound"),
    [
        (True, (), RECURRENT_LAG_STEPS),
        (True, ("--max-learner-lag-steps", "0"), 0),
        (False, (), 0),  # PPO without memory: never held
    ],
)
def test_the_lag_bound_of_a_recurrent_policy(
    launch_server: Any, tmp_path: Path, memory: bool, flags: tuple[str, ...], bound: int
) -> None:
    config = tmp_path / "memory.toml"
    config.write_text(CONFIG if memory else CONFIG.replace("use_lstm = true", "use_lstm = false"))
    server = launch_server(*flags, "--config", str(config))
    assert server.metrics()["samples/learner_lag_bound"] == bound
