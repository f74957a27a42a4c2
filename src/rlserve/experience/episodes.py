"""Episode bookkeeping: turns the stream of client calls into trajectory fragments.

The rules (the seed's semantics, plus truncation):

* ``start_episode`` opens an episode; an id that is active or was used before is an error.
* An episode belongs to the owner (client identity) that started it; another owner's call for it
  is an error.
* Calls may carry a per-episode sequence number ``seq`` (1, 2, 3, ...): a call with the next
  number is applied; a repeat of the last number is a retry, answered with the first answer and
  not applied again (:meth:`EpisodeTable.check_seq`); any other number is an error.
* ``get_action`` / ``log_action`` record an observation and then an action. The reward logged
  since the previous action (``log_returns`` calls plus the ``reward`` field) belongs to that
  previous action; none logged means 0.0. A reward before the episode's first action has no action
  to belong to: it counts in the episode's return and is trained on with no step.
* An ``info`` map logged with a reward belongs to the same step; several before the next action
  merge (later keys replace earlier ones). It is kept in the fragment's ``infos``. An info before
  the first action has no step and is not kept.
* A reward must be finite and, with the rewards logged since the previous action, within
  ``±MAX_ABS_REWARD``: the call that logged it is refused (nothing is changed).
* ``log_action`` records the given action as the one taken (``policy_chosen`` False).
* ``end_episode`` records the final observation; the episode terminated, or with
  ``truncated=True`` was cut short so the learner bootstraps from that observation.
* An episode with ``training_enabled=False`` is served and counted in metrics but its steps never
  reach a learner.
* Every ``fragment_length`` actions the steps so far are handed on as a :class:`Fragment` whose
  last observation is the next step's (the learner bootstraps from it), so learning never waits
  for an episode to end.
* An episode silent for longer than the idle timeout is closed and counted; its unfinished steps
  are handed on as a truncated-free fragment (bootstrapped) so nothing collected is lost.

Bookkeeping is per (episode, agent) underneath: a single-agent episode keeps its steps in lists
(:class:`AgentTrajectory`), a multi-agent episode its agents in columns, one set of arrays per
policy (:mod:`rlserve.experience.agent_columns`), so that a call with hundreds of agents costs a
few numpy
operations per policy rather than a few Python operations per agent.
"""

from __future__ import annotations

import enum
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlserve.errors import CapacityError, EpisodeError, SpaceError
from rlserve.experience.agent_columns import AgentColumns, AgentTick, EpisodeAgents, Located
from rlserve.protocol.fragment import Fragment
from rlserve.protocol.values import MAX_ABS_REWARD

SINGLE_AGENT = "agent0"
"""The agent id of a single-agent episode."""


_SINGLE_AGENT_CALLS = frozenset({"get_action/log_action", "log_returns", "end_episode"})
"""The names the single-agent paths give :meth:`EpisodeTable._check_not_awaiting`."""


class EpisodeStatus(enum.Enum):
    """Lifecycle of an episode: ACTIVE -> (AWAITING_ACTION <-> ACTIVE) -> ENDED."""

    ACTIVE = "active"
    AWAITING_ACTION = "awaiting_action"
    ENDED = "ended"


@dataclass(slots=True)
class EpisodeSummary:
    """What an episode leaves behind for the metrics once it ends."""

    episode_id: str
    episode_return: float
    length: int
    training_enabled: bool
    reason: str  # "terminated", "truncated" or "idle_timeout"
    policy_returns: dict[str, float] | None = None
    """Multi-agent episodes: the return of each policy (summed over the agents it acted for);
    None for a single-agent episode (its one policy's return is ``episode_return``)."""
    policy_id: str = "default"
    """The policy of a single-agent episode."""


@dataclass(slots=True)
class AgentTrajectory:
    """The unfinished fragment of a single-agent episode: lists grow per step, emptied on each cut.

    (The agents of a multi-agent episode are stored column by column instead:
    :class:`rlserve.experience.agent_columns.EpisodeAgents`.)
    """

    obs: list[np.ndarray] = field(default_factory=list)
    actions: list[Any] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    logp: list[float] = field(default_factory=list)
    chosen: list[bool] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    pending_reward: float = 0.0
    infos: dict[int, dict[str, Any]] = field(default_factory=dict)
    """Step index (within the fragment) -> the info logged for it; only steps that have one."""
    pending_info: dict[str, Any] | None = None


@dataclass(slots=True)
class Episode:
    """One episode's state."""

    episode_id: str
    policy_id: str
    owner: str
    training_enabled: bool
    last_seen: float
    status: EpisodeStatus = EpisodeStatus.ACTIVE
    episode_return: float = 0.0
    length: int = 0
    agent: AgentTrajectory = field(default_factory=AgentTrajectory)
    seq: int = 0
    """Sequence number of the last call applied (0: none, or calls without ``seq``)."""
    seq_call: str = ""
    """The kind of that call (``get_action``, ``log_action``, ``log_returns``)."""
    answer: Any = None
    """What that call answered (the action of a ``get_action``), for a retry of it."""
    agents: EpisodeAgents | None = None
    """The agents of a multi-agent episode (None: a single-agent episode, see ``agent``).
    An episode becomes multi-agent with its first call that names agents."""


@dataclass(frozen=True, slots=True)
class _Ended:
    """What is remembered of an ended episode: who owned it and the seq of its ``end_episode``."""

    owner: str
    end_seq: int


class EpisodeTable:
    """All active episodes of a server, and the ids used before.

    Args:
        fragment_length: Actions per fragment before it is cut and handed on.
        max_episodes: Most concurrent episodes on the server.
        max_per_owner: Most concurrent episodes one owner (client identity) may hold.
        on_fragment: Called with each finished fragment of a training episode.
        clock: Monotonic time source (seconds).
    """

    def __init__(
        self,
        fragment_length: int,
        max_episodes: int,
        max_per_owner: int,
        on_fragment: Callable[[Fragment], None],
        clock: Callable[[], float] = time.monotonic,
    ):
        self.fragment_length = fragment_length
        self.max_episodes = max_episodes
        self.max_per_owner = max_per_owner
        self._on_fragment = on_fragment
        self._clock = clock
        self._active: dict[str, Episode] = {}
        # Ended ids are remembered so a reused id is refused and a retried end_episode is
        # recognised; bounded so it cannot grow forever.
        self._ended: dict[str, _Ended] = {}
        self._max_remembered = 1_000_000
        self._per_owner: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._active)

    def start(
        self, episode_id: str | None, training_enabled: bool, policy_id: str, owner: str
    ) -> str:
        """Open an episode and return its id.

        Raises:
            EpisodeError: The id is active or was used before.
            CapacityError: The server or this owner has too many episodes open.
        """
        if episode_id is None:
            episode_id = uuid.uuid4().hex
        elif episode_id in self._active:
            raise EpisodeError(
                f"episode '{episode_id}' is already active; end it first or use a new id"
            )
        elif episode_id in self._ended:
            raise EpisodeError(
                f"episode id '{episode_id}' was used before; episode ids are single-use"
            )
        if len(self._active) >= self.max_episodes:
            raise CapacityError(
                f"the server holds {len(self._active)} episodes, its limit; end episodes or raise "
                "max_episodes_per_server"
            )
        held = self._per_owner.get(owner, 0)
        if held >= self.max_per_owner:
            raise CapacityError(
                f"this client holds {held} open episodes, its limit; end episodes or raise "
                "max_episodes_per_client"
            )
        self._per_owner[owner] = held + 1
        self._active[episode_id] = Episode(
            episode_id, policy_id, owner, training_enabled, self._clock()
        )
        return episode_id

    def started_unused(self, episode_id: str, owner: str) -> bool:
        """Whether ``owner`` started this active episode and has not used it yet.

        A repeated ``start_episode`` of such an episode (a retry after a lost reply) is answered
        as started.
        """
        episode = self._active.get(episode_id)
        return (
            episode is not None
            and episode.owner == owner
            and episode.length == 0
            and episode.status is EpisodeStatus.ACTIVE
            and not episode.agent.obs
        )

    def owned(self, episode_id: str, owner: str) -> Episode:
        """The active episode with this id, if ``owner`` started it.

        Raises:
            EpisodeError: Unknown, already ended, or started by another owner.
        """
        episode = self.get(episode_id)
        if episode.owner != owner:
            raise EpisodeError(
                f"episode '{episode_id}' belongs to another client; a client may only act in "
                "the episodes it started (reconnect with the same client_id to continue yours)"
            )
        return episode

    def ended(self, episode_id: str) -> bool:
        """Whether this id belonged to an episode that has ended (and is still remembered)."""
        return episode_id in self._ended

    def ended_by(self, episode_id: str, owner: str, seq: int | None) -> bool:
        """Whether ``owner`` ended this episode with ``end_episode`` number ``seq`` (a retry)."""
        ended = self._ended.get(episode_id)
        return (
            seq is not None and ended is not None and ended.owner == owner and ended.end_seq == seq
        )

    def check_seq(self, episode: Episode, seq: int | None, call: str) -> bool:
        """Check a call's sequence number; True when it repeats the last call (a retry).

        Args:
            episode: The episode.
            seq: The call's ``seq``, or None (not tracked: always applied).
            call: The call's kind (``get_action``, ``log_action``, ``log_returns``,
                ``end_episode``).

        Raises:
            EpisodeError: ``seq`` is neither the next number nor a retry of the last call.
        """
        if seq is None or seq == episode.seq + 1:
            return False
        if seq == episode.seq and call == episode.seq_call:
            return True
        if seq == episode.seq:
            raise EpisodeError(
                f"{call} seq {seq} for episode '{episode.episode_id}' repeats the number of its "
                f"{episode.seq_call}; each call of an episode takes the next number"
            )
        raise EpisodeError(
            f"{call} seq {seq} for episode '{episode.episode_id}' is out of order: the next "
            f"call is {episode.seq + 1} (or {episode.seq} to retry the last one); number an "
            "episode's calls 1, 2, 3, ... and re-send a call only with its own number"
        )

    @staticmethod
    def record_seq(episode: Episode, seq: int | None, call: str, answer: Any = None) -> None:
        """Remember that call number ``seq`` was applied and what it answered."""
        if seq is not None:
            episode.seq, episode.seq_call, episode.answer = seq, call, answer

    def get(self, episode_id: str) -> Episode:
        """The active episode with this id.

        Raises:
            EpisodeError: Unknown or already ended.
        """
        episode = self._active.get(episode_id)
        if episode is None:
            if episode_id in self._ended:
                raise EpisodeError(f"episode '{episode_id}' has ended; start a new episode")
            raise EpisodeError(
                f"unknown episode '{episode_id}'; call start_episode first (after a server "
                "restart, episodes that were open are gone: start new ones)"
            )
        return episode

    def check_observe(
        self, episode: Episode, reward: float | None, call: str = "get_action"
    ) -> None:
        """Raise the error :meth:`observe` would raise, without changing anything."""
        self._check_not_awaiting(episode, "get_action/log_action")
        if (
            reward
            and not -MAX_ABS_REWARD <= episode.agent.pending_reward + reward <= MAX_ABS_REWARD
        ):
            self.check_reward(episode, reward, call)  # raises, naming the value

    def observe(
        self,
        episode: Episode,
        obs: np.ndarray,
        reward: float | None,
        info: dict[str, Any] | None = None,
        call: str = "get_action",
    ) -> None:
        """Record the observation that an action is about to be taken in.

        ``reward`` and ``info`` belong to the previous action (see the module docstring).

        Raises:
            EpisodeError: The episode is waiting for the action of an earlier observation.
            SpaceError: The reward is not finite or over the bound.
        """
        self._check_not_awaiting(episode, "get_action/log_action")
        agent = episode.agent
        if reward is not None:
            self._add_reward(episode, reward, call)
        if info:
            self._add_info(episode, info)
        if agent.actions:
            self._close_step(agent)
            if len(agent.actions) >= self.fragment_length:
                self._emit(episode, obs, terminated=False, truncated=False)
        agent.obs.append(obs)
        episode.status = EpisodeStatus.AWAITING_ACTION
        episode.last_seen = self._clock()

    def act(self, episode: Episode, action: Any, logp: float, chosen: bool, version: int) -> None:
        """Record the action taken for the last observed step."""
        agent = episode.agent
        agent.actions.append(action)
        agent.logp.append(logp)
        agent.chosen.append(chosen)
        agent.versions.append(version)
        episode.length += 1
        episode.status = EpisodeStatus.ACTIVE
        # Idle time counts from the answer: a client cannot act before it has its action.
        episode.last_seen = self._clock()

    def observe_act_many(
        self,
        episodes: list[Episode],
        obs: np.ndarray,
        actions: list[Any],
        logp: list[float],
        version: int,
    ) -> None:
        """:meth:`observe` (no reward, no info) then :meth:`act` (chosen) for each episode.

        The batched hot path of a vector of single-agent episodes; the caller has run
        :meth:`check_observe` on every episode first, so nothing here can raise.
        """
        fragment_length = self.fragment_length
        now = self._clock()
        active = EpisodeStatus.ACTIVE
        for episode, row, action, lp in zip(episodes, obs, actions, logp, strict=True):
            agent = episode.agent
            if agent.actions:
                agent.rewards.append(agent.pending_reward)
                agent.pending_reward = 0.0
                if agent.pending_info is not None:
                    agent.infos[len(agent.rewards) - 1] = agent.pending_info
                    agent.pending_info = None
                if len(agent.actions) >= fragment_length:
                    self._emit(episode, row, terminated=False, truncated=False)
            agent.obs.append(row)
            agent.actions.append(action)
            agent.logp.append(lp)
            agent.chosen.append(True)
            agent.versions.append(version)
            episode.length += 1
            episode.status = active
            episode.last_seen = now

    def log_returns_many(self, episodes: list[Episode], rewards: list[float]) -> None:
        """:meth:`log_returns` without info for each episode (the same checks and errors)."""
        now = self._clock()
        for episode, reward in zip(episodes, rewards, strict=True):
            agent = episode.agent
            if (
                episode.agents is not None
                or episode.status is EpisodeStatus.AWAITING_ACTION
                or not -MAX_ABS_REWARD <= agent.pending_reward + reward <= MAX_ABS_REWARD
            ):
                self.log_returns(episode, reward)  # raises, naming the problem
                continue
            episode.episode_return += reward
            if episode.length:
                agent.pending_reward += reward
            episode.last_seen = now

    def log_returns(
        self, episode: Episode, reward: float, info: dict[str, Any] | None = None
    ) -> None:
        """Add reward (and info) to the previous action; before the first action, to the return.

        Raises:
            EpisodeError: An action is being computed.
            SpaceError: The reward is not finite or over the bound.
        """
        self._check_not_awaiting(episode, "log_returns")
        self._add_reward(episode, reward, "log_returns")
        if info:
            self._add_info(episode, info)
        episode.last_seen = self._clock()

    def end(
        self,
        episode: Episode,
        obs: np.ndarray,
        truncated: bool,
        reward: float | None,
        seq: int | None = None,
        info: dict[str, Any] | None = None,
    ) -> EpisodeSummary:
        """Close the episode with its final observation and hand on its last fragment.

        ``seq`` (the call's sequence number) is remembered with the ended id, so a retry of this
        ``end_episode`` is recognised (:meth:`ended_by`).
        """
        self._check_not_awaiting(episode, "end_episode")
        if reward is not None:
            self._add_reward(episode, reward, "end_episode")
        if info:
            self._add_info(episode, info)
        agent = episode.agent
        if agent.actions:
            self._close_step(agent)
            self._emit(episode, obs, terminated=not truncated, truncated=truncated)
        return self._close(episode, "truncated" if truncated else "terminated", seq or 0)

    def expire_idle(self, idle_timeout: float) -> list[EpisodeSummary]:
        """Close episodes silent for longer than ``idle_timeout`` seconds.

        Their collected steps are handed on as an unfinished fragment (the learner bootstraps
        from the last observation), so a dead client loses nothing it had reported.
        """
        now = self._clock()
        # An episode awaiting its action waits on the server (e.g. for the first weights), not
        # on its client, so it is never idle.
        stale = [
            e
            for e in self._active.values()
            if now - e.last_seen > idle_timeout and e.status is EpisodeStatus.ACTIVE
        ]
        summaries = []
        for episode in stale:
            if episode.agents is None:
                self._emit_unfinished(episode)
            else:
                for columns in episode.agents.columns.values():
                    left = np.flatnonzero(~columns.done[: columns.size])
                    self._hand_on_unfinished(episode, columns, left)
            summaries.append(self._close(episode, "idle_timeout"))
        return summaries

    def cut(self, episode: Episode, next_obs: np.ndarray) -> None:
        """Hand on a single-agent episode's steps so far as a fragment ending in ``next_obs``.

        The episode goes on; ``next_obs`` is the observation its next ``observe`` will record.
        A synchronous trainer cuts every episode at the end of a sampling round, so each round's
        batch holds only steps of the weights it was sampled with.
        """
        agent = episode.agent
        if agent.actions:
            self._close_step(agent)
            self._emit(episode, next_obs, terminated=False, truncated=False)

    def abandon(self, episode: Episode, reason: str) -> EpisodeSummary:
        """Close an episode that cannot go on (its environment crashed or hung).

        No final observation exists: the steps collected so far are handed on as at idle
        expiry (the last one dropped, the rest bootstrapping from its observation).
        """
        if episode.agents is None:
            self._emit_unfinished(episode)
        else:
            for columns in episode.agents.columns.values():
                left = np.flatnonzero(~columns.done[: columns.size])
                self._hand_on_unfinished(episode, columns, left)
        return self._close(episode, reason)

    def _emit_unfinished(self, episode: Episode) -> None:
        """Hand on the steps of a single-agent episode that stopped without a next observation.

        No observation followed its last action, so that one step cannot be used; the steps
        before it bootstrap from the observation the last action was taken in.
        """
        agent = episode.agent
        if len(agent.actions) > 1:
            last_obs = agent.obs.pop()
            for steps in (agent.actions, agent.logp, agent.chosen, agent.versions):
                steps.pop()
            agent.infos.pop(len(agent.actions), None)
            del agent.rewards[len(agent.actions) :]
            self._emit(episode, last_obs, False, False)
        else:
            agent.obs, agent.actions, agent.rewards = [], [], []
            agent.logp, agent.chosen, agent.versions = [], [], []
            agent.infos = {}

    # -- multi-agent episodes ----------------------------------------------------------------
    # The same rules, per agent: each agent's reward belongs to its own previous action, each
    # agent's steps become its own fragments (with its policy id), and an episode is one call at
    # a time. Agents join with their first observation and act at their own pace. The agents of
    # each policy are stored column by column (rlserve.experience.agent_columns), so a call's
    # agents are
    # checked and recorded with a few numpy operations per policy; when a check fails, the agents
    # are checked again one by one in the call's order so the error names the first of them.

    def observe_agents(
        self,
        episode: Episode,
        agent_ids: list[str],
        policy_ids: list[str],
        groups: list[tuple[str, np.ndarray]],
        obs: list[np.ndarray],
        rewards: Any,
        infos: list[dict[str, Any] | None] | None,
        call: str = "get_action",
    ) -> AgentTick:
        """Check, then record, the observations the named agents are about to act in.

        Args:
            episode: The episode.
            agent_ids: The call's agents.
            policy_ids: Each agent's policy, in the call's order.
            groups: ``(policy id, positions in the call)`` of each policy's agents (as
                :meth:`rlserve.experience.agent_groups.AgentGrouper.group` makes them).
            obs: Per group, its agents' flattened float32 observations ``[k, D]``.
            rewards: Each agent's reward for its previous action (call order), or None.
            infos: Each agent's info for its previous action (call order), or None.
            call: The call's name for error messages.

        Returns:
            Where :meth:`act_agents` records each group's actions.

        Raises:
            EpisodeError: The episode is single-agent or awaiting an action; an agent is done,
                or changes its policy; a reward names an agent that has not acted yet.
            SpaceError: A reward is out of range. Nothing is changed when it raises.
        """
        self._check_multi(episode, call)
        state = episode.agents
        reward_array = None if rewards is None else np.asarray(rewards, dtype=np.float64)
        plan = None if state is None else state.known_plan(agent_ids, policy_ids)
        if plan is not None:
            parts, mismatch = plan.parts, False
        else:
            parts, mismatch = _find_rows(state, agent_ids, groups)
        if mismatch or _tick_refused(parts, groups, reward_array):
            self._check_agents_one_by_one(episode, agent_ids, policy_ids, rewards, call)
        if state is None:
            state = episode.agents = EpisodeAgents(self.fragment_length)
        if plan is None:
            for g, (policy_id, idx) in enumerate(groups):
                columns, rows = parts[g]
                missing = rows < 0
                if missing.any():
                    new_ids = [agent_ids[i] for i in idx[missing].tolist()]
                    columns, new_rows = state.join(policy_id, new_ids)
                    rows = rows.copy()
                    rows[missing] = new_rows
                    parts[g] = (columns, rows)
            state.remember(list(agent_ids), list(policy_ids), parts)
        single = len(groups) == 1
        rewarded = reward_array is not None and bool(reward_array.any())
        for g, (_, idx) in enumerate(groups):
            columns, rows = parts[g]
            if rewarded:
                assert reward_array is not None
                columns.add_rewards(rows, reward_array if single else reward_array[idx])
            if infos is not None:
                for row, i in zip(rows.tolist(), idx.tolist(), strict=True):
                    info = infos[i]
                    if info and columns.steps[row]:
                        columns.merge_info(row, info)
            block = obs[g]
            acted = np.flatnonzero(columns.count[rows] > 0)
            if acted.size:
                closing = rows[acted]
                columns.close_steps(closing)
                full = np.flatnonzero(columns.count[closing] >= self.fragment_length)
                if full.size:
                    # A full fragment ends in this observation (the learner bootstraps from it).
                    cut = closing[full]
                    columns.write_obs(cut, block[acted[full]])
                    self._hand_on(episode, columns, cut, columns.count[cut], False, False)
            columns.write_obs(rows, block)
        if rewarded:
            assert reward_array is not None
            episode.episode_return += float(reward_array.sum())
        episode.status = EpisodeStatus.AWAITING_ACTION
        episode.last_seen = self._clock()
        return AgentTick(parts)

    def act_agents(
        self,
        episode: Episode,
        tick: AgentTick,
        group: int,
        actions: Any,
        logps: Any,
        chosen: bool,
        version: int,
    ) -> None:
        """Record the actions of one group of the last :meth:`observe_agents`.

        ``actions`` are the group's actions as the learner trains on them (``[k]`` choice
        indices, or ``[k, A]`` floats), ``logps`` their behaviour log-probabilities. One group
        at a time; :meth:`finish_tick` once every group has its actions.
        """
        columns, rows = tick.parts[group]
        columns.record(
            rows, np.asarray(actions), np.asarray(logps, dtype=np.float32), chosen, version
        )

    def finish_tick(self, episode: Episode) -> None:
        """Every agent of the last :meth:`observe_agents` has its action: one more step."""
        episode.length += 1
        episode.status = EpisodeStatus.ACTIVE
        episode.last_seen = self._clock()

    def log_returns_agents(
        self,
        episode: Episode,
        agent_ids: list[str],
        rewards: Any,
        infos: list[dict[str, Any] | None] | None,
        done: dict[str, bool],
    ) -> None:
        """Add each agent's reward (and info) to its previous action; finish the done agents.

        ``done`` maps an agent id to ``True`` (terminated) or ``False`` for an agent cut short
        (truncated): its steps go to its policy now, and it may not act again. A truncated agent
        has no next observation to bootstrap from, so its last step is dropped and the steps
        before it bootstrap from the observation of that last step (as for an idle episode).
        A zero reward or an info for an agent that has not acted has no step and is not kept.
        Nothing is changed when any of it is refused.

        Raises:
            EpisodeError: The episode is single-agent or awaiting an action; a reward names an
                agent that has not acted or is done; a done agent is unknown or already done.
            SpaceError: A reward is out of range.
        """
        self._check_multi(episode, "log_returns")
        state = episode.agents
        reward_array = np.asarray(rewards, dtype=np.float64)
        located = _locate(state, agent_ids)
        if _rewards_refused(located, reward_array) or _done_refused(state, done):
            self._check_rewards_one_by_one(episode, agent_ids, rewards, "log_returns")
            self._check_done_one_by_one(episode, done)
        self._add_agent_rewards(episode, located, reward_array, infos)
        if state is not None:
            for agent_id, terminated in done.items():
                columns, row = state.where[agent_id]
                self._finish_rows(episode, columns, np.array([row]), None, terminated)
        episode.last_seen = self._clock()

    def end_agents(
        self,
        episode: Episode,
        agent_ids: list[str],
        obs: Any,
        rewards: Any,
        infos: list[dict[str, Any] | None] | None,
        truncated: bool,
        seq: int | None = None,
    ) -> EpisodeSummary:
        """End a multi-agent episode: every agent not yet done finishes.

        ``obs[i]`` is agent ``agent_ids[i]``'s final observation (what a truncated agent
        bootstraps from); an agent left out finishes as in :meth:`log_returns_agents`. An agent
        named here that never acted has no steps: its observation is not kept.

        Raises:
            EpisodeError / SpaceError: As :meth:`log_returns_agents`; nothing is changed.
        """
        self._check_multi(episode, "end_episode")
        state = episode.agents
        located = _locate(state, agent_ids)
        reward_array = None if rewards is None else np.asarray(rewards, dtype=np.float64)
        if _done_named(located) or (
            reward_array is not None and _rewards_refused(located, reward_array)
        ):
            self._check_end_one_by_one(episode, agent_ids, rewards)
        state = self._agents(episode)
        if reward_array is not None:
            self._add_agent_rewards(episode, located, reward_array, infos)
        elif infos is not None:
            self._add_agent_rewards(episode, located, np.zeros(len(agent_ids)), infos)
        terminated = not truncated
        finals: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for columns, rows, positions in located.parts:
            if isinstance(obs, np.ndarray):
                block = obs[positions]
            else:
                block = np.stack([obs[i] for i in positions.tolist()])
            finals[id(columns)] = (rows, block)
        for columns in state.columns.values():
            left = ~columns.done[: columns.size]
            given = finals.get(id(columns))
            if given is not None:
                rows, block = given
                left[rows] = False
                self._finish_rows(episode, columns, rows, block, terminated)
            self._finish_rows(episode, columns, np.flatnonzero(left), None, terminated)
        return self._close(episode, "truncated" if truncated else "terminated", seq or 0)

    def _agents(self, episode: Episode) -> EpisodeAgents:
        """The agents of a multi-agent episode; an unused episode becomes multi-agent here."""
        if episode.agents is None:
            episode.agents = EpisodeAgents(self.fragment_length)
        return episode.agents

    def _check_multi(self, episode: Episode, call: str) -> None:
        if episode.agents is None and (episode.length or episode.agent.obs):
            raise EpisodeError(
                f"{call} for episode '{episode.episode_id}' names agents, but the episode is "
                "single-agent (its earlier calls named none); use one form for a whole episode"
            )
        if episode.status is EpisodeStatus.AWAITING_ACTION:
            raise EpisodeError(
                f"{call} for episode '{episode.episode_id}' while its previous get_action is "
                "still being answered; wait for the actions before the next call"
            )

    def _check_agents_one_by_one(
        self,
        episode: Episode,
        agent_ids: list[str],
        policy_ids: list[str],
        rewards: Any,
        call: str,
    ) -> None:
        """Raise the error of the first agent of an observing call that cannot go on."""
        where = {} if episode.agents is None else episode.agents.where
        for i, agent_id in enumerate(agent_ids):
            found = where.get(agent_id)
            if found is not None:
                _check_agent_usable(episode, found, agent_id, policy_ids[i], call)
            if rewards is not None and rewards[i]:
                _check_agent_reward(
                    episode, found, agent_id, policy_ids[i], float(rewards[i]), call
                )

    def _check_rewards_one_by_one(
        self, episode: Episode, agent_ids: list[str], rewards: Any, call: str
    ) -> None:
        """Raise the error of the first agent whose reward cannot be taken."""
        where = {} if episode.agents is None else episode.agents.where
        for i, agent_id in enumerate(agent_ids):
            found = where.get(agent_id)
            policy_id = "?" if found is None else found[0].policy_id
            if found is not None:
                _check_agent_usable(episode, found, agent_id, policy_id, call)
            if rewards[i]:
                _check_agent_reward(episode, found, agent_id, policy_id, float(rewards[i]), call)

    def _check_done_one_by_one(self, episode: Episode, done: dict[str, bool]) -> None:
        where = {} if episode.agents is None else episode.agents.where
        for agent_id in done:
            found = where.get(agent_id)
            if found is None:
                raise EpisodeError(
                    f"log_returns for episode '{episode.episode_id}' marks agent '{agent_id}' "
                    "done, but it has not acted in this episode; mark only agents that acted"
                )
            _check_agent_usable(episode, found, agent_id, found[0].policy_id, "log_returns")

    def _check_end_one_by_one(self, episode: Episode, agent_ids: list[str], rewards: Any) -> None:
        where = {} if episode.agents is None else episode.agents.where
        for i, agent_id in enumerate(agent_ids):
            found = where.get(agent_id)
            if found is not None and found[0].done[found[1]]:
                _check_agent_usable(episode, found, agent_id, found[0].policy_id, "end_episode")
            if rewards is not None and rewards[i]:
                policy_id = "?" if found is None else found[0].policy_id
                _check_agent_reward(
                    episode, found, agent_id, policy_id, float(rewards[i]), "end_episode"
                )

    @staticmethod
    def _add_agent_rewards(
        episode: Episode,
        located: Located,
        rewards: np.ndarray,
        infos: list[dict[str, Any] | None] | None,
    ) -> None:
        """Add the (checked) rewards and infos of a call to the agents' last actions."""
        whole = len(located.parts) == 1 and not located.unknown
        for columns, rows, positions in located.parts:
            own = rewards if whole else rewards[positions]
            if own.any():
                columns.add_rewards(rows, own)
            if infos is not None:
                for row, i in zip(rows.tolist(), positions.tolist(), strict=True):
                    info = infos[i]
                    if info and columns.steps[row]:
                        columns.merge_info(row, info)
        if rewards.any():
            # Agents the episode does not know have no reward here (refused otherwise).
            episode.episode_return += float(rewards.sum())

    def _finish_rows(
        self,
        episode: Episode,
        columns: AgentColumns,
        rows: np.ndarray,
        final_obs: np.ndarray | None,
        terminated: bool,
    ) -> None:
        """Hand on the last steps of finished agents and mark them done.

        With ``final_obs`` (one per row) the fragments end in it; without, a terminated agent's
        last observation stands in (it is never bootstrapped from), and a truncated agent's last
        step is dropped (nothing followed it).
        """
        columns.done[rows] = True
        has_steps = np.flatnonzero(columns.count[rows] > 0)
        rows = rows[has_steps]
        if not rows.size:
            return
        if final_obs is None and not terminated:
            self._hand_on_unfinished(episode, columns, rows)
            return
        columns.close_steps(rows)
        next_obs = columns.last_obs(rows) if final_obs is None else final_obs[has_steps]
        columns.write_obs(rows, next_obs)
        self._hand_on(episode, columns, rows, columns.count[rows], terminated, not terminated)

    def _hand_on_unfinished(
        self, episode: Episode, columns: AgentColumns, rows: np.ndarray
    ) -> None:
        """Hand on the steps of agents that stopped without a next observation.

        No observation followed their last action, so that one step cannot be used; the steps
        before it bootstrap from the observation the last action was taken in.
        """
        counts = columns.count[rows]
        more = counts > 1
        if more.any():
            self._hand_on(episode, columns, rows[more], counts[more] - 1, False, False)
        columns.take(rows[~more], counts[~more], episode.episode_id, False, False, keep=False)

    def _hand_on(
        self,
        episode: Episode,
        columns: AgentColumns,
        rows: np.ndarray,
        steps: np.ndarray,
        terminated: bool,
        truncated: bool,
    ) -> None:
        """Cut the rows' first ``steps`` steps as fragments (kept when the episode trains)."""
        for fragment in columns.take(
            rows, steps, episode.episode_id, terminated, truncated, episode.training_enabled
        ):
            self._on_fragment(fragment)

    def _check_not_awaiting(self, episode: Episode, call: str) -> None:
        if episode.agents is not None and call in _SINGLE_AGENT_CALLS:
            raise EpisodeError(
                f"{call} for episode '{episode.episode_id}' names no agent, but the episode is "
                "multi-agent (its calls name agents): pass a dict keyed by agent id "
                "(agent_ids on the wire)"
            )
        if episode.status is EpisodeStatus.AWAITING_ACTION:
            raise EpisodeError(
                f"{call} for episode '{episode.episode_id}' while its previous get_action is "
                "still being answered; wait for the action before the next call"
            )

    @staticmethod
    def check_reward(episode: Episode, reward: float, call: str) -> None:
        """Refuse a reward that is not finite or would take the step's reward over the bound.

        Raises:
            SpaceError: Naming the call, the episode and the value (code ``bad_value``).
        """
        pending = episode.agent.pending_reward
        if not -MAX_ABS_REWARD <= pending + reward <= MAX_ABS_REWARD:  # True for NaN
            _raise_reward(f"{call} for episode '{episode.episode_id}'", pending, reward)

    def _add_reward(self, episode: Episode, reward: float, call: str) -> None:
        # The common case inline (every step): check_reward only to raise its error.
        if not -MAX_ABS_REWARD <= episode.agent.pending_reward + reward <= MAX_ABS_REWARD:
            self.check_reward(episode, reward, call)
        episode.episode_return += reward
        if episode.length:
            episode.agent.pending_reward += reward
        # Before the first action there is no step to credit: the reward is in the return only.

    @staticmethod
    def _add_info(episode: Episode, info: dict[str, Any]) -> None:
        if not episode.length:
            return  # no step to keep it with (see the module docstring)
        agent = episode.agent
        agent.pending_info = info if agent.pending_info is None else {**agent.pending_info, **info}

    @staticmethod
    def _close_step(agent: AgentTrajectory) -> None:
        """The previous action's reward and info are complete: record them with its step."""
        agent.rewards.append(agent.pending_reward)
        agent.pending_reward = 0.0
        if agent.pending_info is not None:
            agent.infos[len(agent.rewards) - 1] = agent.pending_info
            agent.pending_info = None

    def _emit(
        self, episode: Episode, next_obs: np.ndarray, terminated: bool, truncated: bool
    ) -> None:
        """Hand on a single-agent episode's steps as a fragment ending in ``next_obs``."""
        agent = episode.agent
        if episode.training_enabled and agent.actions:
            agent.obs.append(next_obs)
            fragment = Fragment(
                episode_id=episode.episode_id,
                agent_id=SINGLE_AGENT,
                policy_id=episode.policy_id,
                obs=np.stack(agent.obs).astype(np.float32, copy=False),
                actions=np.asarray(agent.actions),
                rewards=np.asarray(agent.rewards, dtype=np.float32),
                behaviour_logp=np.asarray(agent.logp, dtype=np.float32),
                policy_chosen=np.asarray(agent.chosen, dtype=bool),
                weights_version=np.asarray(agent.versions, dtype=np.int64),
                terminated=terminated,
                truncated=truncated,
                infos=[agent.infos.get(i) for i in range(len(agent.actions))]
                if agent.infos
                else None,
            )
            self._on_fragment(fragment)
        agent.obs, agent.actions, agent.rewards = [], [], []
        agent.logp, agent.chosen, agent.versions = [], [], []
        agent.infos = {}

    def _close(self, episode: Episode, reason: str, end_seq: int = 0) -> EpisodeSummary:
        episode.status = EpisodeStatus.ENDED
        del self._active[episode.episode_id]
        self._per_owner[episode.owner] -= 1
        if not self._per_owner[episode.owner]:
            del self._per_owner[episode.owner]
        self._ended[episode.episode_id] = _Ended(episode.owner, end_seq)
        if len(self._ended) > self._max_remembered:
            self._ended.pop(next(iter(self._ended)))
        policy_returns: dict[str, float] | None = None
        if episode.agents is not None:
            # Each policy's agents in the order they joined, added one after the other.
            policy_returns = {
                policy_id: sum(columns.returns[: columns.size].tolist(), 0.0)
                for policy_id, columns in episode.agents.columns.items()
            }
        return EpisodeSummary(
            episode.episode_id,
            episode.episode_return,
            episode.length,
            episode.training_enabled,
            reason,
            policy_returns,
            episode.policy_id,
        )

    def owners(self) -> dict[str, int]:
        """Open episodes per owner."""
        return dict(self._per_owner)


def _raise_reward(where: str, pending: float, reward: float) -> None:
    """Raise the error for a reward out of range (or taking the step's reward out of range)."""
    total = pending + reward
    bound = f"-{MAX_ABS_REWARD:g}..{MAX_ABS_REWARD:g}"
    if total == reward or not -MAX_ABS_REWARD <= reward <= MAX_ABS_REWARD:
        raise SpaceError(
            f"{where}: reward {reward!r} is out of range; a reward must be a finite number "
            f"within {bound}"
        )
    raise SpaceError(
        f"{where}: reward {reward!r} makes the rewards logged since the last action add up "
        f"to {total!r}; a step's reward must be within {bound}"
    )


def _check_agent_usable(
    episode: Episode, found: tuple[AgentColumns, int], agent_id: str, policy_id: str, call: str
) -> None:
    columns, row = found
    if columns.done[row]:
        raise EpisodeError(
            f"{call} for episode '{episode.episode_id}': agent '{agent_id}' (policy "
            f"'{columns.policy_id}') is done (marked in multiagent_done_dict) and cannot act, "
            "be rewarded or end again; use a new agent id for a new agent"
        )
    if columns.policy_id != policy_id:
        raise EpisodeError(
            f"{call} for episode '{episode.episode_id}': agent '{agent_id}' acts for policy "
            f"'{columns.policy_id}' in this episode, not '{policy_id}'; an agent keeps its "
            "policy for the whole episode"
        )


def _check_agent_reward(
    episode: Episode,
    found: tuple[AgentColumns, int] | None,
    agent_id: str,
    policy_id: str,
    reward: float,
    call: str,
) -> None:
    where = f"{call} for episode '{episode.episode_id}'"
    if found is None or not found[0].steps[found[1]]:
        raise EpisodeError(
            f"{where}: a reward for agent '{agent_id}' (policy '{policy_id}'), which has not "
            "acted in this episode; a reward belongs to the agent's previous action, so log "
            "it after the agent's first get_action/log_action"
        )
    pending = float(found[0].pending[found[1]])
    if not -MAX_ABS_REWARD <= pending + reward <= MAX_ABS_REWARD:
        _raise_reward(f"{where}, agent '{agent_id}'", pending, reward)


# -- the vectorised checks: True when some agent may be refused (then checked one by one) -----


def _find_rows(
    state: EpisodeAgents | None, agent_ids: list[str], groups: list[tuple[str, np.ndarray]]
) -> tuple[list[tuple[AgentColumns, np.ndarray]], bool]:
    """Each group's columns and the rows of its agents (-1: not in the episode yet).

    Also whether an agent is in the columns of another policy than its group's. A group whose
    policy has no columns yet gets a placeholder (every row -1).
    """
    parts: list[tuple[AgentColumns, np.ndarray]] = []
    mismatch = False
    where = {} if state is None else state.where
    for policy_id, idx in groups:
        columns = None if state is None else state.columns.get(policy_id)
        rows = np.full(len(idx), -1, np.int64)
        for j, i in enumerate(idx.tolist()):
            found = where.get(agent_ids[i])
            if found is not None:
                if found[0] is columns:
                    rows[j] = found[1]
                else:
                    mismatch = True
        parts.append((columns or _NO_COLUMNS, rows))
    return parts, mismatch


_NO_COLUMNS = AgentColumns("", 1)
"""Stands in for the columns of a policy that has no agents in the episode yet (never written)."""


def _tick_refused(
    parts: list[tuple[AgentColumns, np.ndarray]],
    groups: list[tuple[str, np.ndarray]],
    rewards: np.ndarray | None,
) -> bool:
    for (columns, rows), (_, idx) in zip(parts, groups, strict=True):
        known = rows >= 0
        every = bool(known.all())
        old = rows if every else rows[known]
        if old.size and columns.done[old].any():
            return True
        if rewards is None:
            continue
        own = rewards if len(groups) == 1 else rewards[idx]
        given = own != 0
        if not given.any():
            continue
        if not every and (given & ~known).any():
            return True
        if not every:
            own, given = own[known], given[known]
        if (columns.steps[old][given] == 0).any():
            return True
        if not (np.abs(columns.pending[old] + own) <= MAX_ABS_REWARD).all():  # NaN too
            return True
    return False


def _locate(state: EpisodeAgents | None, agent_ids: list[str]) -> Located:
    if state is None or not agent_ids:
        return Located([], list(range(len(agent_ids))))
    return state.locate(agent_ids)


def _rewards_refused(located: Located, rewards: np.ndarray) -> bool:
    if located.unknown and rewards[located.unknown].any():
        return True
    for columns, rows, positions in located.parts:
        if columns.done[rows].any():
            return True
        own = rewards[positions]
        given = own != 0
        if given.any():
            if (columns.steps[rows][given] == 0).any():
                return True
            if not (np.abs(columns.pending[rows] + own) <= MAX_ABS_REWARD).all():
                return True
    return False


def _done_refused(state: EpisodeAgents | None, done: dict[str, bool]) -> bool:
    if not done:
        return False
    if state is None:
        return True
    return any(agent_id not in state or state.is_done(agent_id) for agent_id in done)


def _done_named(located: Located) -> bool:
    return any(columns.done[rows].any() for columns, rows, _ in located.parts)
