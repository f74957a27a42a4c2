"""What one worker of remote sub-environments does: make its copies, answer reset and step.

The body every backend of the remote sources shares: a sub-process drives it over its pipe
(:func:`~rlserve.env.subprocess.run_copies`), a Ray actor through method calls
(:mod:`rlserve.cluster.envs`). It makes its copies first and greets with their kind, so the
parent learns whether the env is single-agent (:class:`~rlserve.env.ProcessVectorSource`) or
multi-agent (:class:`~rlserve.env.subprocess_multi.ProcessMultiAgentSource`) without making a
copy itself. Messages and answers are the maps the module doc of :mod:`rlserve.env.subprocess`
lists; a multi-agent worker's ``reset`` and ``step`` are keyed by copy instead (see
:meth:`EnvCopies.handle`). :meth:`EnvCopies.handle` never raises (whatever goes wrong is its
``error`` answer).
"""

from __future__ import annotations

import contextlib
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym

from rlserve.env.multi_agent import MultiAgentEnv, agent_space, known_agents
from rlserve.env.pettingzoo import as_multi_agent
from rlserve.env.stacking import ObsStacker
from rlserve.env.vector import reset_checked, step_copies
from rlserve.errors import ConfigError, EnvError
from rlserve.protocol.mapping import ALL_AGENTS

__all__ = ["EnvCopies"]


@dataclass
class _Stamp:
    value: float = 0.0


class EnvCopies:
    """Copies of one env, made from ``creators``, stepped one after the other.

    Attributes:
        greeting: The first answer: ``ok`` with ``{"multi_agent": False, "spaces": (obs, act)}``
            or ``{"multi_agent": True, "name": ..., "agents": [...], "spaces": {agent: (obs,
            act)}}``; ``config_error`` (the env cannot be made: not worth a restart) or
            ``error``.
        done: Whether the worker should end (it answered ``error``, or was told to close).
    """

    def __init__(self, creators: Sequence[Callable[[], Any]]) -> None:
        self._envs: list[Any] = []
        self._stamp = _Stamp(time.monotonic())
        self.done = False
        self.multi_agent = False
        self._reported: set[Any] = set()
        try:
            made = [create() for create in creators]
            self._envs = made
            self.multi_agent = _is_multi_agent(made[0])
            self._envs = [_adapt(env, self.multi_agent) for env in made]
            first = self._envs[0]
            if self.multi_agent:
                agents = known_agents(first)
                result: dict[str, Any] = {
                    "multi_agent": True,
                    "name": type(first).__name__,
                    "agents": agents,
                    "spaces": self._spaces(first, agents),
                }
            else:
                self._stacker = ObsStacker(first.observation_space)
                spaces = (first.observation_space, first.action_space)
                result = {"multi_agent": False, "spaces": spaces}
        except ConfigError as e:  # not an env, bad env_config: no point restarting
            self.close()
            self.greeting: dict[str, Any] = {"type": "config_error", "reason": str(e)}
            self.done = True
            return
        except Exception as e:
            self.close()
            self.greeting = _error(e)
            self.done = True
            return
        self.greeting = {"type": "ok", "result": result}

    @property
    def stamp(self) -> Any:
        """:func:`time.monotonic` of its last answer, in ``value``."""
        return self._stamp

    def handle(self, message: dict[str, Any]) -> dict[str, Any]:
        """The answer to ``reset`` or ``step``: ``ok`` with the result, or ``error``.

        A multi-agent worker's ``reset`` takes ``seeds`` as ``{copy: seed}`` (the copies to
        reset) and answers ``{copy: (reset_result, new_spaces)}``; its ``step`` takes
        ``actions`` as ``{copy: {agent: action}}`` and answers ``{copy: (step_result,
        reset_result or None, new_spaces)}``, a copy whose episode is over (``__all__``) being
        reset at once, as in process. ``new_spaces`` holds ``{agent: (obs, act)}`` for the
        agents this worker shows for the first time. A space the env cannot give is a
        ``config_error``.
        """
        try:
            kind = message["type"]
            if kind == "step":
                if self.multi_agent:
                    result: Any = self._step_agents(message["actions"])
                else:
                    result = step_copies(self._envs, message["actions"], self._stacker)
            elif kind == "reset":
                seeds = message["seeds"]
                if self.multi_agent:
                    result = {j: self._reset_agents(j, s) for j, s in seeds.items()}
                else:
                    result = [
                        reset_checked(env, seed=s) for env, s in zip(self._envs, seeds, strict=True)
                    ]
            else:
                self.done = True
                return {"type": "closed"}
        except (ConfigError, EnvError) as e:  # the env breaks the API: restarting cannot help
            self.done = True
            return {"type": "config_error", "reason": str(e)}
        except Exception as e:
            self.done = True
            return _error(e)
        self._stamp.value = time.monotonic()
        return {"type": "ok", "result": result}

    def close(self) -> None:
        """Close every copy (idempotent)."""
        envs, self._envs = self._envs, []
        for env in envs:
            with contextlib.suppress(Exception):
                env.close()

    # -- multi-agent copies --------------------------------------------------------------

    def _reset_agents(self, j: int, seed: int | None) -> tuple[Any, dict[Any, Any]]:
        env = self._envs[j]
        result = env.reset(seed=seed)
        return result, self._new_spaces(env, _first(result, 2))

    def _step_agents(self, actions: Mapping[int, Any]) -> dict[int, Any]:
        answers = {}
        for j, action_dict in actions.items():
            env = self._envs[j]
            result = env.step(action_dict)
            spaces = self._new_spaces(env, _first(result, 5))
            reset = None
            if _over(result):
                reset = env.reset(seed=None)
                spaces.update(self._new_spaces(env, _first(reset, 2)))
            answers[j] = (result, reset, spaces)
        return answers

    def _new_spaces(self, env: Any, obs: Any) -> dict[Any, Any]:
        """The spaces of the agents of ``obs`` this worker has not reported yet."""
        if not isinstance(obs, Mapping):
            return {}  # malformed: the parent's checks name it
        new = [a for a in obs if a not in self._reported]
        return self._spaces(env, new)

    def _spaces(self, env: Any, agents: Sequence[Any]) -> dict[Any, Any]:
        spaces = {
            a: (agent_space(env, a, "observation"), agent_space(env, a, "action")) for a in agents
        }
        self._reported.update(agents)
        return spaces


def _is_multi_agent(made: Any) -> bool:
    return not isinstance(made, gym.Env) or isinstance(made, MultiAgentEnv)


def _adapt(made: Any, multi_agent: bool) -> Any:
    """``made`` as the kind of copy the first one is (a PettingZoo env wrapped)."""
    if not multi_agent:
        if _is_multi_agent(made):
            raise ConfigError(
                f"copies of one env are of different kinds ({type(made).__name__} is not a "
                "gymnasium.Env): every copy must be made the same way"
            )
        return made
    adapted = as_multi_agent(made)
    if adapted is None:
        with contextlib.suppress(Exception):
            made.close()
        raise ConfigError(
            f"the env made a {type(made).__name__}, not a gymnasium.Env: return a "
            "gymnasium.Env, a MultiAgentEnv or a PettingZoo env"
        )
    return adapted


def _first(result: Any, size: int) -> Any:
    """The first item (observations) of a ``size``-tuple, or None when malformed."""
    return result[0] if isinstance(result, tuple) and len(result) == size else None


def _over(result: Any) -> bool:
    """Whether a multi-agent step result ends the episode (``__all__``), as the source reads it."""
    if not (isinstance(result, tuple) and len(result) == 5):
        return False
    terminateds, truncateds = result[2], result[3]
    if not (isinstance(terminateds, Mapping) and isinstance(truncateds, Mapping)):
        return False
    if ALL_AGENTS not in terminateds or ALL_AGENTS not in truncateds:
        return False
    return bool(terminateds[ALL_AGENTS]) or bool(truncateds[ALL_AGENTS])


def _error(exc: Exception) -> dict[str, Any]:
    return {
        "type": "error",
        "reason": f"{type(exc).__name__}: {exc}",
        "traceback": traceback.format_exc(),
    }
