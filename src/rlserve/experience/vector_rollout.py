"""Array-native bookkeeping for ``N`` single-agent episodes stepped together (hosted vectors).

A hosted vector source steps all its copies at once, so their open steps are kept in
preallocated ring arrays ``[C, N, ...]`` (a row per step, a column per copy) rather than in a
list per episode: a step costs a few array writes whatever ``N`` is, and per-copy Python work is
left to the moments a fragment is cut (it fills, its episode ends, or :meth:`VectorRollout.cut`).

The rules are :class:`rlserve.experience.episodes.EpisodeTable`'s for single-agent episodes, and so
are the
fragments and summaries, for the calls the hosted runner makes:

* each step records every copy's observation and the policy's action (``policy_chosen`` True),
  then the reward (and info) the env gave for it;
* every ``fragment_length`` steps of an episode a fragment is cut, ending in the next step's
  observation; at the episode's end it ends in the final observation;
* an abandoned episode drops its last step (no observation followed it); the steps before it
  bootstrap from the observation that step was taken in;
* an episode that does not train leaves its summary only;
* with a policy with memory (``state_size > 0``), :attr:`VectorRollout.state` holds each copy's
  recurrent state, zeros at each episode's start, and every fragment's ``state_in`` is the state
  its first step read (the state at the cut for a fragment that does not start an episode).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from rlserve.errors import SpaceError
from rlserve.experience.episode_records import SINGLE_AGENT, EpisodeSummary
from rlserve.experience.frame_stacks import CopyFrames, FrameRule
from rlserve.protocol.fragment import Fragment
from rlserve.protocol.values import MAX_ABS_REWARD

__all__ = ["VectorRollout"]

_abs, _add, _le = np.abs, np.add, np.less_equal


class VectorRollout:
    """The open episodes of ``num_envs`` copies, one per copy, and their unfinished fragments.

    Call :meth:`record` then :meth:`rewards` once per step; :meth:`end` or :meth:`abandon` a
    copy's episode when it is over (its next episode starts at once, as the copy resets).

    Args:
        num_envs: How many copies.
        fragment_length: Steps of an episode per fragment.
        policy_id: The policy that acts in every episode.
        training_enabled: Whether the episodes' steps go to ``sink`` (False: summaries only).
        sink: Takes every finished fragment.
        on_summary: Takes every finished episode's summary.
        state_size: The acting policy's recurrent state width (0: no memory).
        frames: The policy's frame stacking (None: none); each copy's frames start afresh with
            its episode (:mod:`rlserve.experience.frame_stacks`).
    """

    def __init__(
        self,
        num_envs: int,
        fragment_length: int,
        policy_id: str,
        training_enabled: bool,
        sink: Callable[[Fragment], None],
        on_summary: Callable[[EpisodeSummary], None],
        state_size: int = 0,
        frames: FrameRule | None = None,
    ) -> None:
        self.num_envs = num_envs
        self.fragment_length = fragment_length
        self.policy_id = policy_id
        self.training_enabled = training_enabled
        self._sink = sink
        self._on_summary = on_summary
        # Episode ids: 32 hex digits like uuid4().hex (a third of its cost at every episode's
        # end): this rollout's random 64-bit prefix, then a counter. Unique within the rollout,
        # and between rollouts as long as two prefixes differ.
        self._id_prefix = os.urandom(8).hex()
        self._id_count = itertools.count()
        self.episode_ids: list[str] = [self._new_id() for _ in range(num_envs)]
        """The open episode of each copy."""
        # A fragment never holds more than fragment_length steps: one ring row per step.
        self._capacity = fragment_length
        self._step = 0
        """Steps recorded so far (the global step index of the next one)."""
        self._frag_start = np.zeros(num_envs, np.int64)
        self._episode_start = np.zeros(num_envs, np.int64)
        self._next_full = fragment_length
        self._returns = np.zeros(num_envs, np.float64)
        self._zeros = np.zeros(num_envs, np.float64)
        self._all_true = b"\x01" * num_envs
        self._obs: np.ndarray | None = None
        self._actions: np.ndarray | None = None
        self._logp = np.zeros((self._capacity, num_envs), np.float32)
        self._rewards = np.zeros((self._capacity, num_envs), np.float64)
        self._versions = np.zeros(self._capacity, np.int64)
        self._chosen = np.ones(self._capacity, np.bool_)
        self._infos: list[dict[int, dict[str, Any]]] = [{} for _ in range(num_envs)]
        self.state: np.ndarray | None = None
        """``[N, state_size]`` float32: the recurrent state each copy's next step reads (zeros
        at an episode's start); None for a policy without memory."""
        self._states: np.ndarray | None = None
        if state_size:
            self.state = np.zeros((num_envs, state_size), np.float32)
            self._states = np.zeros((self._capacity, num_envs, state_size), np.float32)
        self.frames = frames
        self.copy_frames = [CopyFrames() for _ in range(num_envs if frames else 0)]
        """Each copy's last frames (with ``frames``), recorded observations are their stacks."""

    def record(
        self,
        obs: np.ndarray,
        actions: np.ndarray,
        logp: np.ndarray,
        version: int,
        next_state: np.ndarray | None = None,
    ) -> None:
        """Record one step of every copy: its checked observation and the action taken in it.

        Args:
            obs: ``[N, D]`` float32 flattened observations.
            actions: ``[N]`` int64 choices or ``[N, A]`` float32 flat actions.
            logp: ``[N]`` float32 log-probability of each action.
            version: The weights version that chose them.
            next_state: With memory: the policy's output state (read from :attr:`state`),
                which becomes :attr:`state`.
        """
        step = self._step
        if step >= self._next_full:
            self._cut_full(obs)
        if self._obs is None or self._actions is None:
            self._obs = np.empty((self._capacity, *obs.shape), np.float32)
            self._actions = np.empty((self._capacity, *actions.shape), actions.dtype)
        row = step % self._capacity
        self._obs[row] = obs
        self._actions[row] = actions
        self._logp[row] = logp
        self._versions[row] = version
        if self._states is not None:
            assert self.state is not None and next_state is not None
            self._states[row] = self.state  # what this step read: a fragment's state_in
            self.state = next_state
        self._step = step + 1

    def rewards(self, rewards: np.ndarray, infos: dict[int, dict[str, Any]]) -> None:
        """Give each copy's last action its reward, and ``infos[i]`` to copy ``i``'s.

        Raises:
            SpaceError: A reward is not finite or over the bound (nothing is changed).
        """
        # Every |reward| within the bound (NaN fails): the comparison's bool array, 0 and 1
        # bytes, against all 1 bytes (cheaper than any reduction at this size); otherwise the
        # check again in full, which raises for a bad reward.
        if (
            _le(_abs(rewards), MAX_ABS_REWARD).tobytes() != self._all_true
            and not np.maximum.reduce(np.abs(rewards)) <= MAX_ABS_REWARD
        ):
            self._refuse(rewards)
        last = self._step - 1
        # + 0.0: a reward of -0.0 is stored as 0.0, as the episode table's running sum does.
        _add(rewards, self._zeros, out=self._rewards[last % self._capacity])
        self._returns += rewards
        for i, info in infos.items():
            kept = self._infos[i]
            old = kept.get(last)
            kept[last] = info if old is None else {**old, **info}

    def end(self, index: int, final_obs: np.ndarray, truncated: bool) -> None:
        """End copy ``index``'s episode in ``final_obs`` (``[D]`` float32) and start its next."""
        self._emit(index, self._step, final_obs, not truncated, truncated)
        self._close(index, "truncated" if truncated else "terminated")

    def abandon(self, index: int, reason: str) -> None:
        """Close copy ``index``'s episode without a final observation and start its next."""
        start, stop = int(self._frag_start[index]), self._step
        if stop - start > 1:
            assert self._obs is not None
            last = self._obs[(stop - 1) % self._capacity, index].copy()
            self._infos[index].pop(stop - 1, None)
            self._emit(index, stop - 1, last, False, False)
        self._close(index, reason)

    def cut(self, next_obs: np.ndarray) -> None:
        """Hand on every copy's steps so far; ``next_obs[i]`` is copy ``i``'s next observation.

        The episodes go on from ``next_obs``, the observations the next :meth:`record` gets.
        """
        for i in range(self.num_envs):
            if self._frag_start[i] < self._step:
                self._emit(i, self._step, next_obs[i], False, False)
                self._frag_start[i] = self._step
        self._next_full = int(self._frag_start.min()) + self.fragment_length

    def _cut_full(self, obs: np.ndarray) -> None:
        """Cut the fragments that hold ``fragment_length`` steps; ``obs`` follows them."""
        step = self._step
        for i in np.flatnonzero(step - self._frag_start >= self.fragment_length).tolist():
            self._emit(i, step, obs[i], False, False)
            self._frag_start[i] = step
        self._next_full = int(self._frag_start.min()) + self.fragment_length

    def _emit(
        self, index: int, stop: int, next_obs: np.ndarray, terminated: bool, truncated: bool
    ) -> None:
        """Hand on copy ``index``'s steps from its fragment start to ``stop`` (exclusive)."""
        start = int(self._frag_start[index])
        kept = self._infos[index]
        if not (self.training_enabled and stop > start):
            kept.clear()
            return
        assert self._obs is not None and self._actions is not None
        count = stop - start
        first = start % self._capacity
        # Rows in one run: a slice (copied below); wrapped round the ring: an index array.
        rows: Any = (
            slice(first, first + count)
            if first + count <= self._capacity
            else np.arange(start, stop) % self._capacity
        )
        obs = np.empty((count + 1, *self._obs.shape[2:]), np.float32)
        obs[:count] = self._obs[rows, index]
        obs[count] = next_obs
        infos = None
        if kept:
            infos = [kept.get(step) for step in range(start, stop)]
            kept.clear()
        state_in = None if self._states is None else self._states[first, index].copy()
        # Fragment's fields by position (a third of the cost of keywords for a slots dataclass):
        # episode_id, agent_id, policy_id, obs, actions, rewards, behaviour_logp, policy_chosen,
        # weights_version, terminated, truncated, infos, state_in.
        self._sink(
            Fragment(
                self.episode_ids[index],
                SINGLE_AGENT,
                self.policy_id,
                obs,
                self._actions[rows, index].copy(),
                self._rewards[rows, index].astype(np.float32),
                self._logp[rows, index].copy(),
                self._chosen[:count].copy(),  # all True (np.ones costs four times a copy)
                self._versions[rows].copy(),
                terminated,
                truncated,
                infos,
                state_in,
            )
        )

    def _close(self, index: int, reason: str) -> None:
        """Summarise copy ``index``'s episode and open its next one from the next step on."""
        step = self._step
        self._on_summary(
            EpisodeSummary(
                self.episode_ids[index],
                float(self._returns[index]),
                step - int(self._episode_start[index]),
                self.training_enabled,
                reason,
                None,
                self.policy_id,
                f"env-{index}",
            )
        )
        self.episode_ids[index] = self._new_id()
        self._returns[index] = 0.0
        self._episode_start[index] = step
        oldest = self._frag_start[index] + self.fragment_length == self._next_full
        self._frag_start[index] = step
        self._infos[index].clear()
        if self.state is not None:
            self.state[index] = 0.0  # the copy's next episode starts from zeros
        if self.frames is not None:
            self.copy_frames[index].frames = None  # its next frame fills the stack
        if oldest:  # only then can the next fill come later
            self._next_full = int(self._frag_start.min()) + self.fragment_length

    def _new_id(self) -> str:
        """A new episode id (32 hex digits)."""
        return f"{self._id_prefix}{next(self._id_count):016x}"

    def _refuse(self, rewards: np.ndarray) -> None:
        """Raise the episode table's error for the first reward out of range."""
        bad = int(np.flatnonzero(~(np.abs(rewards) <= MAX_ABS_REWARD))[0])
        reward = float(rewards[bad])
        raise SpaceError(
            f"log_returns for episode '{self.episode_ids[bad]}': reward {reward!r} is out of "
            f"range; a reward must be a finite number within "
            f"-{MAX_ABS_REWARD:g}..{MAX_ABS_REWARD:g}"
        )
