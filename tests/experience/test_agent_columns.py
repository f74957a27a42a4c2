"""Unit tests of the column storage of multi-agent episodes (rlserve.experience.agent_columns)."""

from __future__ import annotations

import numpy as np

from rlserve.experience.agent_columns import FIRST_ROWS, FIRST_STEPS, AgentColumns, EpisodeAgents


def _tick(columns: AgentColumns, rows: np.ndarray, t: int, reward: float = 0.0) -> None:
    """One step of every row: reward the last action, observe ``t``, act ``t``."""
    if reward:
        columns.add_rewards(rows, np.full(rows.size, reward))
    acted = rows[columns.count[rows] > 0]
    if acted.size:
        columns.close_steps(acted)
    columns.write_obs(rows, np.stack([np.full(3, 100 * r + t, np.float32) for r in rows]))
    columns.record(rows, rows * 10 + t, np.full(rows.size, -0.5, np.float32), True, t)


def test_rows_and_steps_grow_past_their_first_size_keeping_what_is_stored() -> None:
    columns = AgentColumns("p", fragment_length=100)
    first = columns.add(["a", "b"])
    for t in range(FIRST_STEPS + 5):
        _tick(columns, first, t, reward=1.0 if t else 0.0)
    later = columns.add([f"x{i}" for i in range(FIRST_ROWS * 3)])
    assert columns.size == 2 + FIRST_ROWS * 3 and columns.ids[2] == "x0"
    _tick(columns, later, 0)
    np.testing.assert_array_equal(columns.count[: columns.size], [21, 21] + [1] * 12)
    np.testing.assert_array_equal(columns.steps[first], [21, 21])
    [a, b] = columns.take(first, np.array([20, 20]), "ep", False, False, keep=True)
    assert (a.agent_id, b.agent_id, a.policy_id, len(a)) == ("a", "b", "p", 20)
    np.testing.assert_array_equal(a.obs[:, 0], np.arange(21, dtype=np.float32))
    np.testing.assert_array_equal(b.actions, 10 + np.arange(20))
    np.testing.assert_array_equal(a.rewards, np.ones(20, np.float32))
    np.testing.assert_array_equal(a.weights_version, np.arange(20))
    assert a.infos is None and a.actions.dtype == np.int64
    np.testing.assert_array_equal(columns.count[first], [0, 0])


def test_rows_at_different_steps_are_cut_one_by_one_with_their_infos() -> None:
    columns = AgentColumns("q", fragment_length=10)
    rows = columns.add(["a", "b", "c"])
    for t in range(4):
        _tick(columns, rows if t < 2 else rows[:2], t)
        if t == 1:
            columns.merge_info(1, {"k": 1})
            columns.merge_info(1, {"k": 2, "j": 0})
    columns.close_steps(rows)
    columns.write_obs(rows, np.zeros((3, 3), np.float32))
    fragments = columns.take(rows, columns.count[rows], "ep", True, False, keep=True)
    assert [len(f) for f in fragments] == [4, 4, 2]
    assert fragments[1].infos == [None, {"k": 2, "j": 0}, None, None]
    assert fragments[0].infos is None
    assert all(f.terminated and f.obs.shape == (len(f) + 1, 3) for f in fragments)
    assert columns.take(rows, np.ones(3, np.int64), "ep", False, False, keep=False) == []


def test_float_actions_are_stored_as_float32_rows() -> None:
    columns = AgentColumns("box", fragment_length=5)
    rows = columns.add(["a"])
    columns.write_obs(rows, np.zeros((1, 2), np.float32))
    columns.record(rows, np.array([[0.25, -1.0]]), np.array([0.0], np.float32), False, 0)
    columns.close_steps(rows)
    columns.write_obs(rows, np.ones((1, 2), np.float32))
    [f] = columns.take(rows, columns.count[rows], "ep", False, True, keep=True)
    assert f.actions.dtype == np.float32 and f.actions.tolist() == [[0.25, -1.0]]
    assert f.policy_chosen.tolist() == [False]


def test_an_episode_finds_its_agents_and_remembers_the_last_lists() -> None:
    agents = EpisodeAgents(fragment_length=10)
    p, p_rows = agents.join("p", ["a", "b"])
    _, q_rows = agents.join("q", ["c"])
    assert len(agents) == 3 and "c" in agents and "z" not in agents
    assert agents.policy_of("c") == "q" and agents.policy_of("z") is None
    located = agents.locate(["c", "z", "a"])
    assert located.unknown == [1]
    assert [(cols.policy_id, rows.tolist(), pos.tolist()) for cols, rows, pos in located.parts] == [
        ("q", [0], [0]),
        ("p", [0], [2]),
    ]
    assert agents.locate(["c", "z", "a"]) is located  # the same list again: remembered
    agents.join("p", ["z"])
    assert agents.locate(["c", "z", "a"]).unknown == []  # an agent joined: looked up again
    p.done[1] = True
    assert agents.is_done("b") and not agents.is_done("a") and not agents.is_done("nobody")
    agents.remember(["a", "b"], ["p", "p"], [(p, p_rows)])
    assert agents.known_plan(["a", "b"], ["p", "p"]) is not None
    assert agents.known_plan(["a", "b"], ["p", "q"]) is None
    assert agents.known_plan(["b", "a"], ["p", "p"]) is None
    assert q_rows.tolist() == [0]
