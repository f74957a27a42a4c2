"""External environments: simulators that run their own loop and ask for actions, in process.

An :class:`ExternalEnv` turns RLlib's "the simulator drives, the trainer answers" setup into an
:class:`~rlserve.env.EnvSource`. The user subclasses it and implements :meth:`ExternalEnv.run`,
which calls the same methods as the network client :class:`rlserve.PolicyClient`, with the same
rules and errors: ``start_episode``, ``get_action`` (blocks until the trainer answers),
``log_action``, ``log_returns`` and ``end_episode``. :class:`ExternalMultiAgentEnv` is the same
with dicts keyed by agent id.

:class:`ExternalEnvSource` hosts one: its first ``poll`` starts ``run()`` in a daemon thread;
``run()`` may start more threads, and every method may be called from any of them. Each poll
hands over what the threads produced since the previous one:

* the env id is the episode id (a ``str``); a single-agent episode's agent is ``"agent0"``;
* a ``get_action`` is an observation that wants an action (answered by ``send_actions``);
* a ``log_action`` is an observation with its action in ``off_policy_actions``;
* ``rewards`` hold what ``log_returns`` added since the agent's previous action (delivered with
  the episode's next call; a multi-agent ``log_returns`` that marks agents done is delivered at
  once, with their flags);
* ``end_episode`` is a final observation with ``"__all__"`` terminated (or truncated);
* a poll holds at most one call per episode: calls an episode made faster than the trainer
  polls wait their turn, in order, so no step is merged with another.

Episodes started with ``training_enabled=False`` are named in the poll's
:attr:`ExternalPoll.training_disabled` on every poll that mentions them: act for them, but keep
their steps out of training. An exception raised by ``run()`` is raised by the next ``poll`` (as
:class:`~rlserve.errors.EnvError`, with the original as its cause).
"""

from __future__ import annotations

import math
import threading
import uuid
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from rlserve.env.base import SINGLE_AGENT, EnvId, EnvSource, Poll
from rlserve.env.multi_agent import agent_space
from rlserve.errors import CapacityError, ConfigError, EnvError, EpisodeError, SpaceError
from rlserve.protocol.mapping import ALL_AGENTS
from rlserve.protocol.spaces import check_value
from rlserve.protocol.values import MAX_ABS_REWARD

__all__ = ["ExternalEnv", "ExternalEnvSource", "ExternalMultiAgentEnv", "ExternalPoll"]

POLL_TIMEOUT = 0.05
"""Seconds ``poll`` waits for the simulator when nothing is ready (so the driver does not spin)."""

MAX_REMEMBERED_ENDED = 1_000_000
"""Ended episode ids kept to refuse their reuse (single-use ids, as on the server)."""


@dataclass(slots=True)
class ExternalPoll(Poll):
    """A :class:`~rlserve.env.Poll` that also names the episodes not to train on.

    Attributes:
        training_disabled: The env ids (episode ids) of this poll whose episode was started
            with ``training_enabled=False``.
    """

    training_disabled: set[EnvId] = field(default_factory=set)


@dataclass(slots=True)
class _Call:
    """One call of an episode, waiting to be handed to the driver."""

    obs: dict[Any, Any]
    rewards: dict[Any, float]
    infos: dict[Any, dict[str, Any]]
    off_policy: dict[Any, Any] | None = None
    terminated: dict[Any, bool] | None = None
    truncated: dict[Any, bool] | None = None
    wants_action: bool = False


@dataclass(slots=True)
class _Episode:
    training_enabled: bool
    calls: deque[_Call] = field(default_factory=deque)
    rewards: dict[Any, float] = field(default_factory=dict)
    infos: dict[Any, dict[str, Any]] = field(default_factory=dict)
    agents: set[Any] = field(default_factory=set)
    done_agents: set[Any] = field(default_factory=set)
    asking: bool = False  # a get_action waits for its action
    answer: dict[Any, Any] | None = None
    ended: bool = False


class _ExternalBase:
    """The episode bookkeeping and hand-over both external env classes share."""

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
        self._episodes: dict[str, _Episode] = {}
        self._ended: dict[str, bool] = {}  # id -> ended by a done dict's '__all__'
        self._asked: set[str] = set()  # episodes whose get_action the driver holds
        # Ended episodes whose last calls the driver has not taken yet.
        self._ended_queue: deque[tuple[str, _Episode]] = deque()
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
            self._episodes[episode_id] = _Episode(bool(training_enabled))
            return episode_id

    def _episode(self, episode_id: str, call: str) -> _Episode:
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

    def _take_pending(self, episode: _Episode) -> tuple[dict[Any, float], dict[Any, Any]]:
        rewards, infos = episode.rewards, episode.infos
        episode.rewards, episode.infos = {}, {}
        return rewards, infos

    def _act(self, episode_id: str, obs: dict[Any, Any], call: str) -> dict[Any, Any]:
        """Queue an observation that wants an action and wait for the answer."""
        with self._cond:
            episode = self._episode(episode_id, call)
            self._note_agents(episode_id, episode, obs, call)
            rewards, infos = self._take_pending(episode)
            episode.calls.append(_Call(obs, rewards, infos, wants_action=True))
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
            episode.calls.append(_Call(obs, rewards, infos, off_policy=actions))
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
                _Call(
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
        self, episode_id: str, episode: _Episode, obs: dict[Any, Any], truncated: bool
    ) -> None:
        """Queue the episode's last call, ending every agent that is not done yet (lock held)."""
        rewards, infos = self._take_pending(episode)
        agents = {*episode.agents, *obs, *rewards} - episode.done_agents
        flags = {a: True for a in agents}
        flags[ALL_AGENTS] = True
        no_flags = dict.fromkeys(flags, False)
        episode.calls.append(
            _Call(
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
        self, episode_id: str, episode: _Episode, obs: Mapping[Any, Any], call: str
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


def _check_reward(reward: Any, episode_id: str, agent: Any | None = None) -> float:
    who = "" if agent is None else f" of agent '{agent}'"
    where = f"log_returns for episode '{episode_id}'"
    if not isinstance(reward, int | float | np.number) or isinstance(reward, bool):
        raise SpaceError(f"{where}: reward{who} must be a number, got {type(reward).__name__}")
    value = float(reward)
    if not math.isfinite(value) or not -MAX_ABS_REWARD <= value <= MAX_ABS_REWARD:
        raise SpaceError(
            f"{where}: reward{who} {value!r} is out of range; a reward must be a finite number "
            f"within -{MAX_ABS_REWARD:g}..{MAX_ABS_REWARD:g}"
        )
    return value


def _check_info(info: Any, episode_id: str) -> dict[str, Any]:
    if info is None:
        return {}
    if not isinstance(info, Mapping):
        raise SpaceError(
            f"log_returns for episode '{episode_id}': info must be a dict, got "
            f"{type(info).__name__}"
        )
    return dict(info)


class ExternalEnv(_ExternalBase):
    """A single-agent simulator that runs its own loop; subclass it and implement :meth:`run`.

    Inside ``run()`` call :meth:`start_episode`, :meth:`get_action`, :meth:`log_action`,
    :meth:`log_returns` and :meth:`end_episode`, exactly as with :class:`rlserve.PolicyClient`.
    Host it with :class:`ExternalEnvSource`.

    Args:
        action_space: The actions the simulator takes.
        observation_space: What it observes; every observation is checked against it.
        max_concurrent: Most episodes open at once.
    """

    def get_action(self, episode_id: str, observation: Any) -> Any:
        """Record an observation and return the trainer's action (blocks until it comes).

        Raises:
            EpisodeError: Unknown or ended episode, or its previous get_action still waits.
            SpaceError: The observation does not fit ``observation_space``.
        """
        obs = check_value(self.observation_space, observation, "observation")
        return self._act(episode_id, {SINGLE_AGENT: obs}, "get_action")[SINGLE_AGENT]

    def log_action(self, episode_id: str, observation: Any, action: Any) -> None:
        """Record an observation and the action someone else took (trained on as taken).

        Raises:
            EpisodeError: Unknown or ended episode.
            SpaceError: The observation or action does not fit its space.
        """
        obs = check_value(self.observation_space, observation, "observation")
        value = check_value(self.action_space, action, "action")
        self._log_action(episode_id, {SINGLE_AGENT: obs}, {SINGLE_AGENT: value}, "log_action")

    def log_returns(
        self, episode_id: str, reward: float, info: dict[str, Any] | None = None
    ) -> None:
        """Add reward to the episode's previous action (rewards add up until the next action).

        Args:
            episode_id: The episode.
            reward: A finite number.
            info: The environment's info map for this step; several merge.

        Raises:
            EpisodeError: Unknown or ended episode.
            SpaceError: The reward is not a finite number in range.
        """
        value = _check_reward(reward, episode_id)
        extra = _check_info(info, episode_id)
        self._add_returns(
            episode_id, {SINGLE_AGENT: value}, {SINGLE_AGENT: extra} if extra else {}, {}, {}
        )

    def end_episode(self, episode_id: str, observation: Any, truncated: bool = False) -> None:
        """Finish an episode with its final observation.

        Args:
            episode_id: The episode.
            observation: The final observation.
            truncated: True when a time limit cut the episode short (the trainer bootstraps
                from ``observation``); False for a terminal state.

        Raises:
            EpisodeError: Unknown or already ended episode.
            SpaceError: The observation does not fit ``observation_space``.
        """
        obs = check_value(self.observation_space, observation, "observation")
        self._end(episode_id, {SINGLE_AGENT: obs}, truncated)


class ExternalMultiAgentEnv(_ExternalBase):
    """:class:`ExternalEnv` with several agents: values are dicts keyed by agent id.

    Args:
        action_space: A :class:`gymnasium.spaces.Dict` keyed by agent id, or one space every
            agent shares.
        observation_space: The same for observations.
        max_concurrent: Most episodes open at once.
    """

    multi_agent = True

    def _checked(self, values: Any, kind: str, call: str, episode_id: str) -> dict[Any, Any]:
        if not isinstance(values, Mapping):
            raise SpaceError(
                f"{call} for episode '{episode_id}': a multi-agent episode takes a dict of "
                f"{kind}s keyed by agent id, got {type(values).__name__}"
            )
        out = {}
        for agent_id, value in values.items():
            try:
                space = agent_space(self, agent_id, kind)
            except ConfigError as exc:
                raise SpaceError(f"{call} for episode '{episode_id}': {exc}") from None
            out[agent_id] = check_value(space, value, f"{kind}[{agent_id!r}]")
        return out

    def get_action(self, episode_id: str, observation: Any) -> Any:
        """Record each agent's observation and return their actions (blocks until they come).

        Args:
            episode_id: The episode.
            observation: Observations keyed by agent id, for exactly the agents that act now.

        Returns:
            Actions keyed by agent id, for exactly the agents observed.
        """
        obs = self._checked(observation, "observation", "get_action", episode_id)
        if not obs:
            raise SpaceError(
                f"get_action for episode '{episode_id}': the observation dict names no agent"
            )
        answer = self._act(episode_id, obs, "get_action")
        return {a: answer[a] for a in obs}

    def log_action(self, episode_id: str, observation: Any, action: Any) -> None:
        """Record observations and the actions someone else took, both keyed by agent id."""
        obs = self._checked(observation, "observation", "log_action", episode_id)
        actions = self._checked(action, "action", "log_action", episode_id)
        if set(obs) != set(actions):
            raise SpaceError(
                f"log_action for episode '{episode_id}': the observation and action dicts name "
                f"different agents ({sorted(map(str, obs))} vs {sorted(map(str, actions))})"
            )
        self._log_action(episode_id, obs, actions, "log_action")

    def log_returns(
        self,
        episode_id: str,
        reward: Any,
        info: Any = None,
        multiagent_done_dict: Mapping[Any, bool] | None = None,
        multiagent_truncated_dict: Mapping[Any, bool] | None = None,
    ) -> None:
        """Add each agent's reward to its previous action; mark agents (or everything) done.

        Args:
            episode_id: The episode.
            reward: Rewards keyed by agent id.
            info: Info maps keyed by agent id.
            multiagent_done_dict: Agent id -> terminated; ``"__all__": True`` ends the episode
                (a later ``end_episode`` of it is then a no-op).
            multiagent_truncated_dict: Agent id -> cut short; ``"__all__"`` ends it truncated.

        Raises:
            EpisodeError: Unknown or ended episode, or a done agent rewarded or marked again.
            SpaceError: A reward is not a finite number in range.
        """
        if not isinstance(reward, Mapping):
            raise SpaceError(
                f"log_returns for episode '{episode_id}': a multi-agent episode takes a dict of "
                f"rewards keyed by agent id, got {type(reward).__name__}"
            )
        rewards = {a: _check_reward(r, episode_id, a) for a, r in reward.items()}
        infos = {}
        if info:
            if not isinstance(info, Mapping):
                raise SpaceError(
                    f"log_returns for episode '{episode_id}': info must be a dict of info maps "
                    "keyed by agent id"
                )
            infos = {a: _check_info(i, episode_id) for a, i in info.items()}
        self._add_returns(
            episode_id,
            rewards,
            infos,
            dict(multiagent_done_dict or {}),
            dict(multiagent_truncated_dict or {}),
        )

    def end_episode(self, episode_id: str, observation: Any, truncated: bool = False) -> None:
        """End the episode with final observations of any of its agents (a dict, may be empty).

        Every agent that is not done yet ends with the episode.
        """
        obs = self._checked(
            {} if observation is None else observation, "observation", "end_episode", episode_id
        )
        self._end(episode_id, obs, truncated)


class ExternalEnvSource(EnvSource):
    """Hosts an :class:`ExternalEnv` or :class:`ExternalMultiAgentEnv` (see the module doc).

    Args:
        env: The external env; its ``run()`` starts on the first :meth:`poll`.
        poll_timeout: Seconds a poll waits for the simulator when nothing is ready.
    """

    def __init__(self, env: _ExternalBase, poll_timeout: float = POLL_TIMEOUT):
        if not isinstance(env, _ExternalBase):
            raise ConfigError(
                f"ExternalEnvSource hosts an ExternalEnv or ExternalMultiAgentEnv, got "
                f"{type(env).__name__}"
            )
        self.env = env
        self.poll_timeout = poll_timeout
        self.observation_spaces = {}
        self.action_spaces = {}
        if not env.multi_agent:
            self.observation_spaces[SINGLE_AGENT] = env.observation_space
            self.action_spaces[SINGLE_AGENT] = env.action_space
        elif isinstance(env.observation_space, gym.spaces.Dict):
            for agent_id in env.observation_space.spaces:
                self._learn(agent_id)
        self._thread: threading.Thread | None = None
        self._waiting: dict[EnvId, set[Any]] = {}  # episode id -> agents asked to act

    @property
    def multi_agent(self) -> bool:
        """Whether the hosted env is an :class:`ExternalMultiAgentEnv`."""
        return self.env.multi_agent

    @property
    def running(self) -> bool:
        """Whether ``run()`` has started and not returned yet."""
        return self._thread is not None and self._thread.is_alive()

    def _learn(self, agent_id: Any) -> None:
        self.observation_spaces[agent_id] = agent_space(self.env, agent_id, "observation")
        self.action_spaces[agent_id] = agent_space(self.env, agent_id, "action")

    def _run(self) -> None:
        env = self.env
        try:
            env.run()
        except BaseException as exc:  # handed to the driver's next poll
            with env._cond:
                if not env._closed:
                    env._error = exc
                env._cond.notify_all()

    def poll(self) -> ExternalPoll:
        """Take at most one call of every episode that made one (waits briefly for one).

        Raises:
            EnvError: ``run()`` raised (the original exception is the cause).
        """
        env = self.env
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name=f"rlserve-external-{type(env).__name__}", daemon=True
            )
            self._thread.start()
        with env._cond:
            env._cond.wait_for(lambda: env._error is not None or self._ready(), self.poll_timeout)
            if env._error is not None:
                error = env._error
                raise EnvError(
                    f"{type(env).__name__}.run() raised {type(error).__name__}: {error}"
                ) from error
            return self._take()

    def _ready(self) -> bool:
        env = self.env
        return bool(env._ended_queue) or any(
            e.calls and eid not in self._waiting for eid, e in env._episodes.items()
        )

    def _take(self) -> ExternalPoll:
        """Move the first queued call of each episode into a poll (lock held)."""
        env = self.env
        poll = ExternalPoll()
        sources: list[tuple[str, _Episode]] = [*env._episodes.items(), *env._ended_queue]
        for episode_id, episode in sources:
            if not episode.calls or episode_id in self._waiting:
                continue
            call = episode.calls.popleft()
            poll.obs[episode_id] = call.obs
            if call.rewards:
                poll.rewards[episode_id] = call.rewards
            if call.infos:
                poll.infos[episode_id] = call.infos
            if call.off_policy is not None:
                poll.off_policy_actions[episode_id] = call.off_policy
            if call.terminated is not None and call.truncated is not None:
                poll.terminated[episode_id] = call.terminated
                poll.truncated[episode_id] = call.truncated
            if call.wants_action:
                self._waiting[episode_id] = set(call.obs)
            if not episode.training_enabled:
                poll.training_disabled.add(episode_id)
            if self.multi_agent:
                for agent_id in call.obs:
                    if agent_id not in self.observation_spaces:
                        self._learn(agent_id)
        if env._ended_queue:
            env._ended_queue = deque(item for item in env._ended_queue if item[1].calls)
        return poll

    def send_actions(self, actions: dict[EnvId, dict[str, Any]]) -> None:
        """Answer the ``get_action`` calls of the last poll (wakes their threads).

        Raises:
            EnvError: An action for an episode or agent that did not ask, or one missing.
        """
        env = self.env
        for episode_id, agent_actions in actions.items():
            wanted = self._waiting.get(episode_id)
            if wanted is None:
                raise EnvError(
                    f"send_actions: episode {episode_id!r} did not ask for an action in the last "
                    "poll (log_action and end_episode calls need none)"
                )
            if set(agent_actions) != wanted:
                raise EnvError(
                    f"send_actions for episode {episode_id!r}: actions for "
                    f"{sorted(map(str, agent_actions))}, but the agents that asked are "
                    f"{sorted(map(str, wanted))}"
                )
        missing = [eid for eid in self._waiting if eid not in actions]
        if missing:
            raise EnvError(
                f"send_actions: no action for episode {missing[0]!r}, which asked in the last "
                "poll; answer every get_action of a poll"
            )
        with env._cond:
            for episode_id, agent_actions in actions.items():
                episode = env._episodes.get(str(episode_id))
                if episode is not None:
                    episode.answer = dict(agent_actions)
            self._waiting.clear()
            env._cond.notify_all()

    def close(self) -> None:
        """Stop serving: threads blocked in ``get_action`` get an :class:`EnvError`."""
        env = self.env
        with env._cond:
            env._closed = True
            env._cond.notify_all()
