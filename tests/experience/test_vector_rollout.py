"""VectorRollout: the same fragments and summaries as the EpisodeTable for the same steps."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from rlserve.errors import SpaceError
from rlserve.experience.episode_records import EpisodeSummary
from rlserve.experience.episodes import EpisodeTable
from rlserve.experience.vector_rollout import VectorRollout
from rlserve.protocol.fragment import Fragment

N, D = 4, 3


def _same(a: Fragment, b: Fragment) -> None:
    assert (a.episode_id, a.agent_id, a.policy_id) == (b.episode_id, b.agent_id, b.policy_id)
    for name in ("obs", "actions", "rewards", "behaviour_logp", "policy_chosen"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and x.tobytes() == y.tobytes(), name
    np.testing.assert_array_equal(a.weights_version, b.weights_version)
    assert (a.terminated, a.truncated, a.infos) == (b.terminated, b.truncated, b.infos)


def _drive(seed: int, training: bool, fragment_length: int) -> None:
    """Random steps, ends, failures, infos and cuts through both; compare what comes out."""
    rng = np.random.default_rng(seed)
    got: list[Fragment] = []
    got_summaries: list[EpisodeSummary] = []
    rollout = VectorRollout(N, fragment_length, "p", training, got.append, got_summaries.append)
    want: list[Fragment] = []
    table = EpisodeTable(fragment_length, 100, 100, want.append)
    want_summaries: list[EpisodeSummary] = []
    episodes = [table.get(table.start(e, training, "p", "o")) for e in rollout.episode_ids]

    def restart(i: int) -> None:
        episodes[i] = table.get(table.start(rollout.episode_ids[i], training, "p", "o"))

    obs = rng.standard_normal((N, D)).astype(np.float32)
    for step in range(120):
        actions = rng.integers(0, 3, N)
        logp = rng.standard_normal(N).astype(np.float32)
        rollout.record(obs, actions, logp, step // 7)
        for i, episode in enumerate(episodes):
            table.observe(episode, obs[i], None)
            table.act(episode, int(actions[i]), float(logp[i]), True, step // 7)
        rewards = rng.choice([0.0, -0.0, 1.0, -2.5, 1e-3], N)
        infos: dict[int, dict[str, Any]] = {i: {"k": step} for i in range(N) if rng.random() < 0.2}
        rollout.rewards(rewards, infos)
        for i, episode in enumerate(episodes):
            table.log_returns(episode, float(rewards[i]), infos.get(i))
        for i in range(N):
            event = rng.random()
            if event < 0.08:
                final = rng.standard_normal(D).astype(np.float32)
                truncated = bool(rng.random() < 0.5)
                rollout.end(i, final, truncated)
                want_summaries.append(table.end(episodes[i], final, truncated, None))
                restart(i)
            elif event < 0.11:
                rollout.abandon(i, "failed")
                want_summaries.append(table.abandon(episodes[i], "failed"))
                restart(i)
        obs = rng.standard_normal((N, D)).astype(np.float32)
        if rng.random() < 0.05:
            rollout.cut(obs)
            for i, episode in enumerate(episodes):
                table.cut(episode, obs[i])
    assert len(got) == len(want)
    if training:
        assert len(got) > 20 and any(f.infos for f in got)
        assert {len(f) for f in got} >= {1, fragment_length}
    for a, b in zip(got, want, strict=True):
        _same(a, b)
    assert got_summaries == want_summaries
    assert len(got_summaries) > 10


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("fragment_length", [1, 5])
def test_matches_the_episode_table(seed: int, fragment_length: int) -> None:
    _drive(seed, True, fragment_length)


def test_untrained_episodes_leave_summaries_only() -> None:
    _drive(3, False, 4)


def test_continuous_actions_are_kept_per_copy() -> None:
    got: list[Fragment] = []
    rollout = VectorRollout(2, 10, "p", True, got.append, lambda _s: None)
    obs = np.zeros((2, 1), np.float32)
    actions = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    rollout.record(obs, actions, np.zeros(2, np.float32), 0)
    rollout.rewards(np.zeros(2), {})
    rollout.cut(obs)
    np.testing.assert_array_equal(got[1].actions, [[3.0, 4.0]])
    assert got[1].actions.dtype == np.float32


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 1e12])
def test_a_reward_out_of_range_is_refused_naming_the_episode(bad: float) -> None:
    rollout = VectorRollout(3, 10, "p", True, lambda _f: None, lambda _s: None)
    rollout.record(np.zeros((3, 1), np.float32), np.zeros(3, np.int64), np.zeros(3), 0)
    with pytest.raises(SpaceError, match=f"episode '{rollout.episode_ids[1]}'.*out of range"):
        rollout.rewards(np.array([0.0, bad, 1.0]), {})


def test_episode_ids_are_new_for_every_episode_and_rollout() -> None:
    summaries: list[EpisodeSummary] = []
    rollouts = [VectorRollout(N, 5, "p", True, lambda f: None, summaries.append) for _ in range(2)]
    seen = [eid for r in rollouts for eid in r.episode_ids]
    obs = np.zeros((N, D), np.float32)
    for rollout in rollouts:
        for _ in range(30):
            rollout.record(obs, np.zeros(N, np.int64), np.zeros(N, np.float32), 0)
            rollout.rewards(np.ones(N), {})
            for i in range(N):
                rollout.end(i, obs[i], False)
                seen.append(rollout.episode_ids[i])
    assert len(set(seen)) == len(seen) == 2 * N + 2 * 30 * N
    assert len(summaries) == 2 * 30 * N
    assert all(len(eid) == 32 and int(eid, 16) >= 0 for eid in seen)
