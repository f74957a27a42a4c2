"""Multi-agent environments: the :class:`MultiAgentEnv` base class and the source that hosts it.

:class:`MultiAgentEnv` follows RLlib's multi-agent API, so an RLlib environment works unchanged:
``reset`` and ``step`` return dicts keyed by agent id, ``terminateds``/``truncateds`` carry
``"__all__"`` for the whole episode, and agents act at their own pace: exactly the agents in the
observation dict ``step`` returns act next (a turn-based game returns one agent at a time), and a
reward may arrive for an agent that does not act next (it belongs to that agent's previous
action).

:class:`MultiAgentSource` steps ``num_envs`` copies in this process (env ids ``0..N-1``) and
resets a copy by itself when its episode ends, handing the new episode's first observations over
in the same poll (``Poll.reset_obs``), so the copies stay in step.
:class:`~rlserve.env.ProcessMultiAgentSource` is the same source with each copy's ``reset`` and
``step`` in a sub-process or Ray actor (``remote_worker_envs``). Whatever a copy returns is
checked first: a malformed result raises :class:`~rlserve.errors.EnvError` naming the env, the
agent and the fix, rather than training on garbage or waiting forever for an agent that will
never act.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

from rlserve.env.base import EnvId, EnvSource, Poll
from rlserve.errors import ConfigError, EnvError
from rlserve.protocol.mapping import ALL_AGENTS

__all__ = ["COMMON_INFO", "MultiAgentEnv", "MultiAgentSource", "agent_space", "known_agents"]

COMMON_INFO = "__common__"
"""The ``infos`` key RLlib uses for information about no agent in particular."""

MultiAgentDict = dict[Any, Any]


class MultiAgentEnv(gym.Env[MultiAgentDict, MultiAgentDict]):
    """Base class of environments with several agents, RLlib's multi-agent API.

    Subclasses set ``possible_agents`` (every agent id that can appear, when known), keep
    ``agents`` (those in the current episode) up to date, and give their spaces either as
    ``observation_spaces``/``action_spaces`` dicts keyed by agent id (preferred) or, as in
    RLlib's older API, as one ``observation_space``/``action_space`` that is a
    :class:`gymnasium.spaces.Dict` keyed by agent id. A single non-Dict space is shared by every
    agent.

    Implement:

    * ``reset(*, seed=None, options=None) -> (obs, infos)``: both dicts keyed by agent id, for
      the agents that act first.
    * ``step(action_dict) -> (obs, rewards, terminateds, truncateds, infos)``: ``action_dict``
      holds an action for each agent of the previous observation dict; the returned ``obs``
      names the agents that act next (an agent that is done gets its final observation there);
      ``terminateds``/``truncateds`` map agents to flags and must hold ``"__all__"``;
      ``rewards`` may name any agent of the episode.
    """

    possible_agents: list[Any]
    agents: list[Any]
    observation_spaces: dict[Any, gym.Space[Any]]
    action_spaces: dict[Any, gym.Space[Any]]

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[MultiAgentDict, MultiAgentDict]:
        """Start an episode: the first observations and infos, keyed by agent id.

        Args:
            seed: Seeds the environment's random generator (``self.np_random``).
            options: Environment-specific reset options.
        """
        super().reset(seed=seed, options=options)
        raise NotImplementedError(f"{type(self).__name__} must implement reset()")

    def step(  # type: ignore[override]  # dicts by agent: RLlib's multi-agent signature
        self, action_dict: MultiAgentDict
    ) -> tuple[MultiAgentDict, MultiAgentDict, MultiAgentDict, MultiAgentDict, MultiAgentDict]:
        """Apply the actions of the agents that were asked to act.

        Returns:
            ``(obs, rewards, terminateds, truncateds, infos)``, each a dict keyed by agent id;
            ``terminateds`` and ``truncateds`` also hold ``"__all__"``.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement step()")

    def get_agent_ids(self) -> set[Any]:
        """Every agent id that can appear (``possible_agents``, else the spaces' keys)."""
        return set(known_agents(self))

    def get_observation_space(self, agent_id: Any) -> gym.Space[Any]:
        """The observation space of one agent."""
        return agent_space(self, agent_id, "observation")

    def get_action_space(self, agent_id: Any) -> gym.Space[Any]:
        """The action space of one agent."""
        return agent_space(self, agent_id, "action")

    @property
    def num_agents(self) -> int:
        """How many agents the current episode has."""
        return len(getattr(self, "agents", []))

    @property
    def max_num_agents(self) -> int:
        """How many agents can appear at most (0 when not declared)."""
        return len(known_agents(self))


def agent_space(env: Any, agent_id: Any, kind: str) -> gym.Space[Any]:
    """One agent's space from any RLlib-style multi-agent env (subclass of ours or not).

    Looks at ``get_<kind>_space(agent_id)`` when the env defines its own, then
    ``<kind>_spaces[agent_id]``, then a ``<kind>_space`` that is a Dict keyed by agent id, then a
    single ``<kind>_space`` shared by every agent.

    Args:
        env: The environment.
        agent_id: The agent.
        kind: ``"observation"`` or ``"action"``.

    Raises:
        ConfigError: The env declares no space for the agent.
    """
    getter = getattr(type(env), f"get_{kind}_space", None)
    if getter is not None and getter not in _OUR_GETTERS:
        space = getter(env, agent_id)
        if space is not None:
            return space
    per_agent = getattr(env, f"{kind}_spaces", None)
    if isinstance(per_agent, Mapping) and per_agent:
        if agent_id in per_agent:
            return per_agent[agent_id]
        raise ConfigError(
            f"{_name(env)}: agent {agent_id!r} has no entry in {kind}_spaces (it has "
            f"{sorted(map(str, per_agent))}); add the agent's space there"
        )
    single = getattr(env, f"{kind}_space", None)
    if isinstance(single, gym.spaces.Dict) and agent_id in single.spaces:
        return single.spaces[agent_id]
    known = known_agents(env)
    if isinstance(single, gym.spaces.Dict) and (set(single.spaces) & set(known)):
        raise ConfigError(
            f"{_name(env)}: agent {agent_id!r} has no entry in the Dict {kind}_space keyed by "
            f"agent id (it has {sorted(map(str, single.spaces))}); add the agent's space there"
        )
    if isinstance(single, gym.Space):
        return single
    raise ConfigError(
        f"{_name(env)} declares no {kind} space for agent {agent_id!r}: set {kind}_spaces "
        f"(a dict keyed by agent id) or {kind}_space"
    )


_OUR_GETTERS = (MultiAgentEnv.get_observation_space, MultiAgentEnv.get_action_space)


def known_agents(env: Any) -> list[Any]:
    """Every agent id ``env`` declares: ``possible_agents``, else its spaces' keys (may be [])."""
    possible = getattr(env, "possible_agents", None)
    if possible:
        return list(possible)
    for kind in ("observation", "action"):
        per_agent = getattr(env, f"{kind}_spaces", None)
        if isinstance(per_agent, Mapping) and per_agent:
            return list(per_agent)
    return []


def _name(env: Any) -> str:
    return type(env).__name__


@dataclass(slots=True)
class _Copy:
    """The bookkeeping of one copy: which of its agents wait for an action, which are done."""

    env: Any
    name: str
    waiting: set[Any] = field(default_factory=set)
    seen: set[Any] = field(default_factory=set)
    done: set[Any] = field(default_factory=set)


class MultiAgentSource(EnvSource):
    """``num_envs`` copies of a multi-agent env stepped in this process (env ids ``0..N-1``).

    Each copy resets by itself once its episode is over (``"__all__"``); the poll that reports
    the end also holds the next episode's first observations in ``reset_obs``. No actions are
    taken off-policy. ``observation_spaces``/``action_spaces`` hold every agent the env declares
    (``possible_agents`` or its spaces' keys); an agent that appears without having been
    declared is added when it is first seen.

    Args:
        env: A callable returning a new env (called ``num_envs`` times), or a list of envs
            (one per copy; ``num_envs`` is then their count).
        num_envs: How many copies of a callable's env.
        seed: Seeds the first reset of copy ``i`` with ``seed + i`` (later resets continue the
            env's own random stream); None: unseeded.

    Raises:
        ConfigError: ``num_envs`` is below 1, or a list and a different ``num_envs`` are given.
    """

    def __init__(
        self,
        env: Callable[[], Any] | Sequence[Any],
        num_envs: int | None = None,
        seed: int | None = None,
    ):
        if callable(env):
            count = 1 if num_envs is None else num_envs
            if count < 1:
                raise ConfigError(f"num_envs must be at least 1, got {count}")
            envs = [env() for _ in range(count)]
        else:
            envs = list(env)
            if not envs or (num_envs is not None and num_envs != len(envs)):
                raise ConfigError(
                    f"MultiAgentSource got {len(envs)} envs but num_envs={num_envs}; pass a "
                    "callable that makes one env, or a non-empty list of envs"
                )
        self.num_envs = len(envs)
        self.seed = seed
        self._copies = [_Copy(e, _name(e)) for e in envs]
        self.env_name = self._copies[0].name
        self.observation_spaces = {}
        self.action_spaces = {}
        for agent_id in known_agents(envs[0]):
            self._add_agent(agent_id, envs[0])
        self._pending: Poll | None = None
        self._started = False

    # -- the EnvSource interface -------------------------------------------------------------

    def poll(self) -> Poll:
        """The first poll resets every copy; later ones return the last step's results."""
        if not self._started:
            self._started = True
            poll = Poll()
            for i, copy in enumerate(self._copies):
                seed = None if self.seed is None else self.seed + i
                obs, infos = self._reset(i, copy, seed)
                poll.obs[i] = obs
                if infos:
                    poll.infos[i] = infos
            return poll
        pending, self._pending = self._pending, None
        return pending if pending is not None else Poll()

    def send_actions(self, actions: dict[EnvId, dict[str, Any]]) -> None:
        """Step every copy with the actions of its agents that were asked to act.

        Raises:
            EnvError: An action for an agent that was not asked to act (not in the copy's last
                observations, or done), an action missing, or a copy returned a malformed step.
        """
        for env_id in actions:
            if not isinstance(env_id, int) or not 0 <= env_id < self.num_envs:
                raise EnvError(
                    f"send_actions: env id {env_id!r} is not one of this source's copies "
                    f"(0..{self.num_envs - 1})"
                )
        stepping = {}
        for i, copy in enumerate(self._copies):
            given = actions.get(i, {})
            self._check_actions(i, copy, given)
            if copy.waiting:
                stepping[i] = dict(given)
        poll = Poll()
        for i, result in self._step_copies(stepping, poll).items():
            self._record_step(i, self._copies[i], result, poll)
        self._pending = poll

    def _step_copies(self, actions: dict[int, dict[Any, Any]], poll: Poll) -> dict[int, Any]:
        """Step copy ``i`` with ``actions[i]``; each one's ``step`` result, by copy in order.

        A subclass that steps the copies elsewhere may leave a failed copy out, having put its
        failure and its next episode's first observations in ``poll`` itself.
        """
        return {i: self._copies[i].env.step(given) for i, given in actions.items()}

    def try_reset(self, env_id: EnvId) -> None:
        """Abandon copy ``env_id``'s episode; the next poll holds its new first observations."""
        if not isinstance(env_id, int) or not 0 <= env_id < self.num_envs:
            raise EnvError(f"try_reset: env id {env_id!r} is not one of this source's copies")
        obs, infos = self._reset(env_id, self._copies[env_id], None)
        poll = self._pending if self._pending is not None else Poll()
        for part in (poll.rewards, poll.terminated, poll.truncated, poll.infos):
            part.pop(env_id, None)
        poll.obs[env_id] = obs
        if infos:
            poll.infos[env_id] = infos
        self._pending = poll

    def close(self) -> None:
        """Close every copy."""
        for copy in self._copies:
            close = getattr(copy.env, "close", None)
            if close is not None:
                close()

    # -- checks and bookkeeping --------------------------------------------------------------

    def _add_agent(self, agent_id: Any, env: Any) -> None:
        self.observation_spaces[agent_id] = agent_space(env, agent_id, "observation")
        self.action_spaces[agent_id] = agent_space(env, agent_id, "action")

    def _where(self, i: int, copy: _Copy) -> str:
        return f"{copy.name} (env id {i})"

    def _reset(
        self, i: int, copy: _Copy, seed: int | None
    ) -> tuple[dict[Any, Any], dict[Any, Any]]:
        result = copy.env.reset(seed=seed)
        where = self._where(i, copy)
        if not (isinstance(result, tuple) and len(result) == 2):
            raise EnvError(
                f"{where}: reset() must return (obs_dict, info_dict), got {_describe(result)}"
            )
        obs, infos = result
        _check_dict(obs, where, "reset()", "observations")
        _check_dict(infos, where, "reset()", "infos")
        if not obs:
            raise EnvError(
                f"{where}: reset() returned no observations, so no agent would ever act; return "
                "the first observation of at least one agent"
            )
        copy.waiting, copy.seen, copy.done = set(obs), set(obs), set()
        self._learn_agents(obs, copy.env)
        return dict(obs), dict(infos)

    def _learn_agents(self, agent_ids: Any, env: Any) -> None:
        # Asks the copy that showed the agent: a new agent may exist in that copy only.
        for agent_id in agent_ids:
            if agent_id not in self.observation_spaces:
                self._add_agent(agent_id, env)

    def _check_actions(self, i: int, copy: _Copy, given: Mapping[Any, Any]) -> None:
        extra = [a for a in given if a not in copy.waiting]
        if extra:
            raise EnvError(
                f"send_actions for {self._where(i, copy)}: an action for agent {extra[0]!r}, "
                "which was not asked to act (the last observations named "
                f"{sorted(map(str, copy.waiting))}); send actions only for the agents of the "
                "last poll's obs that are not done"
            )
        missing = [a for a in copy.waiting if a not in given]
        if missing:
            raise EnvError(
                f"send_actions for {self._where(i, copy)}: no action for agent {missing[0]!r}, "
                "which the last poll asked to act; answer every agent of the last poll's obs "
                "that is not done"
            )

    def _record_step(self, i: int, copy: _Copy, result: Any, poll: Poll) -> None:
        where = self._where(i, copy)
        if not (isinstance(result, tuple) and len(result) == 5):
            raise EnvError(
                f"{where}: step() must return (obs, rewards, terminateds, truncateds, infos), got "
                f"{_describe(result)}; a 4-tuple with 'dones' is the pre-Gymnasium API: split "
                "dones into terminateds and truncateds"
            )
        obs, rewards, terminateds, truncateds, infos = result
        for name, value in zip(
            ("observations", "rewards", "terminateds", "truncateds", "infos"), result, strict=True
        ):
            _check_dict(value, where, "step()", name)
        for name, flags in (("terminateds", terminateds), ("truncateds", truncateds)):
            if ALL_AGENTS not in flags:
                raise EnvError(
                    f"{where}: step() returned {name} without '{ALL_AGENTS}'; set "
                    f"{name}['{ALL_AGENTS}'] to whether the whole episode is over"
                )
        over = bool(terminateds[ALL_AGENTS]) or bool(truncateds[ALL_AGENTS])
        for agent_id in obs:
            if agent_id in copy.done:
                raise EnvError(
                    f"{where}: step() returned an observation for agent {agent_id!r}, which was "
                    "already done in this episode; a done agent may not come back (use a new "
                    "agent id)"
                )
        copy.seen.update(obs)
        self._learn_agents(obs, copy.env)
        known = copy.seen | set(known_agents(copy.env))
        for name, mapping in (
            ("rewards", rewards),
            ("terminateds", terminateds),
            ("truncateds", truncateds),
        ):
            for agent_id in mapping:
                if agent_id != ALL_AGENTS and agent_id not in known:
                    raise EnvError(
                        f"{where}: step() returned {name} for {agent_id!r}, which is not an agent "
                        f"of this episode (agents so far: {sorted(map(str, copy.seen))}); key "
                        "rewards and done flags by the ids of agents that got observations"
                    )
        ended = {a for a in copy.seen if terminateds.get(a) or truncateds.get(a)}
        if over:
            # Every agent of the episode ends with it, whether or not the env flagged it.
            terminated_all, truncated_all = (
                bool(terminateds[ALL_AGENTS]),
                bool(truncateds[ALL_AGENTS]),
            )
            terminateds, truncateds = dict(terminateds), dict(truncateds)
            for agent_id in copy.seen - copy.done:
                if agent_id not in ended:
                    terminateds[agent_id] = terminated_all and not truncated_all
                    truncateds[agent_id] = truncated_all
        elif not (set(obs) - ended):
            raise EnvError(
                f"{where}: step() returned no observation for any agent that is still playing "
                f"while {ALL_AGENTS} is not set, so no agent would act again and the episode "
                "could never end; return the next acting agent's observation, or set "
                f"terminateds['{ALL_AGENTS}'] (or truncateds) when the episode is over"
            )
        copy.done |= ended
        poll.obs[i] = dict(obs)
        if rewards:
            poll.rewards[i] = {a: _reward(r, where, a) for a, r in rewards.items()}
        poll.terminated[i] = {a: bool(v) for a, v in terminateds.items()}
        poll.truncated[i] = {a: bool(v) for a, v in truncateds.items()}
        if infos:
            poll.infos[i] = dict(infos)
        if over:
            reset_obs, reset_infos = self._reset(i, copy, None)
            poll.reset_obs[i] = reset_obs
            if reset_infos:
                poll.reset_infos[i] = reset_infos
        else:
            copy.waiting = set(obs) - copy.done


def _check_dict(value: Any, where: str, call: str, name: str) -> None:
    if not isinstance(value, Mapping):
        raise EnvError(
            f"{where}: {call} returned {name} as {_describe(value)}; a multi-agent env returns "
            "dicts keyed by agent id (wrap a single-agent env's values as {'agent0': value}, or "
            "host it as a single-agent env)"
        )


def _reward(value: Any, where: str, agent_id: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise EnvError(
            f"{where}: step() returned reward {value!r} for agent {agent_id!r}; a reward is one "
            "number"
        ) from None


def _describe(value: Any) -> str:
    if isinstance(value, tuple):
        return f"a tuple of {len(value)}"
    return type(value).__name__
