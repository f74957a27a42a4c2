"""Multi-agent episodes in the episode table: per-agent fragments, rewards, done agents."""

from __future__ import annotations

import numpy as np
import pytest

from rlserve.errors import EpisodeError, SpaceError
from rlserve.experience.episodes import EpisodeTable
from rlserve.protocol.fragment import Fragment


def _table(fragment_length: int = 100) -> tuple[EpisodeTable, list[Fragment]]:
    out: list[Fragment] = []
    return EpisodeTable(fragment_length, 100, 100, out.append), out


def _tick(
    table: EpisodeTable,
    eid: str,
    agents: dict[str, str],
    value: float,
    rewards: list[float] | None = None,
) -> None:
    episode = table.get(eid)
    ids, policies = list(agents), list(agents.values())
    groups = _groups(policies)
    obs = [np.full((len(idx), 2), value, np.float32) for _, idx in groups]
    tick = table.observe_agents(episode, ids, policies, groups, obs, rewards, None)
    for g, (_, idx) in enumerate(groups):
        table.act_agents(episode, tick, g, [1] * len(idx), [-0.5] * len(idx), True, 3)
    table.finish_tick(episode)


def _groups(policies: list[str]) -> list[tuple[str, np.ndarray]]:
    positions: dict[str, list[int]] = {}
    for i, policy in enumerate(policies):
        positions.setdefault(policy, []).append(i)
    return [(p, np.asarray(idx)) for p, idx in positions.items()]


def _observe(
    table: EpisodeTable, eid: str, agents: dict[str, str], rewards: list[float] | None
) -> None:
    ids, policies = list(agents), list(agents.values())
    groups = _groups(policies)
    obs = [np.zeros((len(idx), 2), np.float32) for _, idx in groups]
    table.observe_agents(table.get(eid), ids, policies, groups, obs, rewards, None)


def test_each_agent_gets_its_own_fragments_with_its_policy() -> None:
    table, out = _table()
    eid = table.start("e", True, "default", "me")
    _tick(table, eid, {"a": "red", "b": "blue"}, 0.0)
    _tick(table, eid, {"a": "red"}, 1.0, rewards=[2.0])  # b waits a tick
    _tick(table, eid, {"a": "red", "b": "blue"}, 2.0, rewards=[3.0, 5.0])
    summary = table.end_agents(
        table.get(eid), ["a"], [np.full(2, 9.0, np.float32)], [1.0], None, False
    )
    by_agent = {f.agent_id: f for f in out}
    assert set(by_agent) == {"a", "b"}
    a, b = by_agent["a"], by_agent["b"]
    assert a.policy_id == "red" and b.policy_id == "blue"
    assert a.rewards.tolist() == [2.0, 3.0, 1.0] and a.terminated
    assert a.obs[:, 0].tolist() == [0.0, 1.0, 2.0, 9.0]
    # b had no final observation: its last step's observation stands in (terminated).
    assert b.rewards.tolist() == [5.0, 0.0] and b.obs[:, 0].tolist() == [0.0, 2.0, 2.0]
    assert summary.episode_return == 11.0 and summary.length == 3
    assert summary.policy_returns == {"red": 6.0, "blue": 5.0}


def test_a_truncated_agent_without_a_final_observation_drops_its_last_step() -> None:
    table, out = _table()
    eid = table.start("e", True, "default", "me")
    for i in range(3):
        _tick(table, eid, {"a": "p"}, float(i), rewards=None if i == 0 else [1.0])
    table.log_returns_agents(table.get(eid), ["a"], [1.0], None, {"a": False})
    (fragment,) = out
    assert len(fragment) == 2 and not fragment.terminated and not fragment.truncated
    assert fragment.obs[-1, 0] == 2.0  # bootstraps from the dropped step's observation


def test_fragments_are_cut_per_agent_every_fragment_length_actions() -> None:
    table, out = _table(fragment_length=2)
    eid = table.start("e", True, "default", "me")
    for i in range(5):
        _tick(table, eid, {"a": "p", "b": "p"}, float(i))
    assert sorted((f.agent_id, len(f)) for f in out) == [("a", 2), ("a", 2), ("b", 2), ("b", 2)]


def test_mistakes_name_the_agent_and_policy_and_change_nothing() -> None:
    table, _ = _table()
    eid = table.start("e", True, "default", "me")
    episode = table.get(eid)
    with pytest.raises(EpisodeError, match=r"agent 'z' \(policy 'p'\), which has not acted"):
        _observe(table, eid, {"z": "p"}, [1.0])
    _tick(table, eid, {"a": "p"}, 0.0)
    with pytest.raises(EpisodeError, match="keeps its policy"):
        _observe(table, eid, {"a": "q"}, None)
    with pytest.raises(SpaceError, match="out of range"):
        table.log_returns_agents(episode, ["a"], [float("nan")], None, {})
    with pytest.raises(EpisodeError, match="has not acted"):
        table.log_returns_agents(episode, ["a"], [1.0], None, {"ghost": True})
    assert episode.episode_return == 0.0  # the refused calls changed nothing
    table.log_returns_agents(episode, [], [], None, {"a": True})
    with pytest.raises(EpisodeError, match=r"agent 'a' \(policy 'p'\) is done"):
        _observe(table, eid, {"a": "p"}, None)
    _tick(table, eid, {"b": "p"}, 1.0)  # the episode carries on


def test_single_and_multi_agent_forms_do_not_mix() -> None:
    table, _ = _table()
    single = table.start("s", True, "default", "me")
    table.observe(table.get(single), np.zeros(2, np.float32), None)
    table.act(table.get(single), 0, -0.1, True, 0)
    with pytest.raises(EpisodeError, match="single-agent"):
        _observe(table, single, {"a": "p"}, None)
    multi = table.start("m", True, "default", "me")
    _tick(table, multi, {"a": "p"}, 0.0)
    with pytest.raises(EpisodeError, match="multi-agent"):
        table.log_returns(table.get(multi), 1.0)


def test_idle_multi_agent_episodes_hand_on_every_agent() -> None:
    now = [0.0]
    out: list[Fragment] = []
    table = EpisodeTable(100, 10, 10, out.append, clock=lambda: now[0])
    eid = table.start("e", True, "default", "me")
    for i in range(3):
        _tick(table, eid, {"a": "p", "b": "q"}, float(i))
    now[0] = 100.0
    (summary,) = table.expire_idle(10.0)
    assert summary.reason == "idle_timeout"
    assert sorted((f.agent_id, len(f)) for f in out) == [("a", 2), ("b", 2)]
