"""Checks of a multi-agent env that follows RLlib's ``MultiAgentEnv`` conventions, duck-typed.

Observations, rewards, terminateds, truncateds and infos are dicts keyed by agent id; the
agents in an observation dict are the ones that act next; ``terminateds["__all__"]`` and
``truncateds["__all__"]`` say whether the whole episode is over. An agent's spaces come from
``observation_spaces[agent]``, ``get_observation_space(agent)``, or a Dict ``observation_space``
keyed by agent id (likewise for actions); a plain shared space is taken for every agent.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any

from gymnasium import spaces

from rlserve.env.check_single import FIVE, Step
from rlserve.env.check_values import (
    check_flag,
    check_info,
    check_observation,
    check_reward,
    check_space,
)
from rlserve.env.report import EnvReport
from rlserve.protocol.mapping import ALL_AGENTS

__all__ = ["MultiAgentChecks", "agent_space", "is_multi_agent"]

COMMON_INFO = "__common__"
"""The infos key RLlib reserves for what concerns no single agent."""

_MARKERS = ("possible_agents", "observation_spaces", "get_observation_space")


def is_multi_agent(env: Any) -> bool:
    """Whether ``env`` looks like a multi-agent env (an RLlib-style ``MultiAgentEnv``)."""
    if any(cls.__name__ == "MultiAgentEnv" for cls in type(env).__mro__):
        return True
    return any(hasattr(env, name) for name in _MARKERS)


def agent_space(env: Any, agent: Hashable, role: str) -> tuple[Any, str]:
    """The ``role`` (``"observation"`` or ``"action"``) space of ``agent``, and where it is from.

    Returns:
        The space (None when the env declares none for the agent) and the attribute it came
        from, for messages.
    """
    by_agent = getattr(env, f"{role}_spaces", None)
    if isinstance(by_agent, Mapping) and agent in by_agent:
        return by_agent[agent], f"{role}_spaces[{agent!r}]"
    getter = getattr(env, f"get_{role}_space", None)
    if callable(getter):
        try:
            found = getter(agent)
        except Exception:
            found = None
        if found is not None:
            return found, f"get_{role}_space({agent!r})"
    shared = getattr(env, f"{role}_space", None)
    if isinstance(shared, spaces.Dict) and agent in shared.spaces:
        return shared[agent], f"{role}_space[{agent!r}]"
    if shared is not None and not isinstance(shared, spaces.Dict):
        return shared, f"{role}_space"
    return None, f"{role}_spaces[{agent!r}]"


class MultiAgentChecks:
    """Checks a multi-agent env's per-agent spaces and every ``reset``/``step`` result.

    Args:
        report: Where findings go.
        env: The environment.
        seed: Seeds each agent's action space, so the actions are the same on every run.
    """

    def __init__(self, report: EnvReport, env: Any, seed: int):
        self.report = report
        self.env = env
        self.seed = seed
        self._spaces: dict[Hashable, tuple[Any, Any]] = {}
        self._declared = set(_declared_agents(env))
        self._seen: set[Hashable] = set()
        self._done: set[Hashable] = set()

    def check_spaces(self) -> bool:
        """Check the spaces of the agents the env declares; True (agents may appear later)."""
        for agent in sorted(self._declared, key=str):
            self._agent_spaces(agent)
        return True

    def _agent_spaces(self, agent: Hashable) -> tuple[Any, Any]:
        if agent not in self._spaces:
            found = []
            for role in ("observation", "action"):
                space, owner = agent_space(self.env, agent, role)
                found.append(space if check_space(self.report, space, role, owner) else None)
            if found[1] is not None:
                found[1].seed(self.seed)
            self._spaces[agent] = (found[0], found[1])
        return self._spaces[agent]

    def sample(self, obs: Any) -> dict[Hashable, Any]:
        """An action for every agent with an observation, from its (seeded) action space."""
        if not isinstance(obs, Mapping):
            return {}
        actions = {}
        for agent in obs:
            action_space = self._agent_spaces(agent)[1]
            if action_space is not None:
                actions[agent] = action_space.sample()
        return actions

    def reset_result(self, result: Any) -> Any:
        """Check what ``reset()`` returned; return the observation dict."""
        self._seen.clear()
        self._done.clear()
        if isinstance(result, Mapping):
            self.report.add_problem(
                "reset_signature",
                "reset() returned the observation dict only: return (obs, infos), two dicts "
                "keyed by agent id, e.g. `return obs, {}`",
            )
            obs = result
        elif not isinstance(result, tuple) or len(result) != 2:
            self.report.add_problem(
                "reset_signature", "reset() must return (obs, infos), two dicts keyed by agent id"
            )
            return None
        else:
            obs, infos = result
            if self._is_dict(infos, "infos", "info_type", "reset()"):
                self._check_infos(infos, obs, "reset()")
        if not self._is_dict(obs, "observations", "obs_type", "reset()"):
            return None
        if not obs:
            self.report.add_problem(
                "no_agent_acts",
                "reset() returned no observation, so no agent can act: return the first "
                "observation of every agent that acts first",
            )
        self._check_observations(obs, "reset()")
        return obs

    def step_result(self, result: Any, step: int, episode: int) -> Step | None:
        """Check what ``step()`` returned; None when it cannot be read at all."""
        if not isinstance(result, tuple) or len(result) != 5:
            self.report.add_problem(
                "step_signature",
                f"step() must return 5 dicts keyed by agent id {FIVE}, not "
                f"{len(result) if isinstance(result, tuple) else type(result).__name__} values",
            )
            return None
        obs, rewards, terminateds, truncateds, infos = result
        obs_ok = self._is_dict(obs, "observations", "obs_type", "step()")
        if obs_ok:
            self._check_observations(obs, "step()")
        total = 0.0
        if self._is_dict(rewards, "rewards", "reward_type", "step()"):
            for agent, reward in rewards.items():
                self._check_key(agent, "rewards")
                total += check_reward(self.report, reward, f"step() for agent {agent!r}")
        over = [False, False]
        for index, (flags, name) in enumerate(
            ((terminateds, "terminated"), (truncateds, "truncated"))
        ):
            if self._is_dict(flags, f"{name}s", f"{name}_type", "step()"):
                over[index] = self._check_flags(flags, name)
        if self._is_dict(infos, "infos", "info_type", "step()") and obs_ok:
            self._check_infos(infos, obs, "step()")
        terminated, truncated = over
        if terminated and truncated:
            self.report.add_warning(
                "terminated_and_truncated",
                f"step() returned terminateds and truncateds with '__all__' both True (step "
                f"{step} of episode {episode}): rlserve treats it as terminated; set "
                "truncateds['__all__'] = False when the task really ended",
            )
        if obs_ok and not obs and not (terminated or truncated):
            self.report.add_problem(
                "no_agent_acts",
                f"step() returned no observation while the episode goes on (step {step} of "
                f"episode {episode}), so no agent can act next: return the observation of every "
                "agent that acts next, or set terminateds['__all__'] = True",
            )
        return Step(obs, total, terminated or truncated)

    def _is_dict(self, value: Any, name: str, kind: str, where: str) -> bool:
        if isinstance(value, Mapping):
            return True
        self.report.add_problem(
            kind,
            f"{where} returned {name} of type {type(value).__name__}: a multi-agent env returns "
            f"{name} as a dict keyed by agent id",
        )
        return False

    def _check_observations(self, obs: Mapping[Hashable, Any], where: str) -> None:
        for agent, value in obs.items():
            if agent == ALL_AGENTS:
                self.report.add_problem(
                    "unknown_agent",
                    f"{where} returned an observation for '__all__': that key is only for "
                    "terminateds and truncateds",
                )
                continue
            if agent in self._done:
                self.report.add_problem(
                    "agent_after_done",
                    f"{where} returned an observation for agent {agent!r}, which was already "
                    "terminated or truncated in this episode: leave a done agent out of the "
                    "observations until the next reset",
                )
            self._seen.add(agent)
            observation_space = self._agent_spaces(agent)[0]
            if observation_space is not None:
                check_observation(
                    self.report, value, observation_space, f"{where} for agent {agent!r}"
                )

    def _check_key(self, agent: Hashable, name: str) -> None:
        if agent == ALL_AGENTS or (agent not in self._seen and agent not in self._declared):
            self.report.add_problem(
                "unknown_agent",
                f"step() returned {name} for {agent!r}, which is not an agent of the env (none "
                "of possible_agents, nor an agent with an observation in this episode): key "
                f"{name} by agent id"
                + (
                    " ('__all__' belongs in terminateds and truncateds only)"
                    if agent == ALL_AGENTS
                    else ""
                ),
            )

    def _check_flags(self, flags: Mapping[Hashable, Any], name: str) -> bool:
        if ALL_AGENTS not in flags:
            self.report.add_problem(
                "all_missing",
                f"step() returned {name}s without the '__all__' key: set {name}s['__all__'] "
                "(True when the whole episode is over, else False) on every step",
            )
        over = False
        for agent, flag in flags.items():
            value = check_flag(self.report, flag, name, f"step() for {agent!r}")
            if agent == ALL_AGENTS:
                over = value
                continue
            self._check_key(agent, f"{name}s")
            if value:
                self._done.add(agent)
        return over

    def _check_infos(self, infos: Mapping[Hashable, Any], obs: Any, where: str) -> None:
        for agent, info in infos.items():
            check_info(self.report, info, f"{where} for {agent!r}")
            if agent != COMMON_INFO and isinstance(obs, Mapping) and agent not in obs:
                self.report.add_warning(
                    "info_keys",
                    f"{where} returned infos for {agent!r} without an observation for it: RLlib "
                    "requires infos keyed by agents in the same observations (or '__common__'), "
                    "so key infos by the agents that act next",
                )


def _declared_agents(env: Any) -> list[Hashable]:
    for name in ("possible_agents", "agents"):
        agents = getattr(env, name, None)
        if isinstance(agents, list | tuple | set | frozenset) and agents:
            return list(agents)
    by_agent = getattr(env, "observation_spaces", None)
    if isinstance(by_agent, Mapping):
        return list(by_agent)
    return []
