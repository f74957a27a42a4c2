"""The flattened form of frame stacking (the rows the episode table records)."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium import spaces

from rlserve.policy.frame_stacking import FrameStacker, flat_order


@pytest.mark.parametrize("shape", [(12, 12, 3), (3, 12, 12), (8, 8), (5,)])
def test_flat_order_stacks_flattened_frames_as_the_stacker_does(shape: tuple[int, ...]) -> None:
    space = spaces.Box(0, 255, shape, np.uint8)
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 255, shape) for _ in range(3)]
    stacker = FrameStacker(space, 3)
    stacker.reset(frames[0])
    stacker.push(frames[1])
    expected = stacker.push(frames[2]).reshape(-1)
    joined = np.concatenate([f.reshape(-1) for f in frames])
    order = flat_order(space, 3)
    assert np.array_equal(joined if order is None else joined[order], expected)
    assert (order is None) == (shape != (12, 12, 3))
