"""Builder methods whose wrong arguments are a :class:`~rlserve.errors.ConfigError` naming the fix.

Python's own ``TypeError: env_runners() got an unexpected keyword argument
'num_rollout_workers'`` names neither the settings the method takes nor the one meant. An RLlib
script moved to rlserve hits exactly this for the names RLlib renamed or rlserve lacks, so each
builder method of :class:`~rlserve.algorithm.config.AlgorithmConfig` is wrapped with
:func:`builder`: the arguments are bound to the signature first, and a mismatch is told with
the method's settings and the closest one.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import re
from collections.abc import Callable
from typing import Any, TypeVar, cast

from rlserve.errors import ConfigError

_Method = TypeVar("_Method", bound=Callable[..., Any])

RLLIB_NAMES = {
    "num_rollout_workers": "num_env_runners",
    "num_workers": "num_env_runners",
    "num_envs_per_worker": "num_envs_per_env_runner",
    "num_gpus_per_worker": (
        "nothing: its env runners act with a numpy copy of the policy on CPU (GPUs are for "
        "learners: learners(num_gpus_per_learner=...))"
    ),
    "num_learner_workers": "learners(num_learners=...)",
}
"""RLlib's older setting names, with what rlserve calls them."""


def builder(method: _Method) -> _Method:
    """Wrap a config builder method: wrong arguments become a ConfigError naming its settings."""
    signature = inspect.signature(method)
    settings = [
        name
        for name, p in signature.parameters.items()
        if name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    if any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values()):
        settings.append("settings by name")

    @functools.wraps(method)
    def checked(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            signature.bind(self, *args, **kwargs)
        except TypeError as exc:
            raise ConfigError(_explained(method.__name__, str(exc), settings)) from None
        return method(self, *args, **kwargs)

    return cast(_Method, checked)


def _explained(name: str, problem: str, settings: list[str]) -> str:
    unknown = re.search(r"unexpected keyword argument '(\w+)'", problem)
    hint = ""
    if unknown:
        key = unknown[1]
        if key in RLLIB_NAMES:
            hint = f"; in rlserve it is {RLLIB_NAMES[key]}"
        else:
            close = difflib.get_close_matches(key, settings, n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
        problem = f"no setting '{key}'{hint}"
    elif "positional" in problem:
        example = next((s for s in settings if s != "settings by name"), "lr")
        problem = f"pass its settings by name, e.g. {name}({example}=...)"
    return f"{name}(): {problem} (it takes: {', '.join(settings) or 'nothing'})"
