"""Column storage of a multi-agent episode: one set of arrays per policy, one row per agent.

A simulator with hundreds of agents sends them all in one call, tick after tick. Keeping each
agent's unfinished fragment in its own Python lists costs several list appends per agent and
step; here every per-agent value is a numpy column indexed by the agent's row, and the steps of
the unfinished fragments are ``[rows, steps, ...]`` arrays, so recording a tick for all the agents
of a policy is a handful of vectorised assignments. The rules (what is checked, what a reward
belongs to, when a fragment is cut) live in :mod:`rlserve.experience.episodes`; this module only
stores.

Row ``r`` of an :class:`AgentColumns` holds one agent: ``count[r]`` steps of its unfinished
fragment are in the step buffers (``obs[r, :count[r]]``, ``actions[r, :count[r]]``, ...). Between
calls, every step but the last has its reward in ``rewards``; the last one's reward is still
being logged (``pending[r]``) and is written when the agent observes again or finishes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlserve.protocol.fragment import Fragment

FIRST_STEPS = 16
"""Steps per agent the step buffers hold at first; they double up to the fragment length."""

FIRST_ROWS = 4
"""Agents a policy's columns hold at first; they double as agents join."""


class AgentColumns:
    """The agents of one policy in one multi-agent episode.

    Args:
        policy_id: The policy acting for these agents.
        fragment_length: Steps per fragment (the most steps a row holds, plus the next
            observation).
    """

    __slots__ = (
        "_steps_cap",
        "actions",
        "chosen",
        "count",
        "done",
        "fragment_length",
        "ids",
        "infos",
        "logp",
        "obs",
        "pending",
        "pending_info",
        "policy_id",
        "returns",
        "rewards",
        "size",
        "state",
        "state_in",
        "steps",
        "versions",
    )

    def __init__(self, policy_id: str, fragment_length: int):
        self.policy_id = policy_id
        self.fragment_length = fragment_length
        self.ids: list[str] = []
        """Agent id of each row."""
        self.size = 0
        """Rows in use."""
        self.count = np.zeros(FIRST_ROWS, np.int64)
        """Steps of each row's unfinished fragment."""
        self.steps = np.zeros(FIRST_ROWS, np.int64)
        """Actions each agent took in the episode."""
        self.pending = np.zeros(FIRST_ROWS, np.float64)
        """Reward logged for each agent's last action so far."""
        self.returns = np.zeros(FIRST_ROWS, np.float64)
        """Rewards each agent received in the episode."""
        self.done = np.zeros(FIRST_ROWS, bool)
        """Agents marked done: they may not act again."""
        self._steps_cap = 0
        self.obs: np.ndarray | None = None
        """``[rows, steps + 1, *obs shape]`` float32 (allocated with the first observation)."""
        self.actions: np.ndarray | None = None
        """``[rows, steps]`` int64 or ``[rows, steps, A]`` float32 (with the first action)."""
        self.rewards = np.zeros((FIRST_ROWS, 0), np.float32)
        self.logp = np.zeros((FIRST_ROWS, 0), np.float32)
        self.chosen = np.zeros((FIRST_ROWS, 0), bool)
        self.versions = np.zeros((FIRST_ROWS, 0), np.int64)
        self.infos: dict[int, dict[int, dict[str, Any]]] = {}
        """Row -> step -> the info logged for that step (only rows and steps that have one)."""
        self.pending_info: dict[int, dict[str, Any]] = {}
        """Row -> the info logged for its last action so far."""
        self.state: np.ndarray | None = None
        """A policy with memory: ``[rows, S]`` float32, the recurrent state each agent's next
        step reads (allocated, zeros, at the first step with memory:
        :mod:`rlserve.experience.recurrent_states`); None without memory."""
        self.state_in: np.ndarray | None = None
        """``[rows, S]``: the state each row's unfinished fragment started from (its
        ``state_in``), with ``state``."""

    # -- rows ----------------------------------------------------------------------------------

    def add(self, agent_ids: list[str]) -> np.ndarray:
        """Give new agents rows; return them."""
        start, end = self.size, self.size + len(agent_ids)
        if end > self.count.shape[0]:
            self._grow_rows(max(end, 2 * self.count.shape[0]))
        self.ids.extend(agent_ids)
        self.size = end
        return np.arange(start, end)

    def _grow_rows(self, rows: int) -> None:
        def grown(array: np.ndarray) -> np.ndarray:
            out = np.zeros((rows, *array.shape[1:]), array.dtype)
            out[: self.size] = array[: self.size]
            return out

        self.count, self.steps = grown(self.count), grown(self.steps)
        self.pending, self.returns, self.done = (
            grown(self.pending),
            grown(self.returns),
            grown(self.done),
        )
        self.rewards, self.logp = grown(self.rewards), grown(self.logp)
        self.chosen, self.versions = grown(self.chosen), grown(self.versions)
        if self.obs is not None:
            self.obs = grown(self.obs)
        if self.actions is not None:
            self.actions = grown(self.actions)
        if self.state is not None and self.state_in is not None:
            self.state, self.state_in = grown(self.state), grown(self.state_in)

    def _ensure_steps(self, needed: int) -> None:
        """Make room for ``needed`` steps per row (and the observation after them)."""
        if needed <= self._steps_cap:
            return
        steps = min(max(needed, 2 * self._steps_cap, FIRST_STEPS), self.fragment_length)
        steps = max(steps, needed)

        def grown(array: np.ndarray, extra: int = 0) -> np.ndarray:
            out = np.zeros((array.shape[0], steps + extra, *array.shape[2:]), array.dtype)
            out[:, : array.shape[1]] = array
            return out

        self.rewards, self.logp = grown(self.rewards), grown(self.logp)
        self.chosen, self.versions = grown(self.chosen), grown(self.versions)
        if self.obs is not None:
            self.obs = grown(self.obs, 1)
        if self.actions is not None:
            self.actions = grown(self.actions)
        self._steps_cap = steps

    # -- steps ---------------------------------------------------------------------------------

    def add_rewards(self, rows: np.ndarray, rewards: np.ndarray) -> None:
        """Add each row's reward to its last action (and to its return)."""
        self.pending[rows] += rewards
        self.returns[rows] += rewards

    def merge_info(self, row: int, info: dict[str, Any]) -> None:
        """Add an info map to the row's last action (later keys win)."""
        pending = self.pending_info.get(row)
        self.pending_info[row] = info if pending is None else {**pending, **info}

    def close_steps(self, rows: np.ndarray) -> None:
        """The last action of these rows (each has one) has its whole reward and info."""
        last = self.count[rows] - 1
        self.rewards[rows, last] = self.pending[rows]
        self.pending[rows] = 0.0
        if self.pending_info:
            for row, step in zip(rows.tolist(), last.tolist(), strict=True):
                info = self.pending_info.pop(row, None)
                if info is not None:
                    self.infos.setdefault(row, {})[step] = info

    def write_obs(self, rows: np.ndarray, obs: np.ndarray, at: np.ndarray | None = None) -> None:
        """Write one observation per row at step ``at`` (default: after its last step)."""
        if at is None:
            at = self.count[rows]
        if self.obs is None:
            self.obs = np.zeros(
                (self.count.shape[0], self._steps_cap + 1, *obs.shape[1:]), np.float32
            )
        if rows.size:
            self._ensure_steps(int(at.max()))
        self.obs[rows, at] = obs

    def record(
        self, rows: np.ndarray, actions: np.ndarray, logp: np.ndarray, chosen: bool, version: int
    ) -> None:
        """Record the actions taken in the rows' last observations."""
        at = self.count[rows]
        if rows.size:
            self._ensure_steps(int(at.max()) + 1)
        if self.actions is None:
            dtype = np.int64 if actions.dtype.kind in "iub" else np.float32
            self.actions = np.zeros(
                (self.count.shape[0], self._steps_cap, *actions.shape[1:]), dtype
            )
        self.actions[rows, at] = actions
        self.logp[rows, at] = logp
        self.chosen[rows, at] = chosen
        self.versions[rows, at] = version
        self.count[rows] = at + 1
        self.steps[rows] += 1

    def last_obs(self, rows: np.ndarray) -> np.ndarray:
        """The observation each row's last step was taken in (each has one)."""
        assert self.obs is not None
        return self.obs[rows, self.count[rows] - 1]

    # -- fragments -----------------------------------------------------------------------------

    def take(
        self,
        rows: np.ndarray,
        steps: np.ndarray,
        episode_id: str,
        terminated: bool,
        truncated: bool,
        keep: bool,
    ) -> list[Fragment]:
        """Cut each row's first ``steps[i]`` steps as a fragment and empty the rows.

        A fragment holds its steps and the observation after them. With ``keep`` False the rows
        are only emptied (an episode that does not train).
        """
        fragments: list[Fragment] = []
        if keep and rows.size:
            assert self.obs is not None and self.actions is not None
            infos = self.infos
            states = self.state_in
            if bool((steps == steps[0]).all()):
                # The common case (agents in lockstep): one gather per column for all rows.
                n = int(steps[0])
                obs, actions = self.obs[rows, : n + 1], self.actions[rows, :n]
                rewards, logp = self.rewards[rows, :n], self.logp[rows, :n]
                chosen, versions = self.chosen[rows, :n], self.versions[rows, :n]
                for j, row in enumerate(rows.tolist()):
                    fragments.append(
                        Fragment(
                            episode_id,
                            self.ids[row],
                            self.policy_id,
                            obs[j],
                            actions[j],
                            rewards[j],
                            logp[j],
                            chosen[j],
                            versions[j],
                            terminated,
                            truncated,
                            _step_infos(infos.get(row), n),
                            None if states is None else states[row].copy(),
                        )
                    )
            else:
                for row, n in zip(rows.tolist(), steps.tolist(), strict=True):
                    fragments.append(
                        Fragment(
                            episode_id,
                            self.ids[row],
                            self.policy_id,
                            self.obs[row, : n + 1].copy(),
                            self.actions[row, :n].copy(),
                            self.rewards[row, :n].copy(),
                            self.logp[row, :n].copy(),
                            self.chosen[row, :n].copy(),
                            self.versions[row, :n].copy(),
                            terminated,
                            truncated,
                            _step_infos(infos.get(row), n),
                            None if states is None else states[row].copy(),
                        )
                    )
        self.count[rows] = 0
        if self.infos:
            for row in rows.tolist():
                self.infos.pop(row, None)
        return fragments


def _step_infos(infos: dict[int, dict[str, Any]] | None, steps: int) -> Any:
    """The per-step info list of a fragment of ``steps`` steps (None when no step has one)."""
    if not infos:
        return None
    return [infos.get(i) for i in range(steps)]


@dataclass(slots=True)
class AgentTick:
    """The agents of one multi-agent call, one part per policy group of the call.

    ``parts[g]`` is ``(columns, rows)`` of the call's group ``g``: where
    :meth:`rlserve.experience.episodes.EpisodeTable.act_agents` records that group's actions.
    """

    parts: list[tuple[AgentColumns, np.ndarray]]


@dataclass(slots=True)
class _Plan:
    """Where the agents of a recent call are (rows per group), for the next call with them."""

    agent_ids: list[str]
    policy_ids: list[str]
    parts: list[tuple[AgentColumns, np.ndarray]]


@dataclass(slots=True)
class Located:
    """The agents of a call that the episode knows, grouped by policy.

    Attributes:
        parts: ``(columns, rows, positions in the call)`` per policy that has agents here.
        unknown: Positions in the call of agents the episode does not know.
    """

    parts: list[tuple[AgentColumns, np.ndarray, np.ndarray]]
    unknown: list[int]


@dataclass(slots=True)
class EpisodeAgents:
    """The agents of a multi-agent episode: the columns of each policy, and where each agent is."""

    fragment_length: int
    columns: dict[str, AgentColumns] = field(default_factory=dict)
    where: dict[str, tuple[AgentColumns, int]] = field(default_factory=dict)
    """Agent id -> its columns and row."""
    joined: int = 0
    """Agents that joined so far (a cached plan is valid while it is unchanged)."""
    plan: _Plan | None = None
    located: tuple[list[str], int, Located] | None = None

    def __len__(self) -> int:
        return len(self.where)

    def __contains__(self, agent_id: object) -> bool:
        return agent_id in self.where

    def policy_of(self, agent_id: str) -> str | None:
        """The policy of an agent of the episode (None: not in the episode)."""
        found = self.where.get(agent_id)
        return None if found is None else found[0].policy_id

    def is_done(self, agent_id: str) -> bool:
        """Whether the agent was marked done (False for an agent not in the episode)."""
        found = self.where.get(agent_id)
        return found is not None and bool(found[0].done[found[1]])

    def known_plan(self, agent_ids: list[str], policy_ids: list[str]) -> _Plan | None:
        """The rows of the call's groups when the same agents (all known) were seen last."""
        plan = self.plan
        if plan is not None and plan.agent_ids == agent_ids and plan.policy_ids == policy_ids:
            return plan
        return None

    def remember(
        self,
        agent_ids: list[str],
        policy_ids: list[str],
        parts: list[tuple[AgentColumns, np.ndarray]],
    ) -> None:
        """Keep the rows of a call whose agents all have rows, for the next call with them."""
        self.plan = _Plan(agent_ids, policy_ids, parts)

    def join(self, policy_id: str, agent_ids: list[str]) -> tuple[AgentColumns, np.ndarray]:
        """Give new agents of ``policy_id`` rows."""
        columns = self.columns.get(policy_id)
        if columns is None:
            columns = self.columns[policy_id] = AgentColumns(policy_id, self.fragment_length)
        rows = columns.add(agent_ids)
        for agent_id, row in zip(agent_ids, rows.tolist(), strict=True):
            self.where[agent_id] = (columns, row)
        self.joined += len(agent_ids)
        return columns, rows

    def locate(self, agent_ids: list[str]) -> Located:
        """Group a call's agents by the columns they are in (remembered for the next call)."""
        cached = self.located
        if cached is not None and cached[1] == self.joined and cached[0] == agent_ids:
            return cached[2]
        by_columns: dict[int, tuple[AgentColumns, list[int], list[int]]] = {}
        unknown: list[int] = []
        where = self.where
        for i, agent_id in enumerate(agent_ids):
            found = where.get(agent_id)
            if found is None:
                unknown.append(i)
                continue
            columns, row = found
            part = by_columns.get(id(columns))
            if part is None:
                part = by_columns[id(columns)] = (columns, [], [])
            part[1].append(row)
            part[2].append(i)
        located = Located(
            [
                (columns, np.asarray(rows, np.int64), np.asarray(positions, np.int64))
                for columns, rows, positions in by_columns.values()
            ],
            unknown,
        )
        self.located = (list(agent_ids), self.joined, located)
        return located
