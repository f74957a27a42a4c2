"""``to_source``: turn whatever a user hands the trainer into an :class:`EnvSource`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym

from rlserve.env.base import EnvSource
from rlserve.env.make import EnvContext, EnvSpec, make_any
from rlserve.env.subprocess import ProcessVectorSource
from rlserve.env.vector import InProcessVectorSource
from rlserve.errors import ConfigError

__all__ = ["to_source"]


def to_source(
    env: EnvSource | EnvSpec,
    env_config: Mapping[str, Any] | None = None,
    *,
    num_envs: int = 1,
    remote: bool = False,
    envs_per_process: int = 1,
    seed: int | None = None,
    **kw: Any,
) -> EnvSource:
    """Convert an env, an env id or an env creator into the :class:`EnvSource` the trainer drives.

    Args:
        env: An :class:`EnvSource` (returned as it is), a ``gymnasium.Env`` instance (one copy,
            in this process), a registered id, an env class or a creator callable (see
            :func:`rlserve.env.make_env`).
        env_config: The settings handed to each copy's creator.
        num_envs: How many copies to step together.
        remote: Run the copies in sub-processes (:class:`ProcessVectorSource`) rather than in
            this process (:class:`InProcessVectorSource`).
        envs_per_process: With ``remote``, how many copies each sub-process holds.
        seed: The seed of the first reset (copy ``i`` gets ``seed + i``).
        **kw: Passed on to the source (``render_mode``; with ``remote``: ``step_timeout``,
            ``reset_timeout``, ``max_restarts``, ``mp_context``).

    Returns:
        The source.

    Raises:
        ConfigError: ``env`` cannot be converted, or the options do not fit it.
    """
    if isinstance(env, EnvSource):
        return env
    if remote:
        if isinstance(env, gym.Env):
            raise ConfigError(
                "an env instance cannot be moved into sub-processes: pass its registered id, "
                "its class, or a function that makes it (or remote=False)"
            )
        # Multi-agent envs in sub-processes are not wired yet: the workers refuse anything but
        # a gymnasium.Env with a ConfigError.
        return ProcessVectorSource(
            env, env_config, num_envs=num_envs, envs_per_process=envs_per_process, seed=seed, **kw
        )
    render_mode = kw.pop("render_mode", None)
    if kw:
        raise ConfigError(
            f"to_source got options {sorted(kw)} that only sub-process envs take: pass "
            "remote=True, or drop them"
        )
    made = make_any(env, EnvContext(env_config), render_mode=render_mode)
    if not isinstance(made, gym.Env):
        # HOOK (multi-agent): convert rlserve.env.multi_agent.MultiAgentEnv, PettingZoo envs
        # and ExternalEnv here, with the code of rlserve/env/multi_agent.py, pettingzoo.py and
        # external.py. Until then they are refused.
        if hasattr(made, "close"):
            made.close()
        raise ConfigError(
            f"to_source cannot host a {type(made).__name__} yet: pass a gymnasium.Env, its "
            "registered id, its class or a function that makes it"
        )
    return InProcessVectorSource(
        env, env_config, num_envs=num_envs, seed=seed, render_mode=render_mode, first_env=made
    )
