"""An export prints none of torch.onnx's known-harmless notes, and every other warning."""

from __future__ import annotations

import logging
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from test_export import make_run

from rlserve.algorithm.export import export_onnx
from rlserve.algorithm.export_notes import DEDUPLICATION_LOGGER, quiet_exporter

pytestmark = pytest.mark.timeout(300)


def test_a_box_policys_export_prints_no_deduplication_note(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The Gaussian's log_std is a constant output of the graph: the optimiser notes it skips it.
    box = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    run, _ = make_run(tmp_path, box, gym.spaces.Box(-2.0, 2.0, (1,), np.float32))
    with caplog.at_level(logging.WARNING):
        export_onnx(run)
    assert not [r for r in caplog.records if "Skipped deduplication" in r.getMessage()]


def test_the_optimisers_other_notes_still_show(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger(DEDUPLICATION_LOGGER)
    with caplog.at_level(logging.WARNING), quiet_exporter():
        logger.warning(
            "Skipped deduplication of initializer '%s' as it is a graph input or output", "a"
        )
        logger.warning("Skipped deduplication of initializer '%s' as it has no constant value", "b")
    logger.warning(
        "Skipped deduplication of initializer '%s' as it is a graph input or output", "c"
    )
    shown = [r.getMessage() for r in caplog.records]
    assert not any("'a'" in m for m in shown)
    assert any("'b'" in m for m in shown)  # a real problem is not hidden
    assert any("'c'" in m for m in shown)  # and nothing is hidden after the export
