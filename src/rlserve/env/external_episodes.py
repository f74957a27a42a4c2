"""The episodes of an external env: each one's calls, queued for the driver that polls them.

:class:`ExternalBase` is what :class:`~rlserve.env.external.ExternalEnv` and
:class:`~rlserve.env.external.ExternalMultiAgentEnv` share: their episodes, checked with the
network client's rules and errors, and each call queued as an :class:`ExternalCall` until
:class:`~rlserve.env.external_source.ExternalEnvSource` takes it (under the env's lock, the
condition its ``run()`` threads wait on for their actions).
"""

from __future__ import annotations

import threading
import uuid
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

from rlserve.errors import CapacityError, ConfigError, EnvError, EpisodeError, SpaceError
from rlserve.protocol.mapping import ALL_AGENTS
from rlserve.protocol.values import MAX_ABS_REWARD

MAX_REMEMBERED_ENDED = 1_000_000
"""Ended episode ids kept to refuse their reuse (single-use ids, as on the server)."""


@dataclass(slots=True)
class ExternalCall:
    """One call of an episode, waiting to be handed to the driver."""

    obs: dict[Any, Any]
    rewards: dict[Any, float]
    infos: dict[Any, dict[str, Any]]
    off_policy: dict[Any, Any] | None = None
    terminated: dict[Any, bool] | None = None
    truncated: dict[Any, bool] | None = None
    wants_action: bool = False


@dataclass(slots=True)
class ExternalEpisode:
    """One open (or ended, not yet polled) episode: its queued calls and what comes next."""

    training_enabled: bool
    calls: deque[ExternalCall] = field(default_factory=deque)
    rewards: dict[Any, float] = field(default_factory=dict)
    infos: dict[Any, dict[str, Any]] = field(default_factory=dict)
    agents: set[Any] = field(default_factory=set)
    done_agents: set[Any] = field(default_factory=set)
    asking: bool = False  # a get_action waits for its action
    answer: dict[Any, Any] | None = None
    ended: bool = False


class ExternalBase:
    """The episode bookkeeping and hand-over both external env classes share.

    Its source reads the queues (``_episodes``, ``_ended_queue``) and the ``run()`` outcome
    (``_error``, ``_closed``) under ``_cond``, the lock every method here takes.
    """

    multi_agent = False

    def __init__(
        self,
        action_space: gym.Space[Any],
        observation_space: gym.Space[Any],
        max_concurrent: int = 100,
    ):
        if max_concurrent < 1:
            raise ConfigError(f"max_concurrent must be at least 1, got {max_concurrent}")
        self.action_space = action_space
        self.observation_space = observation_space
        self.max_concurrent = max_concurrent
        self._cond = threading.Condition()
        self._episodes: dict[str, ExternalEpisode] = {}
        self._ended: dict[str, bool] = {}  # id -> ended by a done dict's '__all__'
        self._asked: set[str] = set()  # episodes whose get_action the driver holds
        # Ended episodes whose last calls the driver has not taken yet.
        self._ended_queue: deque[tuple[str, ExternalEpisode]] = deque()
        self._error: BaseException | None = None
        self._closed = False

    def run(self) -> None:
        """The simulator's loop; runs in its own thread once the trainer polls. Override it."""
        raise NotImplementedError(f"{type(self).__name__} must implement run()")

    # -- user side -----------------------------------------------------------------------------

    def start_episode(self, episode_id: str | None = None, training_enabled: bool = True) -> str:
        """Start an episode and return its id.

        Args:
            episode_id: A unique id, or None for a random one.
            training_enabled: False: actions are served but the episode is not trained on.

        Raises:
            EpisodeError: The id is open or was used before.
            CapacityError: ``max_concurrent`` episodes are open already.
        """
        with self._cond:
            self._check_open()
            if episode_id is None:
                episode_id = uuid.uuid4().hex
            elif not isinstance(episode_id, str):
                raise EpisodeError(f"episode_id must be a string, got {type(episode_id).__name__}")
            if episode_id in self._episodes:
                raise EpisodeError(
                    f"episode '{episode_id}' is already active; end it first or use a new id"
                )
            if episode_id in self._ended:
                raise EpisodeError(
                    f"episode id '{episode_id}' was used before; episode ids are single-use"
                )
            if len(self._episodes) >= self.max_concurrent:
                raise CapacityError(
                    f"{type(self).__name__} holds {len(self._episodes)} open episodes, its "
                    "max_concurrent; end episodes first or raise max_concurrent"
                )
            self._episodes[episode_id] = ExternalEpisode(bool(training_enabled))
            return episode_id

    def _episode(self, episode_id: str, call: str) -> ExternalEpisode:
        """The open episode, or the client's error for an unknown or ended one (lock held)."""
        self._check_open()
        episode = self._episodes.get(episode_id)
        if episode is None:
            if episode_id in self._ended:
                raise EpisodeError(
                    f"{call} for episode '{episode_id}': the episode has ended; start a new episode"
                )
            raise EpisodeError(
                f"{call} for unknown episode '{episode_id}'; call start_episode first"
            )
        if episode.asking:
            raise EpisodeError(
                f"{call} for episode '{episode_id}' while its previous get_action is still being "
                "answered; wait for the action before the next call"
            )
        return episode

    def _check_open(self) -> None:
        if self._closed:
            raise EnvError(f"{type(self).__name__}: the trainer closed this environment")

    def _take_pending(self, episode: ExternalEpisode) -> tuple[dict[Any, float], dict[Any, Any]]:
        rewards, infos = episode.rewards, episode.infos
        episode.rewards, episode.infos = {}, {}
        return rewards, infos

    def _act(self, episode_id: str, obs: dict[Any, Any], call: str) -> dict[Any, Any]:
        """Queue an observation that wants an action and wait for the answer."""
        with self._cond:
            episode = self._episode(episode_id, call)
            self._note_agents(episode_id, episode, obs, call)
            rewards, infos = self._take_pending(episode)
            episode.calls.append(ExternalCall(obs, rewards, infos, wants_action=True))
            episode.asking = True
            self._cond.notify_all()
            while episode.answer is None:
                self._check_open()
                self._cond.wait()
            answer, episode.answer, episode.asking = episode.answer, None, False
            return answer

    def _log_action(
        self, episode_id: str, obs: dict[Any, Any], actions: dict[Any, Any], call: str
    ) -> None:
        with self._cond:
            episode = self._episode(episode_id, call)
            self._note_agents(episode_id, episode, obs, call)
            rewards, infos = self._take_pending(episode)
            episode.calls.append(ExternalCall(obs, rewards, infos, off_policy=actions))
            self._cond.notify_all()

    def _add_returns(
        self,
        episode_id: str,
        rewards: dict[Any, float],
        infos: dict[Any, dict[str, Any]],
        done: dict[Any, bool],
        truncated: dict[Any, bool],
    ) -> None:
        call = "log_returns"
        with self._cond:
            episode = self._episode(episode_id, call)
            for agent_id, reward in rewards.items():
                if agent_id in episode.done_agents:
                    raise EpisodeError(
                        f"{call} for episode '{episode_id}': agent '{agent_id}' is done "
                        "(marked in multiagent_done_dict) and cannot be rewarded again"
                    )
                total = episode.rewards.get(agent_id, 0.0) + reward
                if not -MAX_ABS_REWARD <= total <= MAX_ABS_REWARD:
                    raise SpaceError(
                        f"{call} for episode '{episode_id}': reward {reward!r} makes the rewards "
                        f"logged since the last action add up to {total!r}; a step's reward "
                        f"must be within -{MAX_ABS_REWARD:g}..{MAX_ABS_REWARD:g}"
                    )
            for agent_id, reward in rewards.items():
                episode.rewards[agent_id] = episode.rewards.get(agent_id, 0.0) + reward
            for agent_id, info in infos.items():
                merged = episode.infos.get(agent_id)
                episode.infos[agent_id] = dict(info) if merged is None else {**merged, **info}
            if not (any(done.values()) or any(truncated.values())):
                return
            all_done = bool(done.get(ALL_AGENTS)) or bool(truncated.get(ALL_AGENTS))
            marked = {a for a in (*done, *truncated) if a != ALL_AGENTS}
            for agent_id in marked:
                if agent_id in episode.done_agents:
                    raise EpisodeError(
                        f"{call} for episode '{episode_id}': agent '{agent_id}' is done already; "
                        "an agent ends once"
                    )
            if all_done:
                self._queue_end(episode_id, episode, {}, bool(truncated.get(ALL_AGENTS)))
                self._ended[episode_id] = True
                return
            rewards_now, infos_now = self._take_pending(episode)
            ended = {a for a in marked if done.get(a) or truncated.get(a)}
            episode.done_agents |= ended
            episode.calls.append(
                ExternalCall(
                    {},
                    rewards_now,
                    infos_now,
                    terminated={a: bool(done.get(a)) and not truncated.get(a) for a in ended},
                    truncated={a: bool(truncated.get(a)) for a in ended},
                )
            )
            self._cond.notify_all()

    def _end(self, episode_id: str, obs: dict[Any, Any], truncated: bool) -> None:
        with self._cond:
            if (
                self.multi_agent
                and self._ended.get(episode_id)
                and episode_id not in self._episodes
            ):
                return  # '__all__' ended it already (RLlib's clients call end_episode after it)
            episode = self._episode(episode_id, "end_episode")
            self._note_agents(episode_id, episode, obs, "end_episode")
            self._queue_end(episode_id, episode, obs, truncated)
            self._ended[episode_id] = False

    def _queue_end(
        self, episode_id: str, episode: ExternalEpisode, obs: dict[Any, Any], truncated: bool
    ) -> None:
        """Queue the episode's last call, ending every agent that is not done yet (lock held)."""
        rewards, infos = self._take_pending(episode)
        agents = {*episode.agents, *obs, *rewards} - episode.done_agents
        flags = {a: True for a in agents}
        flags[ALL_AGENTS] = True
        no_flags = dict.fromkeys(flags, False)
        episode.calls.append(
            ExternalCall(
                obs,
                rewards,
                infos,
                terminated=no_flags if truncated else flags,
                truncated=flags if truncated else no_flags,
            )
        )
        episode.ended = True
        del self._episodes[episode_id]
        self._ended_queue.append((episode_id, episode))
        if len(self._ended) >= MAX_REMEMBERED_ENDED:
            self._ended.pop(next(iter(self._ended)))
        self._cond.notify_all()

    def _note_agents(
        self, episode_id: str, episode: ExternalEpisode, obs: Mapping[Any, Any], call: str
    ) -> None:
        """Refuse agents that are done; remember the others as the episode's (lock held)."""
        for agent_id in obs:
            if agent_id in episode.done_agents:
                raise EpisodeError(
                    f"{call} for episode '{episode_id}': agent '{agent_id}' is done (marked in "
                    "multiagent_done_dict) and cannot act or end again; use a new agent id for "
                    "a new agent"
                )
        episode.agents.update(obs)
