"""The spaces of an environment named on the command line (``--spaces-from``).

In the env package, not with the spaces file (:mod:`rlserve.config.spaces_file`), because it
makes the env: ``rlserve train --env``'s forms (:func:`~rlserve.env.locate.locate_env`).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from rlserve.config.registered_envs import make_registered
from rlserve.config.spaces_file import EXAMPLE
from rlserve.env.locate import locate_env
from rlserve.env.make import make_env
from rlserve.errors import ConfigError
from rlserve.protocol.spaces import describe, from_description


def spaces_of_env(
    env: str, label: str = "--spaces-from", instead: str = "--spaces-file FILE.json"
) -> tuple[gym.Space[Any], gym.Space[Any]]:
    """The observation and action spaces of the environment ``env`` names.

    ``env`` takes the forms of ``rlserve train --env`` (:func:`~rlserve.env.locate.locate_env`):
    a registered Gymnasium id, or ``module:Name`` / ``path/to/file.py:Name`` of an env class or
    creator, made with an empty ``env_config``. The spaces are rebuilt from their descriptions,
    so the server flattens observations exactly as a client that rebuilt them from the welcome
    does (e.g. the key order of a Dict).

    Args:
        env: What names the environment.
        label: Where it was given, which starts each error (``--spaces-from``).
        instead: The other way of giving the spaces, which each error names.

    Raises:
        ConfigError: The env cannot be found or made (see :func:`make_registered` and
            :func:`~rlserve.env.locate.locate_env`); the message starts with ``label`` and
            ``env`` and names ``instead``.
    """
    other_ways = ", or name the env class as module:Name or path/to/file.py:Name"
    try:
        located = locate_env(env)
        if isinstance(located, str):
            made = make_registered(located, label, other_ways)
        else:
            made = make_env(located)
    except ConfigError as exc:
        message = str(exc) if str(exc).startswith(label) else f"{label} {env}: {exc}"
        raise ConfigError(
            f"{message}; or describe the spaces in a JSON file and pass {instead} (e.g. {EXAMPLE})"
        ) from None
    except Exception as exc:  # the user's env constructor
        raise ConfigError(
            f"{label} {env}: making the env raised {type(exc).__name__}: {exc}; fix the env, or "
            f"describe its spaces in a JSON file and pass {instead} (e.g. {EXAMPLE})"
        ) from None
    try:
        return (
            from_description(describe(made.observation_space)),
            from_description(describe(made.action_space)),
        )
    finally:
        made.close()
