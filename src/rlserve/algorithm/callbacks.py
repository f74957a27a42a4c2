"""``AlgorithmConfig.callbacks(...)``: RLlib's entry point for callbacks, and their names.

The callbacks themselves (:class:`Callbacks`, the events, how a raising callback is handled)
are :mod:`rlserve.run.callbacks`'; this module adds the config method (a mixin of
:class:`~rlserve.algorithm.config.AlgorithmConfig`) and builds an Algorithm's
:class:`CallbackList` from its config.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlserve.algorithm.builder_arguments import builder
from rlserve.errors import ConfigError
from rlserve.run.callbacks import (
    EVENTS,
    CallbackList,
    Callbacks,
    CallbackThread,
    DefaultCallbacks,
    RLlibCallback,
    function_callbacks,
    import_reference,
    instantiate,
)

__all__ = [
    "EVENTS",
    "CallbackList",
    "CallbackThread",
    "Callbacks",
    "CallbacksConfig",
    "DefaultCallbacks",
    "RLlibCallback",
    "callback_list",
]


class CallbacksConfig:
    """The callbacks part of :class:`~rlserve.algorithm.config.AlgorithmConfig`."""

    callbacks_class: list[Any]
    """The callbacks: classes, instances, ``module:Class`` references (see :meth:`callbacks`)."""
    callbacks_fail_fast: bool

    @builder
    def callbacks(
        self,
        callbacks_class: Any = None,
        *,
        fail_fast: bool | None = None,
        **functions: Callable[..., Any],
    ) -> Any:
        """The callbacks told of the run's events (RLlib's ``config.callbacks(MyCallbacks)``).

        Args:
            callbacks_class: A :class:`Callbacks` subclass (made with no arguments), an
                instance (e.g. a configured ``MLflowLoggerCallback(...)``), a ``module:Class``
                reference, or a list of those; replaces the ones given before.
            fail_fast: Raise :class:`~rlserve.errors.CallbackError` when a callback raises
                (default: log it once with its traceback, and train on).
            functions: One function per event, RLlib's lambdas:
                ``on_train_result=lambda algorithm, result, **kw: ...``; added to the classes.

        Raises:
            ConfigError: Something is not a callbacks class, instance or event function.
        """
        if callbacks_class is not None:
            entries = callbacks_class if isinstance(callbacks_class, list) else [callbacks_class]
            for entry in entries:
                _check(import_reference(entry) if isinstance(entry, str) else entry)
            self.callbacks_class = list(entries)
        if functions:
            self.callbacks_class = [*self.callbacks_class, function_callbacks(**functions)]
        if fail_fast is not None:
            self.callbacks_fail_fast = bool(fail_fast)
        return self


def _check(entry: Any) -> None:
    if isinstance(entry, type) and issubclass(entry, Callbacks):
        return
    if isinstance(entry, Callbacks):
        return
    raise ConfigError(
        f"callbacks({entry!r}): give a subclass of rlserve.algorithm.Callbacks (or an "
        "instance of one, or 'module:Class'); RLlib's callback classes need their imports "
        "changed to rlserve.algorithm.callbacks"
    )


def callback_list(config: CallbacksConfig, reference: str | None = None) -> CallbackList:
    """The callbacks of ``config`` made (classes instantiated), and ``reference``'s class.

    Raises:
        ConfigError: A reference cannot be imported.
    """
    entries = [*config.callbacks_class, *([reference] if reference else [])]
    return CallbackList([instantiate(e) for e in entries], config.callbacks_fail_fast)
