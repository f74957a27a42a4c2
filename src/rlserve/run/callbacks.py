"""Callbacks: user code told what a run does (RLlib's ``RLlibCallback`` events, by their names).

Subclass :class:`Callbacks`, override the events you need, and hand the class to
``AlgorithmConfig.callbacks(MyCallbacks)`` (or ``rlserve serve/train --callbacks
module:MyCallbacks``). Every event is called with keyword arguments only, and takes
``**kwargs`` so that arguments added later do not break it:

* ``on_algorithm_init(algorithm=...)``: the Algorithm is built (and serving, when it serves);
* ``on_train_result(algorithm=..., result=...)``: an iteration ended (``Algorithm.train()``, or
  the periodic report of ``rlserve serve``); ``result`` may be changed in place;
* ``on_episode_end(algorithm=..., episode=...)``: an episode ended; ``episode`` is an
  :class:`~rlserve.experience.episode_records.EpisodeSummary` (return, length, policy id,
  per-policy returns, end reason, ``source``: ``env-<i>``, ``env-runner-<r>/env-<i>`` or the
  hashed client name ``client-<hash>`` / ``session-<n>``);
* ``on_checkpoint(algorithm=..., path=..., policy_id=..., version=...)``: a policy's checkpoint
  file was written;
* ``on_algorithm_stop(algorithm=...)``: the Algorithm stopped (loggers close their runs here).

A callback that raises does not stop training: :class:`CallbackList` logs its first failure of
each event with the traceback (later ones are counted in :attr:`CallbackList.failures`) and goes
on; ``fail_fast=True`` raises :class:`~rlserve.errors.CallbackError` instead.

Events that happen on a server's event loop (a client's episode, a learner process's
checkpoint) reach the callbacks on one background thread, in order
(:class:`CallbackThread`), so a slow callback never holds up serving.
"""

from __future__ import annotations

import importlib
import logging
import queue
import threading
from collections.abc import Callable, Iterable
from typing import Any

from rlserve.errors import CallbackError, ConfigError

logger = logging.getLogger("rlserve.callbacks")

EVENTS = (
    "on_algorithm_init",
    "on_train_result",
    "on_episode_end",
    "on_checkpoint",
    "on_algorithm_stop",
)
"""Every event a :class:`Callbacks` receives."""


class Callbacks:
    """The base class of user callbacks: every event does nothing until overridden.

    ``RLlibCallback`` and ``DefaultCallbacks`` (RLlib's names) are the same class.
    """

    def on_algorithm_init(self, *, algorithm: Any, **kwargs: Any) -> None:
        """The Algorithm was built (a served one listens already)."""

    def on_train_result(self, *, algorithm: Any, result: dict[str, Any], **kwargs: Any) -> None:
        """An iteration ended with ``result`` (may be changed in place to add metrics)."""

    def on_episode_end(self, *, algorithm: Any, episode: Any, **kwargs: Any) -> None:
        """An episode ended; ``episode`` is its :class:`EpisodeSummary`."""

    def on_checkpoint(
        self, *, algorithm: Any, path: str, policy_id: str, version: int, **kwargs: Any
    ) -> None:
        """Policy ``policy_id``'s checkpoint file ``path`` (its weights ``version``) was written."""

    def on_algorithm_stop(self, *, algorithm: Any, **kwargs: Any) -> None:
        """The Algorithm stopped: nothing is called after this."""


RLlibCallback = Callbacks
DefaultCallbacks = Callbacks


def function_callbacks(**functions: Callable[..., Any]) -> Callbacks:
    """Callbacks that call one function per event (``on_train_result=lambda result, **kw: ...``).

    Raises:
        ConfigError: A name is not an event, or a value is not callable.
    """
    instance = Callbacks()
    for name, function in functions.items():
        if name not in EVENTS:
            raise ConfigError(f"callbacks(): unknown event '{name}'; the events are {EVENTS}")
        if not callable(function):
            raise ConfigError(f"callbacks({name}=...): needs a function, got {function!r}")
        setattr(instance, name, function)
    return instance


def instantiate(entry: Any) -> Callbacks:
    """A callbacks object from a class (called without arguments), an instance or a reference.

    A reference is ``module:Class`` (imported as code: nothing is unpickled).

    Raises:
        ConfigError: It cannot be imported, or is not a :class:`Callbacks`.
    """
    if isinstance(entry, str):
        entry = import_reference(entry)
    if isinstance(entry, type):
        if not issubclass(entry, Callbacks):
            raise ConfigError(
                f"callbacks: {entry.__qualname__} is not a subclass of rlserve Callbacks; "
                "derive it from rlserve.algorithm.Callbacks"
            )
        return entry()
    if not isinstance(entry, Callbacks):
        raise ConfigError(
            f"callbacks: {entry!r} is neither a Callbacks subclass nor an instance of one"
        )
    return entry


def import_reference(reference: str) -> Any:
    """The object ``module:qualname`` names (the module is imported).

    Raises:
        ConfigError: The reference is malformed, or the module or name cannot be found.
    """
    module_name, colon, qualname = reference.partition(":")
    if not colon or not module_name or not qualname:
        raise ConfigError(
            f"callbacks '{reference}': name the class as module:Class (e.g. "
            "my_project.tracking:MyCallbacks), importable where rlserve runs"
        )
    try:
        target: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(
            f"callbacks '{reference}' cannot be imported ({exc}); install the package that "
            "defines it, or add its folder to PYTHONPATH"
        ) from exc
    return target


class CallbackList:
    """Calls each event on every callbacks object, in order, keeping training alive.

    Args:
        callbacks: The callbacks objects.
        fail_fast: Raise :class:`CallbackError` on a callback's exception instead of logging it.
    """

    def __init__(self, callbacks: Iterable[Callbacks], fail_fast: bool = False):
        self.callbacks = list(callbacks)
        self.fail_fast = fail_fast
        self.failures: dict[str, int] = {}
        """Exceptions raised so far, by ``<Class>.<event>``."""

    def __bool__(self) -> bool:
        return bool(self.callbacks)

    def fire(self, event: str, **kwargs: Any) -> None:
        """Call ``event`` on every callbacks object with ``kwargs``."""
        for callbacks in self.callbacks:
            try:
                getattr(callbacks, event)(**kwargs)
            except Exception as exc:
                where = f"{type(callbacks).__qualname__}.{event}"
                if self.fail_fast:
                    raise CallbackError(f"the callback {where} raised {exc!r}") from exc
                count = self.failures.get(where, 0) + 1
                self.failures[where] = count
                if count == 1:
                    logger.exception(
                        "rlserve: the callback %s raised; training goes on (later failures of "
                        "it are counted, not logged; pass fail_fast=True to stop instead)",
                        where,
                    )


class CallbackThread:
    """Delivers events to a :class:`CallbackList` on one background thread, in order.

    For events raised on a server's event loop, which must not wait on user code. With
    ``fail_fast``, the first :class:`CallbackError` is kept in :attr:`error` and raised (once)
    by the next :meth:`check` or :meth:`stop`; the events after it are dropped.
    """

    def __init__(self, callbacks: CallbackList):
        self._callbacks = callbacks
        self._queue: queue.Queue[tuple[str, dict[str, Any]] | None] = queue.Queue()
        self.error: CallbackError | None = None
        self._thread = threading.Thread(target=self._run, name="rlserve-callbacks", daemon=True)
        self._thread.start()

    def post(self, event: str, **kwargs: Any) -> None:
        """Queue ``event`` for delivery (returns at once, never raises)."""
        self._queue.put((event, kwargs))

    def _run(self) -> None:
        failed = False
        while (item := self._queue.get()) is not None:
            if failed:
                continue  # a fail-fast run stops telling its callbacks at the first error
            event, kwargs = item
            try:
                self._callbacks.fire(event, **kwargs)
            except CallbackError as exc:
                self.error, failed = exc, True

    def stop(self, timeout: float = 30.0) -> None:
        """Deliver what is queued, then end the thread (waiting at most ``timeout`` seconds).

        Raises:
            CallbackError: With ``fail_fast``, a callback raised.
        """
        self._queue.put(None)
        self._thread.join(timeout)
        self.check()

    def check(self) -> None:
        """Raise (once) the :class:`CallbackError` a fail-fast callback raised, if any.

        Raises:
            CallbackError: A callback raised (``fail_fast``).
        """
        if self.error is not None:
            error, self.error = self.error, None
            raise error
