"""An AlgorithmConfig as plain JSON in a checkpoint folder, and back.

Nothing is pickled: a checkpoint may travel, and loading one must not run code it carries. The
environment is saved as what can name it again: a registered id, or ``module:qualname`` of an
importable class or function (imported again on load, like any code the user installs). An
environment that has neither (an instance, a lambda) is saved as ``null``, and
:meth:`Algorithm.from_checkpoint` then asks for the config. A saved name of a function is taken
only when the caller trusts the folder (:func:`resolve_saved`).
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym

from rlserve.algorithm.config import AlgorithmConfig, config_for
from rlserve.errors import ConfigError
from rlserve.learners.dqn_config import SOFT_TAU

CONFIG_FILE = "algorithm_config.json"

UNSAVED = "<unsaved>"
"""Stands for a ``policy_mapping_fn`` that has no importable name (a lambda, a local one)."""

_PLAIN = (
    "env_config",
    "num_env_runners",
    "num_envs_per_env_runner",
    "remote_worker_envs",
    "envs_per_process",
    "step_timeout_s",
    "env_runner_backend",
    "num_cpus_per_env_runner",
    "custom_resources_per_env_runner",
    "num_cpus_per_remote_env",
    "custom_resources_per_remote_env",
    "num_learners",
    "num_cpus_per_learner",
    "num_gpus_per_learner",
    "custom_resources_per_learner",
    "rollout_fragment_length",
    "min_env_steps_per_iteration",
    "training_settings",
    "seed",
    "evaluation_duration",
    "evaluation_interval",
    "policies",
    "policy_algorithms",
    "algorithm_settings",
    "policy_mapping",
)


SAVED_FORMAT = 2
"""Format of a saved config: 2 since DQN's ``tau`` became unset by default (a hard target copy
with a ``target_update_interval`` above 1); format 1 meant 0.0075 whatever the interval."""


def _keep_dqn_soft_copies(config: AlgorithmConfig) -> None:
    """Give a format-1 config's DQN settings the ``tau`` they trained with (0.0075).

    So a restored run goes on as it was, whatever its ``target_update_interval``.
    """
    if config.algo_name == "dqn":
        config.training_settings.setdefault("tau", SOFT_TAU)
    if config.algo_name != "dqn" and "dqn" in config.policy_algorithms.values():
        config.algorithm_settings.setdefault("dqn", {}).setdefault("tau", SOFT_TAU)


def env_reference(env: Any) -> str | None:
    """A string that names ``env`` again after a restart, or None."""
    if isinstance(env, str):
        return env
    module = getattr(env, "__module__", None)
    name = getattr(env, "__qualname__", None)
    if not module or not name or "<" in name:
        return None
    return f"{module}:{name}"


def resolve_env(reference: str) -> Any:
    """The env a reference of :func:`env_reference` names."""
    if ":" not in reference:
        return reference
    module_name, _, name = reference.partition(":")
    module = sys.modules.get(module_name) or importlib.import_module(module_name)
    target: Any = module
    for part in name.split("."):
        target = getattr(target, part)
    return target


TRUST_HINT = (
    "if you made it, pass trust_code=True to Algorithm.from_checkpoint (rlserve train or "
    "serve: --trust-code)"
)


def _is_env_class(target: Any) -> bool:
    """Whether ``target`` is a class of environment (what rlserve hosts), by its bases."""
    if not isinstance(target, type):
        return False
    from rlserve.env.base import EnvSource
    from rlserve.env.external_episodes import ExternalBase

    if issubclass(target, (gym.Env, gym.vector.VectorEnv, EnvSource, ExternalBase)):
        return True
    # PettingZoo (an optional extra) is recognised by its own base classes' module.
    return any(base.__module__.partition(".")[0] == "pettingzoo" for base in target.__mro__)


def resolve_saved(reference: str, what: str, where: str, trust_code: bool = False) -> Any:
    """What a ``reference`` read from a saved file names, if it is safe to call.

    A checkpoint or run folder may come from anyone, and the object it names is called with
    values from the same file (``env_config``) or from the wire (agent ids): naming
    ``subprocess:Popen`` or ``os:system`` would run a command. So, as ``torch.load`` with
    ``weights_only=True`` does for tensors, only what is safe to call is taken on the file's
    word: a registered id, or an environment class (gymnasium, PettingZoo or rlserve env). A
    function (an env creator, a ``policy_mapping_fn``) is taken only with ``trust_code``. The
    module is imported either way: installed code, as gymnasium imports the module of a
    ``module:Id`` id.

    Args:
        reference: ``module:qualname`` or a registered id.
        what: What it stands for in messages: ``"environment"``, ``"policy_mapping_fn"``.
        where: The folder or file it was read from.
        trust_code: The caller vouches for the file: take any importable object.

    Raises:
        ImportError, AttributeError: The module or the name within it is not there.
        ConfigError: A function (or anything but an env class) without ``trust_code``.
    """
    target = resolve_env(reference)
    if trust_code or isinstance(target, str):
        return target
    if what == "environment" and _is_env_class(target):
        return target
    kind = "a class that is no environment" if isinstance(target, type) else "a function"
    raise ConfigError(
        f"{where} names the {what} {reference}, {kind}; rlserve calls code that a saved file "
        "names only if you trust the file (a checkpoint or run folder may come from anyone, "
        f"and the file chooses the arguments): {TRUST_HINT}, or pass config=... with your own "
        f"{what}"
    )


def save_config(config: AlgorithmConfig, folder: Path) -> None:
    """Write ``config`` as JSON into ``folder``."""
    plain: dict[str, Any] = {name: getattr(config, name) for name in _PLAIN}
    plain["training_settings"] = {
        k: list(v) if isinstance(v, tuple) else v for k, v in config.training_settings.items()
    }
    plain["algorithm_settings"] = {
        name: {k: list(v) if isinstance(v, tuple) else v for k, v in values.items()}
        for name, values in config.algorithm_settings.items()
    }
    plain["algo"] = config.algo_name
    plain["format"] = SAVED_FORMAT
    if config.policies_to_train is not None:
        plain["policies_to_train"] = sorted(config.policies_to_train)
    plain["env"] = env_reference(config.env)
    if config.policy_mapping_fn is not None:
        # A module-level function is saved by name; a lambda or a local one cannot be, and
        # loading then says so rather than map every agent to no policy.
        plain["policy_mapping_fn"] = env_reference(config.policy_mapping_fn) or UNSAVED
    try:
        text = json.dumps(plain, indent=2)
    except TypeError as exc:
        raise ConfigError(f"env_config must hold plain JSON values to be saved: {exc}") from exc
    (folder / CONFIG_FILE).write_text(text)


def load_config(folder: Path, trust_code: bool = False) -> AlgorithmConfig:
    """The config :func:`save_config` wrote into ``folder``.

    ``trust_code`` takes a function the file names (:func:`resolve_saved`).
    """
    try:
        plain = json.loads((folder / CONFIG_FILE).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{folder} has no readable {CONFIG_FILE}: {exc}") from exc
    if plain.get("env") is None:
        raise ConfigError(
            f"the environment of {folder} cannot be found again (it was an instance or a "
            "lambda); pass config=... to Algorithm.from_checkpoint"
        )
    config = config_for(plain.get("algo"))
    try:
        config.env = resolve_saved(plain["env"], "environment", str(folder), trust_code)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(
            f"the environment {plain['env']} of {folder} cannot be imported ({exc}); pass "
            "config=... to Algorithm.from_checkpoint"
        ) from exc
    for name in _PLAIN:
        if name in plain:
            setattr(config, name, plain[name])
    config.policy_mapping = [tuple(rule) for rule in config.policy_mapping]  # type: ignore[misc]
    if plain.get("format", 1) < 2:
        _keep_dqn_soft_copies(config)
    if plain.get("policies_to_train") is not None:
        config.policies_to_train = frozenset(plain["policies_to_train"])
    mapping_fn = plain.get("policy_mapping_fn")
    if mapping_fn == UNSAVED:
        raise ConfigError(
            f"the policy_mapping_fn of {folder} cannot be found again (it was a lambda or a "
            "local function); pass config=... to Algorithm.from_checkpoint, or define the "
            "function at module level"
        )
    if mapping_fn is not None:
        try:
            config.policy_mapping_fn = resolve_saved(
                mapping_fn, "policy_mapping_fn", str(folder), trust_code
            )
        except (ImportError, AttributeError) as exc:
            raise ConfigError(
                f"the policy_mapping_fn {mapping_fn} of {folder} cannot be imported ({exc}); "
                "pass config=... to Algorithm.from_checkpoint"
            ) from exc
    return config
