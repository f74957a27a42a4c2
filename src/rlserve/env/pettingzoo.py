"""PettingZoo environments as :class:`~rlserve.env.MultiAgentEnv` (then hosted by its source).

Both PettingZoo APIs become the one multi-agent API, so :class:`~rlserve.env.MultiAgentSource`
hosts them like any other multi-agent env:

* :class:`ParallelPettingZooEnv` wraps a ``ParallelEnv`` (every live agent acts each step).
  PettingZoo has no ``"__all__"``: the episode is over when ``env.agents`` is empty after a
  step, or when every agent of the step is terminated or truncated. ``"__all__"`` is then
  truncated when every agent that ended in that step was truncated, else terminated.
* :class:`PettingZooEnv` wraps an ``AECEnv`` (turn-based). The observation dict holds the one
  agent whose turn it is; its reward is ``env.last()``'s, i.e. what the agent accumulated since
  its previous turn (PettingZoo's ``_cumulative_rewards``), so no reward is lost between turns.
  A done agent is stepped with ``None`` as PettingZoo requires; its final observation, reward
  and flag arrive in the same result as the next acting agent. The episode is over
  (``"__all__"``) once ``env.agents`` is empty.

PettingZoo is an optional dependency (the ``pettingzoo`` extra): it is imported
only when one of these classes is built.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import gymnasium as gym

from rlserve.env.multi_agent import MultiAgentEnv
from rlserve.errors import ConfigError, EnvError
from rlserve.protocol.mapping import ALL_AGENTS

__all__ = [
    "ParallelPettingZooEnv",
    "PettingZooEnv",
    "as_multi_agent",
    "from_pettingzoo",
    "require_pettingzoo",
]

MultiAgentDict = dict[Any, Any]


def require_pettingzoo() -> ModuleType:
    """Import PettingZoo, or explain how to install it.

    Raises:
        ConfigError: PettingZoo is not installed.
    """
    try:
        import pettingzoo
    except ImportError as exc:
        raise ConfigError(
            "PettingZoo environments need the pettingzoo package: pip install pettingzoo (or "
            "pip install -e '.[pettingzoo]' in rlserve's checkout)"
        ) from exc
    return pettingzoo


def from_pettingzoo(env: Any) -> MultiAgentEnv:
    """Wrap a PettingZoo env of either API (AEC or Parallel) as a :class:`MultiAgentEnv`.

    Raises:
        ConfigError: PettingZoo is missing, or ``env`` is neither an ``AECEnv`` nor a
            ``ParallelEnv``.
    """
    pz = require_pettingzoo()
    if isinstance(env, pz.AECEnv):
        return PettingZooEnv(env)
    if isinstance(env, pz.ParallelEnv):
        return ParallelPettingZooEnv(env)
    raise ConfigError(
        f"{type(env).__name__} is not a PettingZoo AECEnv or ParallelEnv; subclass one of them "
        "(or rlserve.env.MultiAgentEnv)"
    )


def as_multi_agent(made: Any) -> MultiAgentEnv | None:
    """``made`` as a MultiAgentEnv (PettingZoo envs adapted), or None when it is neither.

    Raises:
        ConfigError: ``made`` looks like a PettingZoo env but PettingZoo is missing.
    """
    if isinstance(made, MultiAgentEnv):
        return made
    module = type(made).__module__ or ""
    if (
        module.startswith("pettingzoo")
        or hasattr(made, "agent_iter")
        or (
            hasattr(made, "possible_agents")
            and hasattr(made, "observation_space")
            and callable(made.observation_space)
        )
    ):
        return from_pettingzoo(made)
    return None


class _PettingZooBase(MultiAgentEnv):
    """What both wrappers share: spaces by agent through PettingZoo's space methods."""

    def __init__(self, env: Any):
        require_pettingzoo()
        self.env = env
        self.metadata = getattr(env, "metadata", {})
        self.render_mode = getattr(env, "render_mode", None)
        possible = getattr(env, "possible_agents", None)
        self.possible_agents = list(possible) if possible else []
        self.agents = []
        self.observation_spaces = {a: env.observation_space(a) for a in self.possible_agents}
        self.action_spaces = {a: env.action_space(a) for a in self.possible_agents}

    def get_observation_space(self, agent_id: Any) -> gym.Space[Any]:
        """The agent's observation space, as the PettingZoo env gives it."""
        return self.env.observation_space(agent_id)

    def get_action_space(self, agent_id: Any) -> gym.Space[Any]:
        """The agent's action space, as the PettingZoo env gives it."""
        return self.env.action_space(agent_id)

    def render(self) -> Any:
        """Render the wrapped env."""
        return self.env.render()

    def close(self) -> None:
        """Close the wrapped env."""
        self.env.close()


class ParallelPettingZooEnv(_PettingZooBase):
    """A PettingZoo ``ParallelEnv`` as a :class:`MultiAgentEnv` (see the module doc).

    Args:
        env: The ParallelEnv.
    """

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[MultiAgentDict, MultiAgentDict]:
        """Reset the wrapped env; observations of every live agent."""
        obs, infos = self.env.reset(seed=seed, options=options)
        self.agents = list(self.env.agents)
        return dict(obs), dict(infos or {})

    def step(  # type: ignore[override]  # dicts by agent: RLlib's multi-agent signature
        self, action_dict: MultiAgentDict
    ) -> tuple[MultiAgentDict, MultiAgentDict, MultiAgentDict, MultiAgentDict, MultiAgentDict]:
        """Step every live agent; adds ``"__all__"`` to the done flags."""
        obs, rewards, terminateds, truncateds, infos = self.env.step(action_dict)
        terminateds, truncateds = dict(terminateds), dict(truncateds)
        self.agents = list(self.env.agents)
        ended = [a for a in obs if terminateds.get(a) or truncateds.get(a)]
        over = not self.agents or (bool(obs) and len(ended) == len(obs))
        truncated_all = over and bool(ended) and all(truncateds.get(a) for a in ended)
        terminateds[ALL_AGENTS] = over and not truncated_all
        truncateds[ALL_AGENTS] = truncated_all
        return dict(obs), dict(rewards), terminateds, truncateds, dict(infos or {})


class PettingZooEnv(_PettingZooBase):
    """A PettingZoo ``AECEnv`` (turn-based) as a :class:`MultiAgentEnv` (see the module doc).

    Args:
        env: The AECEnv.
    """

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[MultiAgentDict, MultiAgentDict]:
        """Reset the wrapped env; the observation of the agent whose turn is first."""
        self.env.reset(seed=seed, options=options)
        obs, _, _, _, infos, over = self._advance()
        if over or not obs:
            raise EnvError(
                f"{type(self.env).__name__}: reset() left no agent to act (env.agents is empty "
                "or every agent is done)"
            )
        return obs, infos

    def step(  # type: ignore[override]  # dicts by agent: RLlib's multi-agent signature
        self, action_dict: MultiAgentDict
    ) -> tuple[MultiAgentDict, MultiAgentDict, MultiAgentDict, MultiAgentDict, MultiAgentDict]:
        """Play the current agent's action, then run to the next agent that must act."""
        acting = self.env.agent_selection
        if acting not in action_dict:
            raise EnvError(
                f"{type(self.env).__name__}: it is agent {acting!r}'s turn but the actions name "
                f"{sorted(map(str, action_dict))}; send the action of the agent in the last "
                "observations"
            )
        self.env.step(action_dict[acting])
        obs, rewards, terminateds, truncateds, infos, over = self._advance()
        truncated_all = over and bool(truncateds) and all(truncateds.values())
        terminateds[ALL_AGENTS] = over and not truncated_all
        truncateds[ALL_AGENTS] = truncated_all
        return obs, rewards, terminateds, truncateds, infos

    def _advance(
        self,
    ) -> tuple[
        MultiAgentDict, MultiAgentDict, MultiAgentDict, MultiAgentDict, MultiAgentDict, bool
    ]:
        """Step done agents with None until a live agent's turn comes, or no agent is left.

        Returns the final observations of the agents that ended on the way, the next live
        agent's observation, their rewards (since each one's previous turn), flags and infos,
        and whether the episode is over.
        """
        env = self.env
        obs: MultiAgentDict = {}
        rewards: MultiAgentDict = {}
        terminateds: MultiAgentDict = {}
        truncateds: MultiAgentDict = {}
        infos: MultiAgentDict = {}
        # Each done agent is stepped once, so the loop ends; the bound is a guard against an env
        # that keeps selecting the same done agent.
        for _ in range(len(env.agents) + 1):
            if not env.agents:
                break
            agent = env.agent_selection
            observation, reward, terminated, truncated, info = env.last()
            obs[agent] = observation
            rewards[agent] = float(reward)
            if info:
                infos[agent] = info
            if not (terminated or truncated):
                self.agents = list(env.agents)
                return obs, rewards, terminateds, truncateds, infos, False
            terminateds[agent] = bool(terminated)
            truncateds[agent] = bool(truncated)
            env.step(None)
        else:
            raise EnvError(
                f"{type(env).__name__}: stepping done agents with None did not remove them "
                f"(agents left: {sorted(map(str, env.agents))}); an AEC env must drop a done "
                "agent when it is stepped with None"
            )
        self.agents = []
        return obs, rewards, terminateds, truncateds, infos, True
