"""The collector: policy copies, an episode table and a sink for what they produce.

It is the one part that turns "here is an observation, what do I do?" into actions and
trajectory :class:`~rlserve.protocol.fragment.Fragment` s, whatever asks: a local-inference client
(:class:`~rlserve.client.local.LocalInference` adds a network shipper and a weights refresher),
a hosted env runner (:class:`~rlserve.env.runner.EnvRunner` drives it from an
:class:`~rlserve.env.EnvSource` and hands fragments straight to a learner), and later a remote
machine. It knows no transport: finished fragments go to ``sink``, finished episodes to
``on_summary``, and weights come in through :meth:`Collector.set_policy`, a single reference
swap, so an action is always computed by one whole policy.

The episode rules and errors are the server's own
:class:`~rlserve.experience.episodes.EpisodeTable`, and a
multi-agent call is grouped by policy with the server's
:class:`~rlserve.experience.agent_groups.AgentGrouper`,
so every source gets the same checks, the same fragments and one forward pass per policy.

Needs numpy and gymnasium only (no torch, no network).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from rlserve.errors import EpisodeError
from rlserve.experience.agent_groups import AgentGrouper, AskPolicies
from rlserve.experience.agent_values import PolicySpaces, PolicyTable
from rlserve.experience.collector_agents import MultiAgentCalls
from rlserve.experience.episode_records import Episode, EpisodeSummary
from rlserve.experience.episodes import EpisodeTable
from rlserve.experience.recurrent_states import (
    advance,
    log_steps,
    read_states,
)
from rlserve.experience.vector_rollout import VectorRollout
from rlserve.policy import NumpyPolicy
from rlserve.policy.acting import compute_actions, explores, greedy_in_evaluation
from rlserve.policy.action_layout import actions_to_space, encode_action
from rlserve.protocol.episode_requests import DEFAULT_POLICY_ID
from rlserve.protocol.fragment import Fragment
from rlserve.protocol.spaces import check_batch, check_one, check_value
from rlserve.protocol.stacked_checks import StackedBoxCheck, stacked_check
from rlserve.protocol.values import check_float32

OWNER = "local"
"""The owner of every episode of a collector (episodes are not shared between collectors)."""


class Collector(MultiAgentCalls):
    """Acts with numpy policy copies and records episodes into fragments.

    Args:
        table: The policies (id -> spaces) and the agent -> policy mapping.
        policies: The first weights of every policy in ``table``.
        fragment_length: Steps of an episode per fragment.
        max_episodes: Concurrent open episodes.
        sink: Takes every finished fragment (called on the thread that finished it).
        on_summary: Takes every finished episode's summary.
        holder: Who holds the episodes, as the error at ``max_episodes`` says it.
        limit_setting: What raises ``max_episodes``, named in that error.
        max_info_bytes: Largest info map of one step once the infos logged for it are merged
            (a local-mode client: the server's limit, so that the call that merges is refused
            rather than the report that carries it); None: not checked.
    """

    def __init__(
        self,
        table: PolicyTable,
        policies: dict[str, NumpyPolicy],
        fragment_length: int,
        max_episodes: int,
        sink: Callable[[Fragment], None],
        on_summary: Callable[[EpisodeSummary], None],
        holder: str = "the sampler",
        limit_setting: str = "num_envs_per_env_runner (it allows 4 per env copy, 1,024 at least)",
        max_info_bytes: int | None = None,
    ):
        self.table_of_policies = table
        served = table.policies
        missing = set(served) - set(policies)
        if missing:
            raise ValueError(f"no weights for the policies {sorted(missing)}")
        self.default_policy_id = (
            DEFAULT_POLICY_ID if DEFAULT_POLICY_ID in served else next(iter(served))
        )
        self.observation_space = served[self.default_policy_id].observation_space
        self.action_space = served[self.default_policy_id].action_space
        self._grouper = AgentGrouper(
            table.mapping,
            {pid: (p.observation_space, p.action_space) for pid, p in served.items()},
        )
        self._policies = dict(policies)
        self._on_summary = on_summary
        self._sink = sink
        self._checks: dict[tuple[str, int], Callable[[Any], np.ndarray]] = {}
        self.table = EpisodeTable(
            fragment_length,
            max_episodes,
            max_episodes,
            sink,
            holder=holder,
            limit_setting=limit_setting,
            max_info_bytes=max_info_bytes,
        )
        self.ask_policies: AskPolicies | None = None
        """Asks the server's mapping function about new agents no rule maps (a local-inference
        client of a server that has one); None: the rules alone."""
        self.explore = True
        """Sample actions (True) or take each policy's most likely action (evaluation). Even
        when True, episodes with ``training_enabled=False`` of an epsilon-greedy (DQN) policy
        act greedily (:mod:`rlserve.policy.acting`)."""

    # -- weights -----------------------------------------------------------------------------

    @property
    def policy(self) -> NumpyPolicy:
        """The policy acting now in single-agent episodes."""
        return self._policies[self.default_policy_id]

    def policy_of(self, policy_id: str) -> NumpyPolicy:
        """The weights acting now for ``policy_id``."""
        return self._policies[policy_id]

    def set_policy(self, policy_id: str, policy: NumpyPolicy) -> None:
        """Act with ``policy`` for ``policy_id`` from the next call on (one reference swap)."""
        if policy_id not in self._policies:
            raise KeyError(f"unknown policy '{policy_id}'")
        self._policies[policy_id] = policy

    # -- episode calls -----------------------------------------------------------------------

    def start_episode(
        self, episode_id: str | None, training_enabled: bool, policy_id: str | None = None
    ) -> str:
        """Open an episode on this client (single-agent calls act with ``policy_id``)."""
        return self.table.start(
            episode_id, training_enabled, policy_id or self.default_policy_id, OWNER
        )

    def _single(self, episode: Episode) -> tuple[NumpyPolicy, PolicySpaces]:
        """The weights and spaces of a single-agent episode's policy."""
        return self._policies[episode.policy_id], self.table_of_policies.policies[episode.policy_id]

    def get_one_action(self, episode_id: str, observation: Any) -> Any:
        """Record one observation and compute its action (the per-step fast path)."""
        episode = self.table.get(episode_id)
        policy, spaces_ = self._single(episode)
        space = spaces_.observation_space
        obs = check_one(space, observation, "observation")
        rule, frames = spaces_.frames, None
        if rule is not None:
            frames, obs = rule.next([episode], obs)
        explore = explores(policy, episode.training_enabled, self.explore)
        state = None
        if policy.state_size:
            state = read_states([episode], policy.state_size)
            out = policy.compute_actions(obs, explore, state)
        else:
            out = policy.compute_actions(obs, explore)
        self.table.observe(episode, obs[0], None)
        action = out.actions[0]
        discrete = spaces_.discrete
        self.table.act(
            episode,
            int(action) if discrete else action,
            float(out.logp[0]),
            True,
            policy.version,
        )
        if state is not None:
            advance([episode], state, out.state)
        if rule is not None and frames is not None:
            rule.keep([episode], frames)
        sent = policy.to_env_actions(out.actions)
        if discrete:
            return int(sent[0])
        return actions_to_space(spaces_.action_space, sent)[0]

    def get_action(self, episode_ids: list[str], observations: Any) -> np.ndarray:
        """Record observations and compute actions for several episodes at once."""
        episodes = [self.table.get(eid) for eid in episode_ids]
        for episode in episodes:
            self.table.check_observe(episode, None)
        if any(e.policy_id != episodes[0].policy_id for e in episodes):
            raise EpisodeError("one get_action may only name episodes of the same policy")
        policy, spaces_ = self._single(episodes[0])
        obs = check_batch(spaces_.observation_space, observations, len(episodes), "observation")
        rule, frames = spaces_.frames, None
        if rule is not None:
            frames, obs = rule.next(episodes, obs)
        state = read_states(episodes, policy.state_size) if policy.state_size else None
        if self.explore and greedy_in_evaluation(policy):
            evaluation = np.asarray([not e.training_enabled for e in episodes], dtype=bool)
            out = compute_actions(policy, obs, evaluation, state)
        else:
            out = policy.compute_actions(obs, self.explore, state)
        discrete = spaces_.discrete
        actions = out.actions.tolist() if discrete else list(out.actions)
        self.table.observe_act_many(episodes, obs, actions, out.logp.tolist(), policy.version)
        if state is not None:
            advance(episodes, state, out.state)
        if rule is not None and frames is not None:
            rule.keep(episodes, frames)
        sent = policy.to_env_actions(out.actions)
        return sent if discrete else actions_to_space(spaces_.action_space, sent)

    def log_action(self, episode_id: str, observation: Any, action: Any) -> None:
        """Record an action someone else took."""
        episode = self.table.get(episode_id)
        self.table.check_observe(episode, None)
        policy, spaces_ = self._single(episode)
        obs = check_one(spaces_.observation_space, observation, "observation")
        value = check_value(spaces_.action_space, action, "action")
        value = encode_action(spaces_.action_space, value)
        if not spaces_.discrete:
            value = check_float32(value, "log_action 'action'")
        rule, frames = spaces_.frames, None
        if rule is not None:
            frames, obs = rule.next([episode], obs)
        # The LSTM reads every observation: a logged step advances the state too.
        states = log_steps([episode], obs, policy) if policy.state_size else None
        self.table.observe(episode, obs[0], None)
        self.table.act(episode, value, float("nan"), False, policy.version)
        if states is not None:
            advance([episode], *states)
        if rule is not None and frames is not None:
            rule.keep([episode], frames)

    def log_returns(
        self, episode_id: str, reward: float, info: dict[str, Any] | None = None
    ) -> None:
        """Add reward (and a checked ``info`` map) to the previous action."""
        self.table.log_returns(self.table.get(episode_id), reward, info)

    def log_returns_many(
        self,
        episode_ids: list[str],
        rewards: list[float],
        infos: dict[int, dict[str, Any]] | None = None,
    ) -> None:
        """:meth:`log_returns` for several episodes; ``infos`` by position in ``episode_ids``."""
        table = self.table
        episodes = [table.get(eid) for eid in episode_ids]
        if not infos:
            table.log_returns_many(episodes, rewards)
            return
        for i, episode in enumerate(episodes):
            table.log_returns(episode, rewards[i], infos.get(i))

    def end_episode(self, episode_id: str, observation: Any, truncated: bool) -> None:
        """Finish an episode; its steps and summary go out with the next batch."""
        episode = self.table.get(episode_id)
        _, spaces_ = self._single(episode)
        obs = check_one(spaces_.observation_space, observation, "observation")
        if spaces_.frames is not None:
            obs = spaces_.frames.next([episode], obs)[1]  # the frames end with the episode
        summary = self.table.end(episode, obs[0], truncated, None)
        self._on_summary(summary)

    def cut(self, episode_id: str, observation: np.ndarray) -> None:
        """Hand on a single-agent episode's steps so far; ``observation`` is its next one."""
        self.table.cut(self.table.get(episode_id), observation)

    def abandon(self, episode_id: str, reason: str) -> None:
        """Close an episode whose environment failed; its steps so far are handed on."""
        self._on_summary(self.table.abandon(self.table.get(episode_id), reason))

    # -- vectors of single-agent copies (the hosted fast path) ---------------------------------

    def open_vector(self, num_envs: int, training_enabled: bool) -> VectorRollout:
        """Open one episode per copy of a vector source, recorded in arrays (not in the table).

        Act with :meth:`act_vector`; the returned rollout takes the rewards and episode ends.
        """
        return VectorRollout(
            num_envs,
            self.table.fragment_length,
            self.default_policy_id,
            training_enabled,
            self._sink,
            self._on_summary,
            self.policy.state_size,
            self.table_of_policies.policies[self.default_policy_id].frames,
        )

    def act_vector(self, rollout: VectorRollout, observations: Any) -> Any:
        """Check and record every copy's observation and compute its action (one forward pass).

        Returns:
            The actions as the copies take them (an int array for a Discrete space).
        """
        policy_id = rollout.policy_id
        policy = self._policies[policy_id]
        check = self._checks.get((policy_id, rollout.num_envs))
        if check is None:
            check = self._vector_check(policy_id, rollout.num_envs)
        obs = check(observations)
        if rollout.frames is not None:
            obs = rollout.frames.stack(rollout.copy_frames, obs)
        explore = explores(policy, rollout.training_enabled, self.explore)
        if rollout.state is None:
            out = policy.compute_actions(obs, explore)
        else:
            out = policy.compute_actions(obs, explore, rollout.state)
        rollout.record(obs, out.actions, out.logp, policy.version, out.state)
        sent = policy.to_env_actions(out.actions)
        spaces_ = self.table_of_policies.policies[policy_id]
        return sent if spaces_.discrete else actions_to_space(spaces_.action_space, sent)

    def end_vector(
        self, rollout: VectorRollout, index: int, observation: Any, truncated: bool
    ) -> None:
        """End copy ``index``'s episode with its (checked) final observation."""
        check = self._checks.get((rollout.policy_id, 1))
        if check is None:
            check = self._vector_check(rollout.policy_id, 1)
        one = np.asarray(observation)[None] if type(check) is StackedBoxCheck else [observation]
        obs = check(one)
        if rollout.frames is not None:
            obs = rollout.frames.next([rollout.copy_frames[index]], obs)[1]
        rollout.end(index, obs[0], truncated)

    def cut_vector(self, rollout: VectorRollout, observations: Any) -> None:
        """Hand on every copy's steps so far; ``observations`` are the copies' next ones."""
        obs = self._vector_check(rollout.policy_id, rollout.num_envs)(observations)
        if rollout.frames is not None:  # the stacks the copies' next steps will read
            obs = rollout.frames.next(rollout.copy_frames, obs)[1]
        rollout.cut(obs)

    def _vector_check(self, policy_id: str, count: int) -> Callable[[Any], np.ndarray]:
        """The observation check of a stacked batch of ``count`` (made once, used every step)."""
        check = self._checks.get((policy_id, count))
        if check is None:
            space = self.table_of_policies.policies[policy_id].observation_space
            check = stacked_check(space, count)
            self._checks[(policy_id, count)] = check
        return check
