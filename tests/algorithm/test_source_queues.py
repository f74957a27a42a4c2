"""The Algorithm's per-source queues never split a fragment of a policy with memory.

Its tail would need the recurrent state at the cut, which only the acting side knew: such a
fragment is taken whole (a share may be exceeded by less than one fragment) and is not cut when
a full queue drops its oldest steps (the queue stays over its bound by less than one fragment).
"""

from __future__ import annotations

import numpy as np
import pytest

from rlserve.algorithm.source_queues import SourceQueues, split_fragment
from rlserve.protocol.fragment import Fragment
from rlserve.server.stats import ServerStats


def _fragment(name: str, steps: int, state: float | None) -> Fragment:
    return Fragment(
        name,
        "agent0",
        "default",
        np.zeros((steps + 1, 2), np.float32),
        np.zeros(steps, np.int64),
        np.ones(steps, np.float32),
        np.zeros(steps, np.float32),
        np.ones(steps, bool),
        np.zeros(steps, np.int64),
        False,
        False,
        state_in=None if state is None else np.full(4, state, np.float32),
    )


def test_a_take_moves_fragments_with_state_in_whole() -> None:
    queues = SourceQueues(1000, ServerStats())
    queues.put("a", [_fragment("a0", 10, 0.0), _fragment("a1", 10, 1.0)], 1)
    queues.put("b", [_fragment("b0", 10, None)], 2)
    fragments, _ = queues.take(max_steps=12)  # shares of 6: "a" takes one whole fragment
    whole = [f for f in fragments if f.state_in is not None]
    assert [(f.episode_id, len(f)) for f in whole] == [("a0", 10)]
    assert [len(f) for f in fragments if f.state_in is None] == [6]  # split as before
    rest, _ = queues.take()
    assert sorted((f.episode_id, len(f)) for f in rest) == [("a1", 10), ("b0", 4)]
    np.testing.assert_array_equal(rest[0 if rest[0].episode_id == "a1" else 1].state_in, 1.0)
    assert queues.taken_steps_by_source == {"a": 20, "b": 10}
    assert queues.queued_steps_by_source == {}


def test_a_full_queue_drops_whole_fragments_with_state_in() -> None:
    stats = ServerStats()
    queues = SourceQueues(25, stats)
    queues.put("a", [_fragment(f"a{i}", 10, float(i)) for i in range(3)], 1)  # 5 too many
    assert queues.dropped_steps_by_source == {}  # dropping 10 to save 5 would lose steps
    queues.put("a", [_fragment("a3", 10, 3.0)], 2)  # 15 too many: the oldest goes whole
    assert queues.dropped_steps_by_source == {"a": 10}
    fragments, _ = queues.take()
    assert [(f.episode_id, len(f)) for f in fragments] == [("a1", 10), ("a2", 10), ("a3", 10)]
    assert stats.steps_dropped_queue_full == 10


def test_split_fragment_refuses_a_fragment_with_state_in() -> None:
    with pytest.raises(ValueError, match="never split"):
        split_fragment(_fragment("a", 4, 0.5), 2)
