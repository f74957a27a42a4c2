"""An env runner: drives one :class:`~rlserve.env.EnvSource` with a collector.

Each round it polls the source, hands rewards, ends and logged actions to the collector, asks
the collector for the actions of every agent that wants one (one forward pass per policy for a
single-agent source; one per episode and policy for a multi-agent one) and sends them back. The
collector turns the steps into fragments for its sink; the runner keeps no experience itself.

A :class:`~rlserve.env.VectorEnvSource` of single-agent copies takes a fast path on stacked
arrays (no per-step dicts): its episodes are kept in a
:class:`~rlserve.experience.vector_rollout.VectorRollout` (a column per copy), not in the
collector's
episode table. Everything else goes through the generic ``poll``/``send_actions`` rules of
:mod:`rlserve.env.base`.

Rewards a multi-agent env gives an agent before that agent's first action in an episode belong
to no action: they are left out (and counted in :attr:`EnvRunner.rewards_before_acting`), as the
network server refuses them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces

from rlserve.env.base import (
    ALL_AGENTS,
    SINGLE_AGENT,
    EnvId,
    EnvSource,
    Poll,
    StepBatch,
    VectorEnvSource,
)
from rlserve.errors import EnvError, SpaceError
from rlserve.experience.collector import Collector
from rlserve.experience.vector_rollout import VectorRollout


class EnvRunner:
    """Steps a source's sub-environments with the collector's policies.

    Args:
        source: The environments.
        collector: Acts and records; its sink receives the fragments.
        training_enabled: Whether the episodes are trained on (False for evaluation).
        seed: Seed of the first reset of a vector source (copy ``i`` gets ``seed + i``).
    """

    def __init__(
        self,
        source: EnvSource,
        collector: Collector,
        training_enabled: bool = True,
        seed: int | None = None,
    ):
        self.source = source
        self.collector = collector
        self.training_enabled = training_enabled
        self.seed = seed
        self.env_steps = 0
        """Agent steps acted on (every agent that got an action counts one)."""
        self.episodes_failed = 0
        """Episodes abandoned because their environment failed."""
        self.rewards_before_acting = 0
        """Rewards left out because their agent had not acted yet in the episode."""
        self._vector = isinstance(source, VectorEnvSource) and not source.multi_agent
        self._episodes: dict[EnvId, str] = {}
        self._acted: dict[EnvId, set[str]] = {}
        self._obs: Any = None
        self._rollout: VectorRollout | None = None
        self._pending_obs: dict[EnvId, Any] = {}

    def sample(self, min_steps: int) -> int:
        """Step until at least ``min_steps`` more agent steps were acted on; return how many.

        Raises:
            EnvError: The env returned an observation its own observation space refuses, or a
                reward that is not finite (or beyond 1e9); the message names the env and the
                fix.
        """
        try:
            if self._vector:
                return self._sample_vector(min_steps)
            before = self.env_steps
            while self.env_steps - before < min_steps:
                self._round()
            return self.env_steps - before
        except SpaceError as exc:
            message = self._env_fault(str(exc))
            if message is None:
                raise  # not the env's values (a mapping, an action mask...): as it is
            raise EnvError(message) from exc

    def _env_fault(self, check: str) -> str | None:
        """The hosted user's message for a check that refused the env's own values, else None.

        The collector's checks are worded for network callers (their ``where`` first:
        ``observation...``, ``log_returns for episode '...'``); what a hosted env got wrong
        is its reset()/step() result.
        """
        name = self.source.env_name
        env = "the env" if name is None else f"env {name}"
        if check.startswith("observation"):
            return (
                f"{env}: its reset() or step() returned an observation its own observation_space "
                f"refuses ({check}); make them return values of that space, or correct the "
                "space ('rlserve check-env' checks an env)"
            )
        where, _, detail = check.partition(": ")
        if where.startswith("log_returns") and detail.startswith("reward"):
            return (
                f"{env}: its step() returned a reward rlserve cannot train on ({detail}); scale "
                "or clip the env's rewards (gymnasium.wrappers.TransformReward), or fix what "
                "makes them so"
            )
        return None

    def cut(self) -> None:
        """Hand on every open episode's steps so far (they go on afterwards).

        Only a vector source knows the observation after the last action without stepping on;
        other sources' episodes keep their steps until a fragment fills or the episode ends.
        """
        if self._rollout is not None:
            self.collector.cut_vector(self._rollout, self._obs)

    # -- the vector fast path ----------------------------------------------------------------

    def _sample_vector(self, min_steps: int) -> int:
        source = self.source
        assert isinstance(source, VectorEnvSource)
        collector = self.collector
        if self._rollout is None:
            # The copies' reset infos come before any action: no step keeps them (as in the
            # episode table, where an info before the first action is not kept).
            self._obs, _ = source.reset_all(self.seed)
            self._rollout = collector.open_vector(source.num_envs, self.training_enabled)
        rollout = self._rollout
        act, step_all = collector.act_vector, source.step_all
        num_envs = source.num_envs
        done_steps = 0
        while done_steps < min_steps:
            batch = step_all(act(rollout, self._obs))
            done_steps += num_envs
            rollout.rewards(batch.rewards, batch.infos)
            if batch.final_obs or batch.failed:
                self._episodes_over(rollout, batch)
            self._obs = batch.obs
        self.env_steps += done_steps
        return done_steps

    def _episodes_over(self, rollout: VectorRollout, batch: StepBatch) -> None:
        """End (or abandon) the episodes of the copies whose episode is over in ``batch``."""
        # ndarray.nonzero: np.flatnonzero's Python layers cost twice the search at this size.
        for i in (batch.terminated | batch.truncated).nonzero()[0].tolist():
            if i not in batch.failed:
                terminated = bool(batch.terminated[i])
                self.collector.end_vector(rollout, i, batch.final_obs[i], not terminated)
        for i in batch.failed:
            rollout.abandon(i, "failed")
            self.episodes_failed += 1

    def _start(self, training: bool = True) -> str:
        return self.collector.start_episode(None, self.training_enabled and training)

    # -- the generic path --------------------------------------------------------------------

    def _round(self) -> None:
        poll = self.source.poll()
        self._finish(poll)
        wanted = self._wanted(poll)
        actions = self._act(wanted, poll)
        self.source.send_actions(actions)

    def _finish(self, poll: Poll) -> None:
        """Failures, rewards, infos and episode ends of the open episodes."""
        collector = self.collector
        multi = self.source.multi_agent
        for env_id in poll.failed:
            episode_id = self._episodes.pop(env_id, None)
            self._acted.pop(env_id, None)
            if episode_id is not None:
                collector.abandon(episode_id, "failed")
                self.episodes_failed += 1
        for env_id in set(poll.rewards) | set(poll.infos) | set(poll.terminated):
            episode_id = self._episodes.get(env_id)
            if env_id in poll.failed:
                continue
            if episode_id is None:
                # No episode open yet (this poll starts it): no agent has acted in it.
                self.rewards_before_acting += sum(
                    1 for r in poll.rewards.get(env_id, {}).values() if r
                )
                continue
            rewards = poll.rewards.get(env_id, {})
            infos = poll.infos.get(env_id, {})
            if not multi:
                collector.log_returns(
                    episode_id, float(rewards.get(SINGLE_AGENT, 0.0)), infos.get(SINGLE_AGENT)
                )
                if poll.episode_over(env_id):
                    terminated = poll.terminated.get(env_id, {}).get(ALL_AGENTS, False)
                    final = poll.obs.get(env_id, {}).get(SINGLE_AGENT)
                    if final is None:
                        collector.abandon(episode_id, "truncated")
                    else:
                        obs = _as_obs(final, self.collector.observation_space)
                        collector.end_episode(episode_id, obs, not terminated)
                    del self._episodes[env_id]
                continue
            self._finish_agents(env_id, episode_id, poll, rewards, infos)

    def _finish_agents(
        self,
        env_id: EnvId,
        episode_id: str,
        poll: Poll,
        rewards: dict[str, float],
        infos: dict[str, dict[str, Any]],
    ) -> None:
        acted = self._acted.setdefault(env_id, set())
        own_rewards = {}
        for agent_id, reward in rewards.items():
            if agent_id in acted:
                own_rewards[agent_id] = float(reward)
            elif reward:
                self.rewards_before_acting += 1
        terminated = poll.terminated.get(env_id, {})
        truncated = poll.truncated.get(env_id, {})
        over = poll.episode_over(env_id)
        all_terminated = terminated.get(ALL_AGENTS, False)
        final_obs = poll.obs.get(env_id, {}) if over else {}
        marks: dict[str, bool] = {}
        for agent_id in acted:
            if truncated.get(agent_id):
                mark = False
            elif terminated.get(agent_id):
                mark = True
            else:
                continue
            # At the episode's end an agent with a final observation finishes with it (its
            # fragment's obs[T], what a truncated agent bootstraps from), unless its own flag
            # differs from the episode's; marked done here it would end without one.
            if agent_id in final_obs and mark == all_terminated:
                continue
            marks[agent_id] = mark
        own_infos = {a: i for a, i in infos.items() if a in acted and i}
        if own_rewards or own_infos or marks:
            self.collector.log_agent_returns(episode_id, own_rewards, own_infos, marks)
        acted.difference_update(marks)
        if over:
            finals = {a: obs for a, obs in final_obs.items() if a in acted}
            self.collector.end_agent_episode(episode_id, finals, not all_terminated)
            del self._episodes[env_id]
            del self._acted[env_id]

    def _wanted(self, poll: Poll) -> dict[EnvId, dict[str, Any]]:
        """The observations that want an action, by env id; new episodes are opened here."""
        wanted: dict[EnvId, dict[str, Any]] = {}
        for env_id, agents in poll.obs.items():
            if poll.episode_over(env_id):
                continue
            terminated = poll.terminated.get(env_id, {})
            truncated = poll.truncated.get(env_id, {})
            live = {a: o for a, o in agents.items() if not (terminated.get(a) or truncated.get(a))}
            if live:
                wanted[env_id] = live
        for env_id, agents in poll.reset_obs.items():
            wanted[env_id] = agents
        # External envs name the episodes their simulator started without training.
        untrained = getattr(poll, "training_disabled", ())
        for env_id in wanted:
            if env_id not in self._episodes:
                self._episodes[env_id] = self._start(env_id not in untrained)
                self._acted[env_id] = set()
        return wanted

    def _act(self, wanted: dict[EnvId, dict[str, Any]], poll: Poll) -> dict[EnvId, dict[str, Any]]:
        collector = self.collector
        actions: dict[EnvId, dict[str, Any]] = {}
        if not self.source.multi_agent:
            self._pending_obs = {}
            asking: list[EnvId] = []
            for env_id, agents in wanted.items():
                obs = _as_obs(agents[SINGLE_AGENT], collector.observation_space)
                self._pending_obs[env_id] = obs
                taken = poll.off_policy_actions.get(env_id, {})
                if SINGLE_AGENT in taken and env_id not in poll.reset_obs:
                    collector.log_action(self._episodes[env_id], obs, taken[SINGLE_AGENT])
                    self.env_steps += 1
                else:
                    asking.append(env_id)
            if asking:
                ids = [self._episodes[e] for e in asking]
                rows = [self._pending_obs[e] for e in asking]
                box = isinstance(collector.observation_space, spaces.Box)
                obs_batch = np.stack(rows) if box else rows
                computed = collector.get_action(ids, obs_batch)
                for env_id, action in zip(asking, computed, strict=True):
                    actions[env_id] = {SINGLE_AGENT: _plain(action)}
                self.env_steps += len(asking)
            return actions
        for env_id, agents in wanted.items():
            episode_id = self._episodes[env_id]
            taken = poll.off_policy_actions.get(env_id, {})
            if env_id in poll.reset_obs:
                taken = {}
            logged = {a: o for a, o in agents.items() if a in taken}
            if logged:
                collector.log_agent_actions(episode_id, logged, {a: taken[a] for a in logged})
            asking_agents = {a: o for a, o in agents.items() if a not in taken}
            if asking_agents:
                actions[env_id] = collector.get_agent_actions(episode_id, asking_agents)
            self._acted[env_id].update(agents)
            self.env_steps += len(agents)
        return actions


def _as_obs(value: Any, space: Any) -> Any:
    """A Box observation in the Box's float dtype (envs often return float64); others as given."""
    if not isinstance(space, spaces.Box):
        return value
    array = np.asarray(value)
    if array.dtype != space.dtype and array.dtype.kind == "f":
        return array.astype(space.dtype)
    return array


def _plain(action: Any) -> Any:
    """A numpy scalar as a Python one (what envs expect from a Discrete space)."""
    return action.item() if isinstance(action, np.generic) else action
