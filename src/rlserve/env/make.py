"""Make a ``gymnasium.Env`` from whatever a user names: an instance, an id, a class or a creator.

The accepted forms follow Gymnasium and RLlib:

* a ``gymnasium.Env`` instance, used as it is (it can only be the one copy);
* a registered id such as ``"CartPole-v1"``: ``gym.make(id, **env_config)``;
* a class or callable taking the ``env_config`` dict (RLlib style: ``SimpleCorridor(config)``);
* a Gymnasium-style class whose first parameter is ``render_mode``: called with
  ``**env_config`` as keywords, as ``gym.make`` would;
* a callable taking no arguments.

The ``env_config`` a creator receives is an :class:`EnvContext`: a plain ``dict`` (so code that
expects a dict works) that also says which copy it is making (``worker_index``,
``vector_index``), as RLlib's ``EnvContext`` does.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym

from rlserve.config.registered_envs import make_registered
from rlserve.errors import ConfigError

__all__ = ["EnvContext", "EnvSpec", "env_creator", "make_env"]

EnvSpec = gym.Env[Any, Any] | str | Callable[..., Any]
"""What names an environment: an instance, a registered id, a class or a creator callable."""

_CONFIG_NAMES = frozenset({"config", "env_config", "env_context", "context", "ctx", "cfg"})


class EnvContext(dict[str, Any]):
    """The ``env_config`` dict handed to an env creator, plus which copy is being made.

    Attributes:
        worker_index: The index of the worker (process) making the env; 0 for the local one.
        vector_index: The index of the copy among the vectorised copies of that worker.
    """

    def __init__(
        self,
        env_config: Mapping[str, Any] | None = None,
        *,
        worker_index: int = 0,
        vector_index: int = 0,
    ) -> None:
        super().__init__(env_config or {})
        self.worker_index = worker_index
        self.vector_index = vector_index

    def copy_with(
        self, *, worker_index: int | None = None, vector_index: int | None = None
    ) -> EnvContext:
        """A copy of this context naming another copy of the env.

        Args:
            worker_index: The new worker index (unchanged if ``None``).
            vector_index: The new vector index (unchanged if ``None``).

        Returns:
            A new :class:`EnvContext` with the same keys.
        """
        return EnvContext(
            self,
            worker_index=self.worker_index if worker_index is None else worker_index,
            vector_index=self.vector_index if vector_index is None else vector_index,
        )

    def __repr__(self) -> str:
        return (
            f"EnvContext({dict.__repr__(self)}, worker_index={self.worker_index}, "
            f"vector_index={self.vector_index})"
        )


def _context(env_config: Mapping[str, Any] | None) -> EnvContext:
    if env_config is None or isinstance(env_config, EnvContext):
        return env_config if env_config is not None else EnvContext()
    if not isinstance(env_config, Mapping):
        raise ConfigError(
            f"env_config must be a dict, got {type(env_config).__name__}: pass the settings "
            "of your env as a dict (it is handed to your env creator)"
        )
    return EnvContext(env_config)


def _make_from_id(env_id: str, config: EnvContext, render_mode: str | None) -> Any:
    kwargs = dict(config)
    if render_mode is not None:
        kwargs["render_mode"] = render_mode
    return make_registered(
        env_id, "env", ", or pass the env class or a creator function instead", **kwargs
    )


def _call_style(fn: Callable[..., Any]) -> tuple[str, bool]:
    """How to call ``fn`` (``"config"``, ``"kwargs"``, ``"none"``); whether it takes render_mode."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        # Builtins and some C extensions have no signature: assume the RLlib convention.
        return "config", False
    params = list(sig.parameters.values())
    takes_render = any(
        p.name == "render_mode" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params
    )
    positional = [
        p
        for p in params
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    if positional:
        first = positional[0]
        if first.name == "render_mode":
            # A Gymnasium-style env class (CartPoleEnv(render_mode=None, ...)): settings are
            # keywords, the way gym.make passes them.
            return "kwargs", True
        if first.default is inspect.Parameter.empty or first.name in _CONFIG_NAMES:
            return "config", takes_render
        # Only optional parameters of other names: keywords are the safer reading.
        return "kwargs", takes_render
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params):
        return "config", takes_render
    if any(
        p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.VAR_KEYWORD) for p in params
    ):
        return "kwargs", takes_render
    return "none", False


def _make_from_callable(fn: Callable[..., Any], config: EnvContext, render_mode: str | None) -> Any:
    style, takes_render = _call_style(fn)
    extra = {"render_mode": render_mode} if render_mode is not None and takes_render else {}
    name = getattr(fn, "__qualname__", repr(fn))
    if style == "none" and config:
        raise ConfigError(
            f"env creator {name} takes no arguments, but an env_config was given: make it "
            "take the config dict as its one argument, or drop env_config"
        )
    if style == "config":
        made = fn(config, **extra)
    elif style == "kwargs":
        made = fn(**config, **extra)
    else:
        made = fn()
    if render_mode is not None and getattr(made, "render_mode", render_mode) != render_mode:
        raise ConfigError(
            f"env creator {name} ignored render_mode={render_mode!r}: give it a render_mode "
            "keyword argument, or set the render mode through env_config"
        )
    return made


def make_any(
    env: EnvSpec, env_config: Mapping[str, Any] | None = None, *, render_mode: str | None = None
) -> Any:
    """Make whatever ``env`` names, without checking that it is a ``gymnasium.Env``.

    :func:`to_source <rlserve.env.to_source>` uses it to convert other kinds of env
    (multi-agent, PettingZoo) too; most callers want :func:`make_env`.

    Args:
        env: An env instance, a registered id, a class or a creator callable.
        env_config: The settings handed to the creator (see :func:`make_env`).
        render_mode: The Gymnasium render mode to ask for.

    Returns:
        The made environment object.

    Raises:
        ConfigError: ``env`` is none of the accepted forms, or names no registered id.
    """
    config = _context(env_config)
    if isinstance(env, gym.Env):
        if render_mode is not None and env.render_mode != render_mode:
            raise ConfigError(
                f"the env instance has render_mode={env.render_mode!r}, not {render_mode!r}: "
                "make it with that render mode, or pass its id or class instead"
            )
        return env
    if isinstance(env, str):
        return _make_from_id(env, config, render_mode)
    if callable(env):
        return _make_from_callable(env, config, render_mode)
    raise ConfigError(
        f"cannot make an env from a {type(env).__name__}: pass a gymnasium.Env instance, a "
        "registered id such as 'CartPole-v1', an env class, or a function returning an env"
    )


def make_env(
    env: EnvSpec, env_config: Mapping[str, Any] | None = None, *, render_mode: str | None = None
) -> gym.Env[Any, Any]:
    """Make one ``gymnasium.Env`` from an instance, a registered id, a class or a creator.

    Args:
        env: A ``gymnasium.Env`` instance (returned as it is), a registered id
            (``gym.make(id, **env_config)``), a class or callable taking the ``env_config``
            dict (RLlib style), a Gymnasium-style class taking keywords, or a callable taking
            no arguments.
        env_config: The env's settings. A plain dict is wrapped in an :class:`EnvContext`
            (``worker_index`` and ``vector_index`` 0).
        render_mode: The Gymnasium render mode to ask for.

    Returns:
        The environment.

    Raises:
        ConfigError: ``env`` cannot be made, or what it makes is not a ``gymnasium.Env``.
    """
    made = make_any(env, env_config, render_mode=render_mode)
    if not isinstance(made, gym.Env):
        raise ConfigError(
            f"{_describe(env)} made a {type(made).__name__}, not a gymnasium.Env: return a "
            "gymnasium.Env (or pass a multi-agent env to rlserve.env.to_source)"
        )
    return made


def env_creator(
    env: EnvSpec,
    env_config: Mapping[str, Any] | None = None,
    *,
    render_mode: str | None = None,
    any_kind: bool = False,
) -> Callable[[], Any]:
    """A function taking no arguments that makes one copy of the env each time it is called.

    Vector sources call it once per copy, with the copy's :class:`EnvContext`.

    Args:
        env: What names the env (see :func:`make_env`); an instance cannot be copied.
        env_config: The settings for this copy.
        render_mode: The Gymnasium render mode to ask for.
        any_kind: Make whatever ``env`` names (:func:`make_any`: a multi-agent or PettingZoo
            env too), not only a ``gymnasium.Env``.

    Returns:
        The creator.

    Raises:
        ConfigError: ``env`` is an instance (pass its id or class), or not a valid form.
    """
    if isinstance(env, gym.Env):
        raise ConfigError(
            "an env instance cannot be copied into several envs or another process: pass its "
            "registered id, its class, or a function that makes it"
        )
    if not isinstance(env, str) and not callable(env):
        make_any(env)  # raises the ConfigError that names the accepted forms
    config = _context(env_config)

    def create() -> Any:
        if any_kind:
            return make_any(env, config, render_mode=render_mode)
        return make_env(env, config, render_mode=render_mode)

    return create


def _describe(env: Any) -> str:
    if isinstance(env, str):
        return f"env {env!r}"
    return f"env creator {getattr(env, '__qualname__', repr(env))}"


def env_label(env: Any) -> str:
    """What messages call ``env``: its registered id, or its class or creator's name."""
    if isinstance(env, str):
        return env
    if isinstance(env, functools.partial):  # partial(gym.make, "Id-v0"): the id
        first = env.args[0] if env.args else None
        return first if isinstance(first, str) else env_label(env.func)
    if isinstance(env, type) or inspect.isfunction(env):
        return str(env.__qualname__)
    spec = getattr(env, "spec", None)
    if spec is not None and getattr(spec, "id", None):
        return str(spec.id)
    return type(getattr(env, "unwrapped", env)).__name__
