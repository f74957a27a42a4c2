"""The per-episode frame stacks of a policy with frame_stack N (experience/frame_stacks.py)."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium import spaces

from rlserve.env import FrameStacker
from rlserve.errors import ConfigError
from rlserve.experience.agent_values import PolicyTable
from rlserve.experience.collector import Collector
from rlserve.experience.episode_records import Episode
from rlserve.experience.frame_stacks import CopyFrames, FrameRule, stack_agents
from rlserve.policy import ModelSpec, NumpyPolicy
from rlserve.protocol.fragment import Fragment
from rlserve.protocol.spaces import describe

FRAME = spaces.Box(0, 255, (6, 6, 2), np.uint8)


def _episode(name: str) -> Episode:
    return Episode(name, "default", "owner", True, 0.0)


def test_each_episode_stacks_its_own_frames_as_frame_stacker_does() -> None:
    rule = FrameRule(FRAME, 2)
    assert rule.space == FrameStacker(FRAME, 2).space
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 255, (2, 4, 6, 6, 2)).astype(np.uint8)
    episodes = [_episode("a"), _episode("b")]
    stackers = [FrameStacker(FRAME, 2) for _ in episodes]
    for t in range(4):
        obs = frames[:, t].reshape(2, -1).astype(np.float32)
        got = rule.stack(episodes, obs)
        for i, stacker in enumerate(stackers):
            want = stacker.reset(frames[i, t]) if t == 0 else stacker.push(frames[i, t])
            np.testing.assert_array_equal(got[i], want.reshape(-1))


def test_next_changes_nothing_until_keep() -> None:
    rule = FrameRule(spaces.Box(-1, 1, (3,), np.float32), 3)
    episode = _episode("a")
    rule.stack([episode], np.array([[1, 2, 3]], np.float32))
    held = episode.frames
    frames, stacked = rule.next([episode], np.array([[4, 5, 6]], np.float32))
    assert episode.frames is held
    assert stacked[0].tolist() == [1, 2, 3, 1, 2, 3, 4, 5, 6]
    rule.keep([episode], frames)
    assert episode.frames is not None and episode.frames.tolist() == stacked[0].tolist()
    copy = CopyFrames()
    assert rule.stack([copy], np.array([[0, 0, 1]], np.float32))[0].tolist() == [0, 0, 1] * 3


def test_one_frame_is_no_rule_and_refusals_name_the_fix() -> None:
    assert FrameRule.of(FRAME, 1) is None
    with pytest.raises(ConfigError, match="stack at most 2 frames"):
        FrameRule(FRAME, 3)


def test_each_agent_of_a_multi_agent_episode_stacks_its_own_frames() -> None:
    """Agents of a stacking policy keep their frames by agent id (a newcomer starts afresh);
    another policy's block passes as it was; nothing is kept before keep()."""
    vector = spaces.Box(-10, 10, (2,), np.float32)
    rules = {"stacked": FrameRule(vector, 3), "plain": None}
    episode = _episode("e")
    plain_block = np.array([[9, 9]], np.float32)

    def call(agent_ids: list[str], groups: list[tuple[str, list[int]]], rows: list[list[float]]):
        by_group = [(pid, np.asarray(idx)) for pid, idx in groups]
        blocks = [np.asarray([rows[i] for i in idx], np.float32) for _, idx in groups]
        return stack_agents(rules.get, episode, agent_ids, by_group, blocks)

    first = call(["a", "b", "p"], [("stacked", [0, 1]), ("plain", [2])], [[1, 1], [2, 2], [9, 9]])
    assert first is not None and episode.agent_frames is None
    assert first.blocks[0].tolist() == [[1, 1] * 3, [2, 2] * 3]
    np.testing.assert_array_equal(first.blocks[1], plain_block)
    first.keep(episode)
    second = call(["b", "c"], [("stacked", [0, 1])], [[3, 3], [5, 5]])
    assert second is not None
    assert second.blocks[0].tolist() == [[2, 2, 2, 2, 3, 3], [5, 5] * 3]
    second.keep(episode)
    third = call(["a", "b"], [("stacked", [0, 1])], [[4, 4], [6, 6]])
    assert third is not None
    assert third.blocks[0].tolist() == [[1, 1, 1, 1, 4, 4], [2, 2, 3, 3, 6, 6]]
    assert call(["p"], [("plain", [0])], [[0, 0]]) is None


def test_the_hosted_vector_path_stacks_each_copys_episode_afresh() -> None:
    vector = spaces.Box(-1, 1, (3,), np.float32)
    welcome = {
        "policies": {
            "default": {
                "observation_space": describe(vector),
                "action_space": describe(spaces.Discrete(2)),
                "frame_stack": 2,
            }
        },
        "mapping": None,
    }
    spec = ModelSpec(6, ("actor.0",), "tanh", "categorical", 2)
    rng = np.random.default_rng(1)
    arrays = {"actor.0.weight": rng.normal(0, 1, (2, 6)), "actor.0.bias": np.zeros(2)}
    policy = NumpyPolicy(spec, {k: v.astype(np.float32) for k, v in arrays.items()}, 1)
    fragments: list[Fragment] = []
    collector = Collector(
        PolicyTable(welcome), {"default": policy}, 3, 10, fragments.append, lambda s: None
    )
    rollout = collector.open_vector(2, True)
    frames = rng.uniform(-1, 1, (6, 2, 3)).astype(np.float32)
    stackers = [FrameStacker(vector, 2) for _ in range(2)]
    seen: list[list[np.ndarray]] = [[], [], []]  # copy 0's two episodes, copy 1's one
    for t in range(5):
        for i in range(2):
            episode = 0 if i == 0 and t <= 2 else (1 if i == 0 else 2)
            fresh = t == 0 or (i == 0 and t == 3)
            stack = stackers[i].reset(frames[t, i]) if fresh else stackers[i].push(frames[t, i])
            seen[episode].append(stack)
        collector.act_vector(rollout, frames[t])
        rollout.rewards(np.zeros(2), {})
        if t == 2:  # copy 0's episode ends in a final frame; its next starts from frames[3]
            final = rng.uniform(-1, 1, 3).astype(np.float32)
            seen[0].append(stackers[0].push(final))
            collector.end_vector(rollout, 0, final, truncated=True)
    for i, episode in ((0, 1), (1, 2)):
        seen[episode].append(stackers[i].push(frames[5, i]))
    collector.cut_vector(rollout, frames[5])
    by_episode: dict[str, list[np.ndarray]] = {}
    for fragment in fragments:
        by_episode.setdefault(fragment.episode_id, []).append(fragment.obs)
    got = [
        np.concatenate([obs[:-1] for obs in chain[:-1]] + [chain[-1]])
        for chain in by_episode.values()
    ]
    want = [np.stack(s).reshape(len(s), -1) for s in seen]
    assert sorted(len(g) for g in got) == sorted(len(w) for w in want)
    for w in want:
        assert any(g.shape == w.shape and np.allclose(g, w) for g in got)
