"""Local mode cuts experience into reports that fit the server's limits."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from rlserve.client.reports import halve_report, plan_reports, split_fragment
from rlserve.experience.episode_records import EpisodeSummary
from rlserve.protocol.codec import encode
from rlserve.protocol.fragment import Fragment


def _fragment(steps: int, obs_dim: int, name: str = "e", terminated: bool = True) -> Fragment:
    rng = np.random.default_rng(steps)
    return Fragment(
        episode_id=name,
        agent_id="agent0",
        policy_id="default",
        obs=rng.random((steps + 1, obs_dim), dtype=np.float32),
        actions=np.arange(steps, dtype=np.int64) % 2,
        rewards=np.ones(steps, np.float32),
        behaviour_logp=np.full(steps, -0.69, np.float32),
        policy_chosen=np.ones(steps, bool),
        weights_version=np.zeros(steps, np.int64),
        terminated=terminated,
        truncated=False,
    )


def _encoded_size(fragments: list[Fragment], summaries: list[EpisodeSummary]) -> int:
    message = {
        "type": "report_samples",
        "id": 2**31,
        "batch_id": "b" * 32,
        "policy_id": "default",
        "fragments": [f.to_wire() for f in fragments],
        "episodes": [
            {"episode_id": s.episode_id, "return": 1.0, "length": 1, "reason": s.reason}
            for s in summaries
        ],
    }
    return len(encode(message))


def test_split_keeps_every_step_and_the_bootstrap_observation() -> None:
    whole = _fragment(10, 3)
    head, tail = split_fragment(whole, 4)
    assert (len(head), len(tail)) == (4, 6)
    assert np.array_equal(head.obs[-1], tail.obs[0])  # the head bootstraps from it
    assert np.array_equal(np.concatenate([head.obs[:-1], tail.obs]), whole.obs)
    assert not head.terminated and not head.truncated
    assert tail.terminated


@pytest.mark.parametrize(
    ("steps", "obs_dim", "limit"), [(200, 10_000, 1_000_000), (40_000, 100, 4_000_000)]
)
def test_reports_fit_the_frame_limit_and_keep_every_step(
    steps: int, obs_dim: int, limit: int
) -> None:
    fragments = [_fragment(steps // 4, obs_dim, f"e{i}") for i in range(4)]
    summaries = [EpisodeSummary(f"e{i}", 1.0, 1, True, "terminated") for i in range(4)]
    reports, too_big = plan_reports(fragments, summaries, limit, 4_000_000, 65_536)
    assert not too_big
    assert len(reports) > 1
    for parts, ended in reports:
        assert _encoded_size(parts, ended) <= limit
    assert sum(len(f) for parts, _ in reports for f in parts) == steps
    assert [s.episode_id for _, ended in reports for s in ended] == [f"e{i}" for i in range(4)]


def test_the_element_limit_splits_too() -> None:
    reports, too_big = plan_reports([_fragment(100, 50)], [], 10**9, 1000, 65_536)
    assert not too_big
    assert all(f.obs.size <= 1000 for parts, _ in reports for f in parts)
    assert sum(len(f) for parts, _ in reports for f in parts) == 100


def test_a_step_that_cannot_fit_is_given_back_to_be_dropped() -> None:
    big = _fragment(3, 10_000, "big")
    small = _fragment(3, 4, "small")
    reports, too_big = plan_reports([big, small], [], 20_000, 4_000_000, 65_536)
    assert too_big == [big]
    assert [f.episode_id for parts, _ in reports for f in parts] == ["small"]


def test_halving_ends_at_one_step() -> None:
    halves = halve_report([_fragment(5, 2)], [])
    assert halves is not None
    assert [len(f) for half in halves for f in half[0]] == [2, 3]
    assert halve_report([_fragment(1, 2)], []) is None


def _with_state(fragment: Fragment, value: float) -> Fragment:
    return dataclasses.replace(fragment, state_in=np.full(6, value, np.float32))


def test_a_fragment_with_state_in_is_never_split_it_moves_whole_to_the_next_report() -> None:
    fragments = [_with_state(_fragment(30, 20, f"e{i}"), i) for i in range(4)]
    one = _encoded_size(fragments[:1], [])
    reports, too_big = plan_reports(fragments, [], int(1.6 * one) + 2048, 4_000_000, 65_536)
    assert not too_big and len(reports) == 4
    shipped = [f for report, _ in reports for f in report]
    assert [f.episode_id for f in shipped] == ["e0", "e1", "e2", "e3"]
    for before, after in zip(fragments, shipped, strict=True):
        assert len(after) == 30 and after.state_in is not None
        np.testing.assert_array_equal(after.state_in, before.state_in)
    assert halve_report(fragments[:1], []) is None  # one fragment with state_in: no halves
    with pytest.raises(ValueError, match="never split"):
        split_fragment(fragments[0], 10)


def test_a_memory_policys_fragments_are_cut_to_fit_one_report() -> None:
    from memory_policies import memory_policy
    from rlserve.client.reports import memory_fragment_length
    from rlserve.protocol.limits import Limits

    policy = memory_policy(obs_dim=5000)  # 20 kB a step
    limits = Limits(max_frame_bytes=1_000_000)
    steps = memory_fragment_length(200, {"default": policy}, limits)
    assert 30 < steps < 50
    rng = np.random.default_rng(0)
    fragment = Fragment(
        "e" * limits.max_id_length,
        "agent0",
        "default",
        rng.random((steps + 1, 5000), dtype=np.float32),
        np.zeros(steps, np.int64),
        np.ones(steps, np.float32),
        np.zeros(steps, np.float32),
        np.ones(steps, bool),
        np.zeros(steps, np.int64),
        False,
        False,
        state_in=np.zeros(policy.state_size, np.float32),
    )
    assert _encoded_size([fragment], []) < limits.max_frame_bytes
    reports, too_big = plan_reports([fragment], [], limits.max_frame_bytes, 4_000_000, 65_536)
    assert not too_big and [len(r[0]) for r in reports] == [1]
    assert memory_fragment_length(200, {}, limits) == 200  # no memory: unchanged
