"""The per-episode frame stacks of a policy with frame_stack N (experience/frame_stacks.py)."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium import spaces

from rlserve.env import FrameStacker
from rlserve.errors import ConfigError, EpisodeError
from rlserve.experience.episode_records import Episode
from rlserve.experience.frame_stacks import CopyFrames, FrameRule

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
    with pytest.raises(EpisodeError, match=r"serve the policy with frame_stack=1"):
        FrameRule(FRAME, 2).refuse_agents("default")
