"""Which fragment of a batch continues which: the learner replays a later piece of an episode on.

A fragment of a policy with memory carries ``state_in``, the state the *acting* weights had
reached when its first step was taken. When the learner's weights are newer (an update happened
since, or the data lags as in decoupled PPO), that state is not the one the learner's own LSTM
reaches over the same observations, and a replay from it starts off the learner's path. When the
episode's previous fragment is in the same batch, the learner has that path: it replays the
earlier fragment first and continues the later one from the earlier one's end state.

The rule (:func:`continued_fragments`): fragment ``j`` continues fragment ``i`` when ``i`` is the
latest fragment before ``j`` in the batch with the same ``(episode_id, agent_id)``, ``i`` is
neither terminated nor truncated, and ``i``'s last observation ``obs[T]`` equals ``j``'s first.
Anything else (a fragment missing in between, an episode that ended, fragments out of order) is
replayed from its stored ``state_in``, as before. :func:`replay_rounds` orders the replay so that
every fragment comes after the one it continues.
"""

from __future__ import annotations

import numpy as np

from rlserve.protocol.fragment import Fragment


def continued_fragments(fragments: list[Fragment]) -> np.ndarray:
    """``[n]`` int64: for each fragment, the index of the one it continues, -1 for none.

    See the module doc for the rule; the index is always of an earlier fragment of the list.
    """
    predecessor = np.full(len(fragments), -1, dtype=np.int64)
    latest: dict[tuple[str, str], int] = {}
    for j, fragment in enumerate(fragments):
        key = (fragment.episode_id, fragment.agent_id)
        i = latest.get(key)
        latest[key] = j
        if i is None:
            continue
        before = fragments[i]
        if before.terminated or before.truncated:
            continue
        if np.array_equal(before.obs[len(before)], fragment.obs[0]):
            predecessor[j] = i
    return predecessor


def replay_rounds(predecessor: np.ndarray) -> list[np.ndarray]:
    """The fragments' indices in rounds: first those continuing none, then their successors...

    Round ``d`` holds the fragments ``d`` links down a chain (each after the one it continues,
    which is earlier in the list, so one pass gives every depth).
    """
    depth = np.zeros(predecessor.shape[0], dtype=np.int64)
    for j, i in enumerate(predecessor.tolist()):
        if i >= 0:
            depth[j] = depth[i] + 1
    return [np.flatnonzero(depth == d) for d in range(int(depth.max(initial=-1)) + 1)]
