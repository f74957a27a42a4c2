"""Unit tests of the episode bookkeeping rules (EpisodeTable)."""

from __future__ import annotations

import numpy as np
import pytest

from rlserve.errors import CapacityError, EpisodeError, SpaceError
from rlserve.experience.episode_records import SINGLE_AGENT, Episode, EpisodeStatus
from rlserve.experience.episodes import EpisodeTable
from rlserve.protocol.fragment import Fragment


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _table(
    fragment_length: int = 100,
    max_episodes: int = 100,
    max_per_owner: int = 100,
    clock: FakeClock | None = None,
) -> tuple[EpisodeTable, list[Fragment]]:
    sink: list[Fragment] = []
    table = EpisodeTable(
        fragment_length, max_episodes, max_per_owner, sink.append, clock or FakeClock()
    )
    return table, sink


def _obs(i: float) -> np.ndarray:
    return np.array([i, -i], dtype=np.float32)


def _start(
    table: EpisodeTable, eid: str = "ep", training: bool = True, owner: str = "c1"
) -> Episode:
    table.start(eid, training, "default", owner)
    return table.get(eid)


def _step(
    table: EpisodeTable, ep: Episode, i: int, reward: float | None = None, version: int = 0
) -> None:
    """Observe obs ``i`` (reporting ``reward`` for the previous action) and act ``i``."""
    table.observe(ep, _obs(i), reward)
    table.act(ep, i, -0.1 * i, True, version)


def _fragment_valid(f: Fragment) -> None:
    """Every fragment must be internally consistent (what Fragment.from_wire checks)."""
    t = len(f)
    assert t > 0
    assert f.obs.shape == (t + 1, 2)
    assert f.actions.shape[0] == t
    assert f.behaviour_logp.shape == (t,)
    assert f.policy_chosen.shape == (t,)
    assert f.weights_version.shape == (t,)
    Fragment.from_wire(f.to_wire())


# -- rewards ---------------------------------------------------------------------------------


def test_reward_belongs_to_the_previous_action() -> None:
    table, sink = _table()
    ep = _start(table)
    _step(table, ep, 0)
    _step(table, ep, 1, reward=1.0)  # reward for action 0
    _step(table, ep, 2, reward=2.0)  # reward for action 1
    summary = table.end(ep, _obs(3), truncated=False, reward=3.0)  # reward for action 2
    [f] = sink
    _fragment_valid(f)
    np.testing.assert_array_equal(f.rewards, [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(f.obs, np.stack([_obs(i) for i in range(4)]))
    np.testing.assert_array_equal(f.actions, [0, 1, 2])
    assert summary.episode_return == 6.0
    assert summary.length == 3


def test_rewards_accumulate_until_the_next_action() -> None:
    table, sink = _table()
    ep = _start(table)
    _step(table, ep, 0)
    table.log_returns(ep, 1.0)
    table.log_returns(ep, 0.5)
    _step(table, ep, 1, reward=0.25)  # added to the logged 1.5
    table.log_returns(ep, -2.0)
    table.end(ep, _obs(2), truncated=False, reward=None)
    [f] = sink
    np.testing.assert_allclose(f.rewards, [1.75, -2.0])


def test_no_reward_logged_means_zero() -> None:
    table, sink = _table()
    ep = _start(table)
    _step(table, ep, 0)
    _step(table, ep, 1)
    _step(table, ep, 2, reward=5.0)
    summary = table.end(ep, _obs(3), truncated=False, reward=None)
    [f] = sink
    np.testing.assert_array_equal(f.rewards, [0.0, 5.0, 0.0])
    assert f.rewards.dtype == np.float32
    assert summary.episode_return == 5.0


def test_reward_before_first_action_counts_in_the_return_only() -> None:
    """RLlib accepts a reward before the first action: it is in the return, in no step."""
    table, sink = _table()
    ep = _start(table)
    table.log_returns(ep, 1.0, {"before": True})
    table.observe(ep, _obs(0), 2.0)  # carried with the first get_action
    table.act(ep, 0, -0.5, True, 0)
    table.log_returns(ep, 3.0)
    summary = table.end(ep, _obs(1), truncated=False, reward=None)
    (f,) = sink
    np.testing.assert_array_equal(f.rewards, [3.0])
    assert f.infos is None  # the info before the first action has no step to go with
    assert summary.episode_return == 6.0


def test_end_before_any_action_keeps_the_early_reward_in_the_return() -> None:
    table, sink = _table()
    ep = _start(table)
    summary = table.end(ep, _obs(0), truncated=False, reward=4.0)
    assert sink == []
    assert summary.episode_return == 4.0 and summary.length == 0


def test_infos_are_kept_with_their_step_and_merge_until_the_next_action() -> None:
    table, sink = _table(fragment_length=2)
    ep = _start(table)
    for step in range(3):
        table.observe(ep, _obs(step), None, {"step": step} if step == 2 else None)
        table.act(ep, 0, -0.5, True, 0)
        if step == 0:
            table.log_returns(ep, 1.0, {"a": 1, "b": 1})
            table.log_returns(ep, 1.0, {"b": 2})
    table.end(ep, _obs(3), truncated=False, reward=0.0, info={"last": "yes"})
    first, second = sink
    assert first.infos == [{"a": 1, "b": 2}, {"step": 2}]
    assert second.infos == [{"last": "yes"}]
    assert first.to_wire()["infos"] == first.infos
    assert Fragment.from_wire(first.to_wire()).infos == first.infos


def test_fragment_without_infos_has_no_infos_field() -> None:
    table, sink = _table()
    ep = _start(table)
    table.observe(ep, _obs(0), None)
    table.act(ep, 0, -0.5, True, 0)
    table.end(ep, _obs(1), truncated=False, reward=1.0)
    assert sink[0].infos is None and "infos" not in sink[0].to_wire()


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), 2e9])
def test_a_non_finite_or_huge_reward_is_refused_by_the_call_that_logs_it(bad: float) -> None:
    table, _ = _table()
    ep = _start(table)
    table.observe(ep, _obs(0), None)
    table.act(ep, 0, -0.5, True, 0)
    with pytest.raises(SpaceError, match="log_returns for episode 'ep': reward"):
        table.log_returns(ep, bad)
    with pytest.raises(SpaceError, match="end_episode for episode 'ep': reward"):
        table.end(ep, _obs(1), truncated=False, reward=bad)
    assert ep.episode_return == 0.0 and ep.agent.pending_reward == 0.0


def test_rewards_that_add_up_over_the_bound_are_refused_by_the_call_that_overflows() -> None:
    table, _ = _table()
    ep = _start(table)
    table.observe(ep, _obs(0), None)
    table.act(ep, 0, -0.5, True, 0)
    table.log_returns(ep, 6e8)
    with pytest.raises(SpaceError, match=r"add up to 1200000000\.0"):
        table.log_returns(ep, 6e8)
    assert ep.agent.pending_reward == 6e8


def test_zero_reward_before_first_action_is_allowed() -> None:
    # Clients send reward 0.0 with their first get_action.
    table, sink = _table()
    ep = _start(table)
    table.check_observe(ep, 0.0)
    _step(table, ep, 0, reward=0.0)
    table.end(ep, _obs(1), truncated=False, reward=1.0)
    np.testing.assert_array_equal(sink[0].rewards, [1.0])


# -- ids and order ---------------------------------------------------------------------------


def test_start_returns_the_id_or_assigns_one() -> None:
    table, _ = _table()
    assert table.start("mine", True, "default", "c1") == "mine"
    a = table.start(None, True, "default", "c1")
    b = table.start(None, True, "default", "c1")
    assert a != b
    assert table.get(a).episode_id == a
    assert len(table) == 3


def test_episode_keeps_its_policy_and_owner() -> None:
    table, sink = _table()
    table.start("e", True, "blue", "c7")
    ep = table.get("e")
    assert ep.policy_id == "blue"
    assert ep.owner == "c7"
    _step(table, ep, 0)
    table.end(ep, _obs(1), truncated=False, reward=None)
    assert sink[0].policy_id == "blue"
    assert sink[0].episode_id == "e"
    assert sink[0].agent_id == SINGLE_AGENT


def test_reused_active_id() -> None:
    table, _ = _table()
    _start(table, "e")
    with pytest.raises(EpisodeError, match="already active"):
        table.start("e", True, "default", "c1")
    assert len(table) == 1


def test_reused_ended_id() -> None:
    table, _ = _table()
    ep = _start(table, "e")
    table.end(ep, _obs(0), truncated=False, reward=None)
    with pytest.raises(EpisodeError, match="used before"):
        table.start("e", True, "default", "c1")
    assert len(table) == 0


def test_unknown_id() -> None:
    table, _ = _table()
    with pytest.raises(EpisodeError, match="unknown episode 'nope'"):
        table.get("nope")


def test_call_after_end() -> None:
    table, _ = _table()
    ep = _start(table, "e")
    _step(table, ep, 0)
    table.end(ep, _obs(1), truncated=False, reward=None)
    assert ep.status is EpisodeStatus.ENDED
    with pytest.raises(EpisodeError, match="has ended"):
        table.get("e")


def test_observe_twice_without_act() -> None:
    table, _ = _table()
    ep = _start(table)
    table.observe(ep, _obs(0), None)
    assert ep.status is EpisodeStatus.AWAITING_ACTION
    with pytest.raises(EpisodeError, match="still being answered"):
        table.observe(ep, _obs(1), None)
    with pytest.raises(EpisodeError, match="still being answered"):
        table.check_observe(ep, None)
    with pytest.raises(EpisodeError, match="log_returns"):
        table.log_returns(ep, 1.0)
    with pytest.raises(EpisodeError, match="end_episode"):
        table.end(ep, _obs(1), truncated=False, reward=None)
    # The refused observation was not recorded.
    assert len(ep.agent.obs) == 1
    table.act(ep, 0, 0.0, True, 0)
    assert ep.status is EpisodeStatus.ACTIVE
    table.observe(ep, _obs(1), None)


def test_check_observe_changes_nothing() -> None:
    table, _ = _table()
    ep = _start(table)
    _step(table, ep, 0)
    table.check_observe(ep, 3.0)
    assert ep.episode_return == 0.0
    assert ep.agent.pending_reward == 0.0
    assert ep.status is EpisodeStatus.ACTIVE


def test_act_records_what_was_taken() -> None:
    table, sink = _table()
    ep = _start(table)
    table.observe(ep, _obs(0), None)
    table.act(ep, 1, -0.7, True, 3)
    table.observe(ep, _obs(1), None)
    table.act(ep, 0, float("nan"), False, 4)  # a log_action step
    table.end(ep, _obs(2), truncated=False, reward=None)
    [f] = sink
    np.testing.assert_array_equal(f.actions, [1, 0])
    np.testing.assert_allclose(f.behaviour_logp, [-0.7, np.nan])
    np.testing.assert_array_equal(f.policy_chosen, [True, False])
    np.testing.assert_array_equal(f.weights_version, [3, 4])
    assert f.weights_version.dtype == np.int64
    assert f.obs.dtype == np.float32


# -- training_enabled ------------------------------------------------------------------------


def test_training_disabled_produces_no_fragments_but_a_summary() -> None:
    table, sink = _table(fragment_length=2)
    ep = _start(table, training=False)
    for i in range(5):
        _step(table, ep, i, reward=None if i == 0 else 1.0)
    summary = table.end(ep, _obs(5), truncated=False, reward=1.5)
    assert sink == []
    assert summary.episode_return == 5.5
    assert summary.length == 5
    assert summary.training_enabled is False
    assert summary.reason == "terminated"


# -- fragments -------------------------------------------------------------------------------


def test_fragment_cut_every_fragment_length_steps() -> None:
    table, sink = _table(fragment_length=3)
    ep = _start(table)
    for i in range(7):
        _step(table, ep, i, reward=None if i == 0 else float(i))
        # A fragment is handed on only once the next observation is known.
        assert len(sink) == (0 if i < 3 else 1 if i < 6 else 2)
    table.end(ep, _obs(7), truncated=False, reward=7.0)
    assert [len(f) for f in sink] == [3, 3, 1]
    for f in sink:
        _fragment_valid(f)
    first, second, last = sink
    # obs[T] of a fragment is the observation after its last action ...
    np.testing.assert_array_equal(first.obs, np.stack([_obs(i) for i in range(4)]))
    # ... and the continuation starts at that observation.
    np.testing.assert_array_equal(second.obs[0], first.obs[-1])
    np.testing.assert_array_equal(second.obs, np.stack([_obs(i) for i in range(3, 7)]))
    np.testing.assert_array_equal(last.obs, np.stack([_obs(6), _obs(7)]))
    np.testing.assert_array_equal(first.actions, [0, 1, 2])
    np.testing.assert_array_equal(second.actions, [3, 4, 5])
    np.testing.assert_array_equal(last.actions, [6])
    np.testing.assert_array_equal(first.rewards, [1, 2, 3])
    np.testing.assert_array_equal(second.rewards, [4, 5, 6])
    np.testing.assert_array_equal(last.rewards, [7])
    # Only the last fragment ends the episode.
    assert [(f.terminated, f.truncated) for f in sink] == [
        (False, False),
        (False, False),
        (True, False),
    ]


def test_fragment_length_one() -> None:
    table, sink = _table(fragment_length=1)
    ep = _start(table)
    for i in range(3):
        _step(table, ep, i, reward=None if i == 0 else 1.0)
    table.end(ep, _obs(3), truncated=True, reward=1.0)
    assert [len(f) for f in sink] == [1, 1, 1]
    for i, f in enumerate(sink):
        np.testing.assert_array_equal(f.obs, np.stack([_obs(i), _obs(i + 1)]))


def test_episode_ending_exactly_at_a_cut_sends_no_empty_fragment() -> None:
    table, sink = _table(fragment_length=2)
    ep = _start(table)
    _step(table, ep, 0)
    _step(table, ep, 1)
    table.end(ep, _obs(2), truncated=False, reward=None)
    assert [len(f) for f in sink] == [2]
    assert sink[0].terminated


@pytest.mark.parametrize("truncated", [False, True])
def test_end_terminated_vs_truncated(truncated: bool) -> None:
    table, sink = _table()
    ep = _start(table)
    _step(table, ep, 0)
    summary = table.end(ep, _obs(1), truncated=truncated, reward=1.0)
    [f] = sink
    assert f.terminated is (not truncated)
    assert f.truncated is truncated
    assert summary.reason == ("truncated" if truncated else "terminated")
    np.testing.assert_array_equal(f.obs[-1], _obs(1))


def test_zero_step_episode() -> None:
    table, sink = _table()
    ep = _start(table)
    summary = table.end(ep, _obs(0), truncated=False, reward=None)
    assert sink == []
    assert summary.length == 0
    assert summary.episode_return == 0.0
    assert summary.reason == "terminated"
    assert len(table) == 0


# -- capacity --------------------------------------------------------------------------------


def test_per_owner_capacity() -> None:
    table, _ = _table(max_per_owner=2)
    a = _start(table, "a1", owner="A")
    _start(table, "a2", owner="A")
    with pytest.raises(CapacityError, match="this client holds 2"):
        table.start("a3", True, "default", "A")
    _start(table, "b1", owner="B")  # other owners are not affected
    assert table.owners() == {"A": 2, "B": 1}
    table.end(a, _obs(0), truncated=False, reward=None)
    # The refused id was not burnt, and the freed slot can be used.
    _start(table, "a3", owner="A")
    assert table.owners() == {"A": 2, "B": 1}


def test_per_server_capacity() -> None:
    table, _ = _table(max_episodes=3, max_per_owner=10)
    _start(table, "a", owner="A")
    _start(table, "b", owner="B")
    c = _start(table, "c", owner="C")
    with pytest.raises(CapacityError, match="server holds 3"):
        table.start("d", True, "default", "D")
    assert "D" not in table.owners()
    table.end(c, _obs(0), truncated=False, reward=None)
    _start(table, "d", owner="D")
    assert len(table) == 3


def test_an_episode_belongs_to_its_owner() -> None:
    table, _ = _table()
    ep = _start(table, "e", owner="A")
    assert table.owned("e", "A") is ep
    with pytest.raises(EpisodeError, match="belongs to another client"):
        table.owned("e", "B")


def test_started_unused_only_for_the_owner_before_any_step() -> None:
    table, _ = _table()
    ep = _start(table, "e", owner="A")
    assert table.started_unused("e", "A")
    assert not table.started_unused("e", "B")
    assert not table.started_unused("other", "A")
    _step(table, ep, 0)
    assert not table.started_unused("e", "A")


# -- sequence numbers ------------------------------------------------------------------------


def test_seq_next_retry_and_out_of_order() -> None:
    table, _ = _table()
    ep = _start(table, "e")
    assert not table.check_seq(ep, None, "get_action")  # untracked: always applied
    with pytest.raises(EpisodeError, match=r"the next call is 1; number") as first:
        table.check_seq(ep, 5, "get_action")
    assert "retry" not in str(first.value)  # nothing to retry before the first call (0 is refused)
    assert not table.check_seq(ep, 1, "get_action")
    table.record_seq(ep, 1, "get_action", answer=1)
    assert table.check_seq(ep, 1, "get_action")  # a retry
    assert ep.answer == 1
    assert not table.check_seq(ep, 2, "log_returns")
    with pytest.raises(EpisodeError, match="repeats the number of its get_action"):
        table.check_seq(ep, 1, "log_returns")
    for wrong in (3, 7):
        with pytest.raises(EpisodeError, match=r"next call is 2 \(or 1 to retry the last one\)"):
            table.check_seq(ep, wrong, "get_action")
    table.record_seq(ep, 2, "log_returns")
    with pytest.raises(EpisodeError, match="out of order"):
        table.check_seq(ep, 1, "get_action")  # going back


def test_the_end_is_remembered_with_its_seq_and_owner() -> None:
    table, _ = _table()
    ep = _start(table, "e", owner="A")
    _step(table, ep, 0)
    table.end(ep, _obs(1), truncated=False, reward=None, seq=2)
    assert table.ended_by("e", "A", 2)
    assert not table.ended_by("e", "A", 3)
    assert not table.ended_by("e", "B", 2)
    assert not table.ended_by("e", "A", None)
    idle = _start(table, "i", owner="A")
    table.expire_idle(-1.0)
    assert idle.status is EpisodeStatus.ENDED
    assert not table.ended_by("i", "A", 1)  # closed by the server, not by a call


# -- idle expiry -----------------------------------------------------------------------------


def test_expire_idle_closes_only_idle_episodes() -> None:
    clock = FakeClock()
    table, _ = _table(clock=clock)
    _start(table, "old", owner="A")
    clock.now += 8.0
    fresh = _start(table, "fresh", owner="A")
    clock.now += 3.0  # "old" idle 11 s, "fresh" idle 3 s
    summaries = table.expire_idle(10.0)
    assert [s.episode_id for s in summaries] == ["old"]
    assert summaries[0].reason == "idle_timeout"
    assert len(table) == 1
    assert table.owners() == {"A": 1}
    with pytest.raises(EpisodeError, match="has ended"):
        table.get("old")
    with pytest.raises(EpisodeError, match="used before"):
        table.start("old", True, "default", "A")
    assert table.get("fresh") is fresh


def test_activity_keeps_an_episode_alive() -> None:
    clock = FakeClock()
    table, _ = _table(clock=clock)
    ep = _start(table)
    _step(table, ep, 0)
    clock.now += 8.0
    table.log_returns(ep, 1.0)
    clock.now += 8.0
    assert table.expire_idle(10.0) == []
    clock.now += 8.0
    table.observe(ep, _obs(1), None)
    table.act(ep, 1, -0.5, True, 0)
    clock.now += 8.0
    assert table.expire_idle(10.0) == []
    clock.now += 3.0
    assert [s.episode_id for s in table.expire_idle(10.0)] == ["ep"]


def test_expire_idle_after_an_action_hands_on_the_steps_before_it() -> None:
    clock = FakeClock()
    table, sink = _table(clock=clock)
    ep = _start(table)
    _step(table, ep, 0)
    _step(table, ep, 1, reward=1.0)
    _step(table, ep, 2, reward=2.0)
    table.log_returns(ep, 3.0)  # the last action's reward; it has no next observation
    clock.now += 60.0
    [summary] = table.expire_idle(10.0)
    assert summary.reason == "idle_timeout"
    assert summary.episode_return == 6.0
    assert summary.length == 3
    [f] = sink
    _fragment_valid(f)
    # The last action has no following observation: the steps before it bootstrap from the
    # observation that action was taken in.
    assert len(f) == 2
    np.testing.assert_array_equal(f.obs, np.stack([_obs(0), _obs(1), _obs(2)]))
    np.testing.assert_array_equal(f.actions, [0, 1])
    np.testing.assert_array_equal(f.rewards, [1.0, 2.0])
    assert not f.terminated
    assert not f.truncated


def test_an_episode_awaiting_its_action_is_never_idle() -> None:
    # It waits on the server (e.g. for the learner's first weights), not on its client.
    clock = FakeClock()
    table, sink = _table(clock=clock)
    ep = _start(table)
    _step(table, ep, 0)
    table.observe(ep, _obs(1), 1.0)
    clock.now += 600.0
    assert table.expire_idle(10.0) == []
    assert sink == []
    table.act(ep, 1, -0.5, True, 0)
    clock.now += 60.0
    [summary] = table.expire_idle(10.0)
    assert summary.reason == "idle_timeout"
    assert summary.episode_return == 1.0


def test_expire_idle_with_a_single_action_hands_on_nothing() -> None:
    clock = FakeClock()
    table, sink = _table(clock=clock)
    ep = _start(table)
    _step(table, ep, 0)
    clock.now += 60.0
    [summary] = table.expire_idle(10.0)
    assert summary.length == 1
    assert sink == []


def test_expire_idle_of_training_disabled_episode_hands_on_nothing() -> None:
    clock = FakeClock()
    table, sink = _table(clock=clock)
    ep = _start(table, training=False)
    for i in range(3):
        _step(table, ep, i, reward=None if i == 0 else 1.0)
    clock.now += 60.0
    [summary] = table.expire_idle(10.0)
    assert summary.training_enabled is False
    assert sink == []


def test_idle_time_counts_from_the_answer_not_the_question() -> None:
    clock = FakeClock()
    table, _ = _table(clock=clock)
    ep = _start(table)
    table.observe(ep, _obs(0), None)
    clock.now += 60.0  # the server took long to answer (e.g. waiting for the first weights)
    table.act(ep, 0, -0.5, True, 0)
    assert table.expire_idle(10.0) == []
    clock.now += 11.0
    assert [s.episode_id for s in table.expire_idle(10.0)] == ["ep"]


def test_an_idle_episode_hands_on_its_steps_under_its_own_policy() -> None:
    clock = FakeClock()
    table, sink = _table(clock=clock)
    table.start("ep", True, "red", "c1")
    ep = table.get("ep")
    for i in range(3):
        _step(table, ep, i)
    clock.now += 60.0
    table.expire_idle(10.0)
    [f] = sink
    assert (f.policy_id, f.agent_id, len(f)) == ("red", SINGLE_AGENT, 2)


def test_the_records_stay_importable_from_the_table_module() -> None:
    from rlserve.experience import episode_records, episodes

    for name in ("SINGLE_AGENT", "AgentTrajectory", "Episode", "EpisodeStatus", "EpisodeSummary"):
        assert getattr(episodes, name) is getattr(episode_records, name)


def test_a_local_clients_table_names_its_own_limit() -> None:
    table = EpisodeTable(
        10,
        1,
        1,
        lambda fragment: None,
        holder="this client",
        limit_setting="LocalConfig(max_episodes=...)",
    )
    _start(table, "a", owner="A")
    with pytest.raises(CapacityError, match=r"this client holds 1 episodes.*LocalConfig\("):
        table.start("b", True, "default", "A")
