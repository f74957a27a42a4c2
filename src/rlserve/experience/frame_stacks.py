"""The stacked frames of the episodes of a policy with ``frame_stack`` N > 1: where they live.

Such a policy reads the last N frames of its episode stacked (the layout of
:mod:`rlserve.policy.frame_stacking`), while its clients send single frames, checked against the
declared (one frame's) space. The rules, for every source that keeps episodes in an
:class:`~rlserve.experience.episodes.EpisodeTable` (the server in remote mode, a local-inference
client, the hosted collector):

* an episode's first observation fills its stack with N copies of that frame;
* each later observation (``get_action``, ``log_action``, ``end_episode``) drops the oldest frame
  and appends the new one; what is recorded, acted on and handed on in fragments is the stack;
* the frames live in the episode's record (``Episode.frames``, flattened, oldest first) and are
  dropped with it; a server restart loses them with the episode (``EpisodeLostError``);
* a refused call leaves them as they were: :meth:`FrameRule.next` computes, :meth:`FrameRule.keep`
  stores once the step is recorded.

The hosted vector path keeps a :class:`CopyFrames` per copy instead of an episode record, emptied
when the copy's episode ends. Multi-agent episodes do not stack frames yet
(:meth:`FrameRule.refuse_agents`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from gymnasium import spaces

from rlserve.errors import EpisodeError
from rlserve.policy.frame_stacking import flat_order, stacked_space


class HoldsFrames(Protocol):
    """What keeps one episode's frames (an ``Episode``, or a hosted vector copy's)."""

    frames: np.ndarray | None


@dataclass(slots=True)
class CopyFrames:
    """The frames of a hosted vector copy's current episode (None: its next frame is a first)."""

    frames: np.ndarray | None = None


class FrameRule:
    """Stacks one policy's flattened frames per episode.

    Args:
        space: One frame's space (a Box).
        n: Frames per observation (2 or more).

    Raises:
        ConfigError: As :func:`~rlserve.policy.frame_stacking.stacked_space`.
    """

    def __init__(self, space: spaces.Space[Any], n: int) -> None:
        self.space = stacked_space(space, n)
        """The policy's (stacked) observation space."""
        self.n = n
        self._size = int(np.prod(space.shape))  # type: ignore[arg-type]
        self._order = flat_order(space, n)

    @classmethod
    def of(cls, space: spaces.Space[Any], n: int) -> FrameRule | None:
        """The rule of ``n`` frames of ``space``; None for ``n == 1`` (no stacking)."""
        return None if n == 1 else cls(space, n)

    def next(
        self, episodes: Sequence[HoldsFrames], obs: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """The episodes' frames after ``obs`` (``[B, D]`` checked, flattened frames).

        Returns:
            ``(frames, stacked)``: the new frames to :meth:`keep` (``[B, N*D]``, oldest first)
            and the stacked observations to record and act on (``[B, N*D]``).
        """
        size = self._size
        frames = np.empty((len(episodes), self.n * size), np.float32)
        for i, episode in enumerate(episodes):
            held = episode.frames
            if held is None:
                frames[i] = np.tile(obs[i], self.n)
            else:
                frames[i, :-size] = held[size:]
                frames[i, -size:] = obs[i]
        stacked = frames if self._order is None else frames[:, self._order]
        return frames, stacked

    def keep(self, episodes: Sequence[HoldsFrames], frames: np.ndarray) -> None:
        """Store the frames :meth:`next` computed, once their steps are recorded."""
        for i, episode in enumerate(episodes):
            episode.frames = frames[i]

    def stack(self, episodes: Sequence[HoldsFrames], obs: np.ndarray) -> np.ndarray:
        """:meth:`next` and :meth:`keep` at once, for a call that cannot be refused after it."""
        frames, stacked = self.next(episodes, obs)
        self.keep(episodes, frames)
        return stacked

    def refuse_agents(self, policy_id: str) -> None:
        """Refuse a multi-agent call for this policy.

        Raises:
            EpisodeError: Always; the message names the fix.
        """
        raise EpisodeError(
            f"policy '{policy_id}' stacks {self.n} frames (frame_stack), which multi-agent "
            "episodes do not support yet; stack the frames in the client "
            "(rlserve.env.FrameStacker) and serve the policy with frame_stack=1"
        )
