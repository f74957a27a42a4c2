"""The one interface every hosted experience source is converted to: ``poll`` and ``send_actions``.

Whatever a user hands to the trainer (a ``gymnasium.Env``, a registered id, a creator taking an
``env_config`` dict, a multi-agent env, a PettingZoo env, an :class:`~rlserve.env.ExternalEnv`)
becomes an :class:`EnvSource`. A source holds any number of sub-environments, each named by an
*env id* (an int for vectorised copies, the episode id for external envs), and each with one or
more agents (single-agent environments have the one agent :data:`SINGLE_AGENT`).

The collector drives a source in a loop::

    while running:
        ready = source.poll()                 # what is ready, keyed by env id then agent id
        source.send_actions(actions_for(ready))

The rules of a :class:`Poll`:

* ``obs[env][agent]`` is an observation. The agent wants an action for it, unless the agent is
  done (``terminated``/``truncated`` true for it: then it is the agent's final observation) or
  ``off_policy_actions[env][agent]`` holds the action someone else already took for it.
* ``rewards[env][agent]`` is the reward the agent got since its previous action (absent or 0 at
  the start of an episode). A reward may come without an observation (turn-based envs).
* ``terminated[env]``/``truncated[env]`` may hold ``"__all__"``: the env's episode is over. The
  env's first observations after that (or the first ones ever seen from an env id) start a new
  episode. A source that resets by itself may put the new episode's first observations in the
  same poll as ``reset_obs[env]`` (with ``reset_infos[env]``), so vectorised copies stay in
  step; the collector asks for their actions in the same pass.
* ``failed[env]`` says that the env's episode was abandoned (its sub-process crashed or hung and
  was restarted): no final observation exists; the collector cuts the episode off without
  bootstrapping from an unseen state and counts it as failed. Any ``reset_obs`` for that env
  start its next episode.

``send_actions({env: {agent: action}})`` must answer every agent of the last poll that wanted an
action (it may carry nothing else). A source may also raise from ``poll`` if it cannot go on at
all; an episode lost to a sub-process is reported through ``failed`` instead.

:class:`VectorEnvSource` is the fast path for ``num_envs`` single-agent copies stepped together:
it works on stacked arrays (``reset_all``/``step_all``), and ``poll``/``send_actions`` are derived
from those, so any collector can still drive it through the generic interface.
"""

from __future__ import annotations

import abc
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from rlserve.protocol.mapping import ALL_AGENTS

SINGLE_AGENT = "agent0"
"""The agent id of a single-agent environment (RLlib's convention too)."""

EnvId = Hashable
"""Names one sub-environment of a source: an int index, or an external episode's id."""

__all__ = [
    "ALL_AGENTS",
    "SINGLE_AGENT",
    "EnvId",
    "EnvSource",
    "Poll",
    "StepBatch",
    "VectorEnvSource",
]


@dataclass(slots=True)
class Poll:
    """What a source has ready, keyed by env id and then by agent id (see the module doc)."""

    obs: dict[EnvId, dict[str, Any]] = field(default_factory=dict)
    rewards: dict[EnvId, dict[str, float]] = field(default_factory=dict)
    terminated: dict[EnvId, dict[str, bool]] = field(default_factory=dict)
    truncated: dict[EnvId, dict[str, bool]] = field(default_factory=dict)
    infos: dict[EnvId, dict[str, dict[str, Any]]] = field(default_factory=dict)
    off_policy_actions: dict[EnvId, dict[str, Any]] = field(default_factory=dict)
    reset_obs: dict[EnvId, dict[str, Any]] = field(default_factory=dict)
    reset_infos: dict[EnvId, dict[str, dict[str, Any]]] = field(default_factory=dict)
    failed: dict[EnvId, str] = field(default_factory=dict)

    def episode_over(self, env_id: EnvId) -> bool:
        """Whether ``env_id``'s episode ended in this poll (``__all__`` set, or it failed)."""
        return (
            env_id in self.failed
            or self.terminated.get(env_id, {}).get(ALL_AGENTS, False)
            or self.truncated.get(env_id, {}).get(ALL_AGENTS, False)
        )

    def is_empty(self) -> bool:
        """Whether nothing at all is ready."""
        return not (self.obs or self.rewards or self.terminated or self.truncated or self.failed)


class EnvSource(abc.ABC):
    """Sub-environments that the trainer steps: ``poll`` what is ready, ``send_actions`` back.

    Subclass it directly for an environment that fits none of the conversions in
    :func:`rlserve.env.to_source`. ``observation_spaces`` and ``action_spaces`` map each agent id
    that can appear to its spaces (a single-agent source: ``{"agent0": space}``).
    """

    observation_spaces: dict[str, gym.Space[Any]]
    action_spaces: dict[str, gym.Space[Any]]
    env_name: str | None = None
    """What messages call the env (its registered id, or its class or creator's name)."""

    @property
    def multi_agent(self) -> bool:
        """Whether agents other than :data:`SINGLE_AGENT` can appear."""
        return set(self.observation_spaces) != {SINGLE_AGENT}

    @abc.abstractmethod
    def poll(self) -> Poll:
        """Return what is ready now (may block briefly while nothing is)."""

    @abc.abstractmethod
    def send_actions(self, actions: dict[EnvId, dict[str, Any]]) -> None:
        """Hand over the actions for every agent of the last poll that wanted one."""

    def try_reset(self, env_id: EnvId) -> None:  # noqa: B027 - optional for sources
        """Abandon ``env_id``'s episode and start a new one (its first observations come later).

        Sources that cannot restart one sub-environment on request leave this as it is.
        """

    def close(self) -> None:  # noqa: B027 - optional for sources
        """Release the sub-environments (processes, threads, files)."""


@dataclass(slots=True)
class StepBatch:
    """One step of ``num_envs`` single-agent copies, as stacked arrays.

    Attributes:
        obs: ``[N, ...]`` the next observation of each copy; for a copy whose episode ended in
            this step, the first observation of its next episode (it reset by itself).
        rewards: ``[N]`` float rewards.
        terminated: ``[N]`` bool.
        truncated: ``[N]`` bool.
        final_obs: The final observation of each copy whose episode ended, by index.
        infos: The ``info`` of each copy that returned a non-empty one, by index (for a copy
            that ended, the info of its final step).
        reset_infos: The reset ``info`` of each copy that started a new episode, by index.
        failed: The copies whose episode was abandoned (crashed or hung sub-process) and why;
            their ``obs`` row is the first observation of a fresh episode.
    """

    obs: np.ndarray
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    final_obs: dict[int, Any] = field(default_factory=dict)
    infos: dict[int, dict[str, Any]] = field(default_factory=dict)
    reset_infos: dict[int, dict[str, Any]] = field(default_factory=dict)
    failed: dict[int, str] = field(default_factory=dict)


class VectorEnvSource(EnvSource):
    """``num_envs`` copies of one single-agent environment, stepped together on stacked arrays.

    Subclasses implement :meth:`reset_all` and :meth:`step_all`; every copy resets by itself
    when its episode ends. ``poll``/``send_actions`` are derived from them for collectors that
    only speak the generic interface.
    """

    num_envs: int
    observation_space: gym.Space[Any]
    action_space: gym.Space[Any]

    def __init__(self) -> None:
        self.observation_spaces = {SINGLE_AGENT: self.observation_space}
        self.action_spaces = {SINGLE_AGENT: self.action_space}
        self._pending: Poll | None = None

    @abc.abstractmethod
    def reset_all(self, seed: int | None = None) -> tuple[np.ndarray, list[dict[str, Any]]]:
        """Reset every copy (copy ``i`` seeded with ``seed + i``); stacked obs and infos."""

    @abc.abstractmethod
    def step_all(self, actions: Any) -> StepBatch:
        """Step every copy with its action (``actions[i]`` for copy ``i``)."""

    def poll(self) -> Poll:
        """The first poll resets every copy; later ones return the last step's results."""
        if self._pending is None:
            obs, infos = self.reset_all()
            return Poll(
                obs={i: {SINGLE_AGENT: obs[i]} for i in range(self.num_envs)},
                infos={i: {SINGLE_AGENT: info} for i, info in enumerate(infos) if info},
            )
        pending, self._pending = self._pending, None
        return pending

    def send_actions(self, actions: dict[EnvId, dict[str, Any]]) -> None:
        """Step every copy; each must have an action (copies are stepped together)."""
        missing = [i for i in range(self.num_envs) if i not in actions]
        if missing:
            raise ValueError(f"send_actions: no action for env ids {missing} (all step together)")
        batch = self.step_all([actions[i][SINGLE_AGENT] for i in range(self.num_envs)])
        self._pending = self._to_poll(batch)

    @staticmethod
    def _to_poll(batch: StepBatch) -> Poll:
        poll = Poll()
        for i in range(len(batch.rewards)):
            if i in batch.failed:
                poll.failed[i] = batch.failed[i]
                poll.reset_obs[i] = {SINGLE_AGENT: batch.obs[i]}
                continue
            terminated = bool(batch.terminated[i])
            truncated = bool(batch.truncated[i])
            poll.rewards[i] = {SINGLE_AGENT: float(batch.rewards[i])}
            if i in batch.infos:
                poll.infos[i] = {SINGLE_AGENT: batch.infos[i]}
            if terminated or truncated:
                poll.obs[i] = {SINGLE_AGENT: batch.final_obs[i]}
                poll.terminated[i] = {SINGLE_AGENT: terminated, ALL_AGENTS: terminated}
                poll.truncated[i] = {SINGLE_AGENT: truncated, ALL_AGENTS: truncated}
                poll.reset_obs[i] = {SINGLE_AGENT: batch.obs[i]}
                if i in batch.reset_infos:
                    poll.reset_infos[i] = {SINGLE_AGENT: batch.reset_infos[i]}
            else:
                poll.obs[i] = {SINGLE_AGENT: batch.obs[i]}
        return poll
