"""``to_source``: turn whatever a user hands the trainer into an :class:`EnvSource`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym

from rlserve.env.base import EnvSource
from rlserve.env.copy_workers import CopyWorkers
from rlserve.env.external_episodes import ExternalBase
from rlserve.env.external_source import ExternalEnvSource
from rlserve.env.make import EnvContext, EnvSpec, make_any
from rlserve.env.multi_agent import MultiAgentEnv, MultiAgentSource
from rlserve.env.pettingzoo import as_multi_agent
from rlserve.env.subprocess import ProcessVectorSource
from rlserve.env.subprocess_multi import ProcessMultiAgentSource
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
    worker_index: int = 0,
    **kw: Any,
) -> EnvSource:
    """Convert an env, an env id or an env creator into the :class:`EnvSource` the trainer drives.

    Args:
        env: An :class:`EnvSource` (returned as it is), a ``gymnasium.Env`` instance (one copy,
            in this process), a registered id, an env class or a creator callable (see
            :func:`rlserve.env.make_env`).
        env_config: The settings handed to each copy's creator.
        num_envs: How many copies to step together.
        remote: Run the copies in sub-processes (:class:`ProcessVectorSource`, or
            :class:`~rlserve.env.subprocess_multi.ProcessMultiAgentSource` for a multi-agent or
            PettingZoo env) rather than in this process.
        envs_per_process: With ``remote``, how many copies each sub-process holds.
        seed: The seed of the first reset (copy ``i`` gets ``seed + i``).
        worker_index: The ``worker_index`` of the :class:`EnvContext` in-process copies are
            made with (an env-runner process's number; sub-process copies get their
            sub-process's number instead).
        **kw: Passed on to the source (``render_mode``; with ``remote``: ``step_timeout``,
            ``reset_timeout``, ``max_restarts``, ``mp_context``, ``supervise``).

    Returns:
        The source.

    Raises:
        ConfigError: ``env`` cannot be converted, or the options do not fit it.
    """
    if isinstance(env, EnvSource):
        return env
    if isinstance(env, ExternalBase):
        return ExternalEnvSource(env)
    if isinstance(env, type) and issubclass(env, ExternalBase):
        raise ConfigError(
            f"{env.__name__} is an ExternalEnv class: pass an instance (it is constructed with "
            "its spaces, and its run() loop is yours)"
        )
    if remote:
        if isinstance(env, gym.Env):
            raise ConfigError(
                "an env instance cannot be moved into sub-processes: pass its registered id, "
                "its class, or a function that makes it (or remote=False)"
            )
        return _remote_source(env, env_config, num_envs, envs_per_process, seed, kw)
    render_mode = kw.pop("render_mode", None)
    if kw:
        raise ConfigError(
            f"to_source got options {sorted(kw)} that only sub-process envs take: pass "
            "remote=True, or drop them"
        )
    made = make_any(env, EnvContext(env_config, worker_index=worker_index), render_mode=render_mode)
    if isinstance(made, ExternalBase):
        return ExternalEnvSource(made)
    if not isinstance(made, gym.Env) or isinstance(made, MultiAgentEnv):
        first = as_multi_agent(made)
        if first is None:
            if hasattr(made, "close"):
                made.close()
            raise ConfigError(
                f"cannot host a {type(made).__name__}: pass a gymnasium.Env, a MultiAgentEnv, "
                "a PettingZoo env, an ExternalEnv, an EnvSource, or a registered id, class or "
                "function that makes one"
            )
        copies = [first]
        if num_envs > 1 and not (isinstance(env, str) or callable(env)):
            raise ConfigError(
                "one env instance cannot be copied: pass its class or a function that makes "
                "it for num_envs > 1"
            )
        for index in range(1, num_envs):
            again = make_any(
                env, EnvContext(env_config, worker_index=worker_index, vector_index=index)
            )
            adapted = as_multi_agent(again)
            if adapted is None:
                raise ConfigError(f"copy {index} of the env is not a multi-agent env")
            copies.append(adapted)
        return MultiAgentSource(copies, seed=seed)
    return InProcessVectorSource(
        env,
        env_config,
        num_envs=num_envs,
        seed=seed,
        render_mode=render_mode,
        worker_index=worker_index,
        first_env=made,
    )


_WORKER_OPTIONS = ("render_mode", "reset_timeout", "max_restarts", "mp_context", "supervise")


def _remote_source(
    env: EnvSpec,
    env_config: Mapping[str, Any] | None,
    num_envs: int,
    envs_per_process: int,
    seed: int | None,
    kw: dict[str, Any],
) -> EnvSource:
    """Start the copies' workers, then host them by the kind of env they made."""
    step_timeout = kw.pop("step_timeout", 60.0)
    reset_timeout = kw.get("reset_timeout", 60.0)
    unknown = sorted(set(kw) - set(_WORKER_OPTIONS))
    if unknown:
        raise ConfigError(f"to_source got unknown options {unknown}: drop them")
    if step_timeout <= 0 or reset_timeout <= 0:
        raise ConfigError("step_timeout and reset_timeout must be positive seconds")
    workers = CopyWorkers(
        env, env_config, num_envs=num_envs, envs_per_process=envs_per_process, **kw
    )
    source = ProcessMultiAgentSource if workers.multi_agent else ProcessVectorSource
    return source(workers, seed=seed, step_timeout=step_timeout, reset_timeout=reset_timeout)
