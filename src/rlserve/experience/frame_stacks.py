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
when the copy's episode ends. A multi-agent episode keeps each agent's frames under its agent id
(``Episode.agent_frames``): an agent's first observation fills its stack, and the calls stack
group by group with :func:`stack_agents` (policies without frame stacking cost nothing).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from gymnasium import spaces

from rlserve.experience.agent_groups import AgentGrouper, Grouping, rows_of
from rlserve.policy.frame_stacking import flat_order, stacked_space


class HoldsFrames(Protocol):
    """What keeps one episode's frames (an ``Episode``, or a hosted vector copy's)."""

    frames: np.ndarray | None


class HoldsAgentFrames(Protocol):
    """What keeps a multi-agent episode's frames by agent id (an ``Episode``)."""

    agent_frames: dict[str, np.ndarray] | None


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
        return self._next([episode.frames for episode in episodes], obs)

    def _next(
        self, previous: Sequence[np.ndarray | None], obs: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        size = self._size
        frames = np.empty((len(previous), self.n * size), np.float32)
        for i, held in enumerate(previous):
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

    def next_agents(
        self, held: dict[str, np.ndarray], agent_ids: Sequence[str], obs: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`next` for agents of a multi-agent episode, their frames ``held`` by agent id."""
        return self._next([held.get(agent_id) for agent_id in agent_ids], obs)


@dataclass(slots=True)
class AgentStacks:
    """A multi-agent call's observations stacked group by group, and the frames to keep.

    Attributes:
        blocks: Each group's ``[k, N*D]`` stacked observations (a group of a policy without
            frame stacking: its block as it was).
    """

    blocks: list[np.ndarray]
    _updates: list[tuple[list[str], np.ndarray]]

    def keep(self, episode: HoldsAgentFrames) -> None:
        """Store the agents' new frames in the episode, once the call is recorded."""
        held = episode.agent_frames
        if held is None:
            held = episode.agent_frames = {}
        for agent_ids, frames in self._updates:
            for i, agent_id in enumerate(agent_ids):
                held[agent_id] = frames[i]


def stack_agents(
    rules: Callable[[str], FrameRule | None],
    episode: HoldsAgentFrames,
    agent_ids: Sequence[str],
    groups: Sequence[tuple[str, np.ndarray]],
    blocks: list[np.ndarray],
) -> AgentStacks | None:
    """Stack a multi-agent call's observations for the groups whose policy stacks frames.

    Args:
        rules: A policy id's frame rule (None: no stacking).
        episode: The episode (its frames by agent id).
        agent_ids: The call's agents.
        groups: ``(policy_id, positions in agent_ids)`` per group.
        blocks: Each group's ``[k, D]`` checked, flattened single frames.

    Returns:
        The stacked blocks and the frames to :meth:`AgentStacks.keep`; None when no group's
        policy stacks frames.
    """
    stacked: list[np.ndarray] | None = None
    updates: list[tuple[list[str], np.ndarray]] = []
    for g, (policy_id, idx) in enumerate(groups):
        rule = rules(policy_id)
        if rule is None:
            continue
        if stacked is None:
            stacked = list(blocks)
        ids = [agent_ids[i] for i in idx.tolist()]
        frames, stacked[g] = rule.next_agents(episode.agent_frames or {}, ids, blocks[g])
        updates.append((ids, frames))
    return None if stacked is None else AgentStacks(stacked, updates)


def final_rows(
    grouper: AgentGrouper,
    rules: Callable[[str], FrameRule | None],
    episode: HoldsAgentFrames,
    grouping: Grouping,
    agent_ids: list[str],
    values: Any,
    where: str,
) -> list[Any]:
    """The checked final observations of an ending multi-agent call, one row per agent.

    As :meth:`~rlserve.experience.agent_groups.AgentGrouper.observations`, with the agents of
    a policy that stacks frames given their stack (nothing is kept: the episode ends).

    Raises:
        SpaceError: As :meth:`~rlserve.experience.agent_groups.AgentGrouper.observations`.
    """
    blocks = grouper.blocks(grouping, agent_ids, values, where)
    stacks = stack_agents(rules, episode, agent_ids, grouping.groups, blocks)
    return rows_of(grouping, blocks if stacks is None else stacks.blocks, len(agent_ids))
