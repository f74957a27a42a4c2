"""What one worker of remote sub-environments does: make its copies, answer reset and step.

The body every backend of :class:`~rlserve.env.subprocess.ProcessVectorSource` shares: a
sub-process drives it over its pipe (:func:`~rlserve.env.subprocess.run_copies`), a Ray actor
through method calls (:mod:`rlserve.cluster.envs`). Messages and answers are the maps the
module doc of :mod:`rlserve.env.subprocess` lists; :meth:`EnvCopies.handle` never raises
(whatever goes wrong is its ``error`` answer).
"""

from __future__ import annotations

import contextlib
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rlserve.env.stacking import ObsStacker
from rlserve.env.vector import step_copies
from rlserve.errors import ConfigError

__all__ = ["EnvCopies"]


@dataclass
class _Stamp:
    value: float = 0.0


class EnvCopies:
    """Copies of one env, made from ``creators``, stepped one after the other.

    Attributes:
        greeting: The first answer: ``ok`` with the copies' spaces, ``config_error`` (the env
            cannot be made: not worth a restart) or ``error``.
        done: Whether the worker should end (it answered ``error``, or was told to close).
    """

    def __init__(self, creators: Sequence[Callable[[], Any]]) -> None:
        self._envs: list[Any] = []
        self._stamp = _Stamp(time.monotonic())
        self.done = False
        try:
            self._envs = [create() for create in creators]
        except ConfigError as e:  # not a gymnasium.Env, bad env_config: no point restarting
            self.greeting: dict[str, Any] = {"type": "config_error", "reason": str(e)}
            self.done = True
            return
        except Exception as e:
            self.greeting = _error(e)
            self.done = True
            return
        first = self._envs[0]
        self._stacker = ObsStacker(first.observation_space)
        self.greeting = {"type": "ok", "result": (first.observation_space, first.action_space)}

    @property
    def stamp(self) -> Any:
        """:func:`time.monotonic` of its last answer, in ``value``."""
        return self._stamp

    def handle(self, message: dict[str, Any]) -> dict[str, Any]:
        """The answer to ``reset`` or ``step``: ``ok`` with the result, or ``error``."""
        try:
            kind = message["type"]
            if kind == "step":
                result: Any = step_copies(self._envs, message["actions"], self._stacker)
            elif kind == "reset":
                seeds = message["seeds"]
                result = [env.reset(seed=s) for env, s in zip(self._envs, seeds, strict=True)]
            else:
                self.done = True
                return {"type": "closed"}
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


def _error(exc: Exception) -> dict[str, Any]:
    return {
        "type": "error",
        "reason": f"{type(exc).__name__}: {exc}",
        "traceback": traceback.format_exc(),
    }
