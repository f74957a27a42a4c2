"""``gym.make`` of an id a user typed, with each way the id can fail told as one line.

Used by ``--spaces-from`` (the serving process, which never steps the env) and by hosted
training's ``env="SomeEnv-v1"``: an unknown id, a missing optional dependency (Box2D,
MuJoCo), a ``module:Class`` id whose module does not import, and settings the env's
constructor does not take become :class:`~rlserve.errors.ConfigError` naming the fix,
not tracebacks.
"""

from __future__ import annotations

import difflib
from typing import Any

import gymnasium as gym

from rlserve.errors import ConfigError


def make_registered(env_id: str, label: str, other_ways: str = "", **kwargs: Any) -> Any:
    """``gym.make(env_id, **kwargs)``; ``label`` starts each error (e.g. ``--spaces-from``).

    ``other_ways`` ends the advice for an unregistered id (e.g. ``, or pass the env class``).

    Raises:
        ConfigError: The id is not registered (with close matches), needs a package that is
            not installed, names a module that does not import, or the env's constructor does
            not take a keyword of ``kwargs``.
    """
    try:
        return gym.make(env_id, **kwargs)
    except gym.error.UnregisteredEnv as exc:
        close = difflib.get_close_matches(env_id, list(gym.registry), n=5, cutoff=0.6)
        hint = f" Registered ids close to it: {', '.join(close)}." if close else ""
        raise ConfigError(
            f"{label} {env_id}: not a registered Gymnasium id ({exc}).{hint} Register it with "
            f"gymnasium.register(...), or import the package that registers it first{other_ways}"
        ) from exc
    except gym.error.DependencyNotInstalled as exc:
        raise ConfigError(
            f"{label} {env_id}: the env needs a package that is not installed ({exc})"
        ) from exc
    except gym.error.Error as exc:
        raise ConfigError(f"{label} {env_id}: {exc}") from exc
    except ImportError as exc:
        if ":" not in env_id:
            raise
        module = env_id.split(":", 1)[0]
        raise ConfigError(
            f"{label} {env_id}: the module {module} does not import ({exc}); install it, or "
            "check the module:Env id (the part before ':' is imported)"
        ) from exc
    except TypeError as exc:
        if not kwargs or "keyword argument" not in str(exc):
            raise
        raise ConfigError(
            f"{label} {env_id}: the env does not take the settings given "
            f"({', '.join(sorted(kwargs))}): {exc}; pass only keywords its constructor takes"
        ) from exc
