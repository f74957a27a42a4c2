"""The callbacks' dispatch: every object told in order, a raising one logged once, not fatal."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from rlserve.errors import CallbackError, ConfigError
from rlserve.run.callbacks import (
    CallbackList,
    Callbacks,
    CallbackThread,
    function_callbacks,
    import_reference,
    instantiate,
)


class Recorder(Callbacks):
    def __init__(self) -> None:
        self.seen: list[tuple[str, Any]] = []

    def on_train_result(self, *, algorithm: Any, result: dict[str, Any], **kwargs: Any) -> None:
        self.seen.append(("result", result["training_iteration"]))


class Broken(Callbacks):
    def on_train_result(self, *, algorithm: Any, result: dict[str, Any], **kwargs: Any) -> None:
        raise RuntimeError("tracking server down")


def test_a_raising_callback_is_logged_once_and_the_others_still_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    recorder = Recorder()
    callbacks = CallbackList([Broken(), recorder])
    with caplog.at_level(logging.ERROR, logger="rlserve.callbacks"):
        for iteration in (1, 2, 3):
            callbacks.fire("on_train_result", algorithm=None, result={"training_iteration": 1})
            recorder.seen[-1] = ("result", iteration)
    assert [s[1] for s in recorder.seen] == [1, 2, 3]
    assert callbacks.failures == {"Broken.on_train_result": 3}
    logged = [r for r in caplog.records if "Broken.on_train_result" in r.getMessage()]
    assert len(logged) == 1
    assert logged[0].exc_info is not None and "tracking server down" in str(logged[0].exc_info[1])


def test_fail_fast_raises_a_callback_error() -> None:
    callbacks = CallbackList([Broken()], fail_fast=True)
    with pytest.raises(CallbackError, match=r"Broken\.on_train_result"):
        callbacks.fire("on_train_result", algorithm=None, result={"training_iteration": 1})


def test_events_a_callback_does_not_override_do_nothing() -> None:
    CallbackList([Callbacks()]).fire(
        "on_checkpoint", algorithm=None, path="p", policy_id="default", version=3, extra=1
    )


def test_the_thread_delivers_in_order_and_drains_on_stop() -> None:
    recorder = Recorder()
    thread = CallbackThread(CallbackList([recorder]))
    for iteration in range(50):
        thread.post("on_train_result", algorithm=None, result={"training_iteration": iteration})
    thread.stop()
    assert [s[1] for s in recorder.seen] == list(range(50))


def test_the_thread_raises_a_fail_fast_error_at_stop() -> None:
    thread = CallbackThread(CallbackList([Broken()], fail_fast=True))
    thread.post("on_train_result", algorithm=None, result={"training_iteration": 1})
    with pytest.raises(CallbackError):
        thread.stop()
    thread.check()  # raised once only


def test_function_callbacks_take_rllib_style_lambdas() -> None:
    got: list[int] = []
    callbacks = function_callbacks(
        on_train_result=lambda result, **kw: got.append(result["training_iteration"])
    )
    CallbackList([callbacks]).fire(
        "on_train_result", algorithm=None, result={"training_iteration": 7}
    )
    assert got == [7]
    with pytest.raises(ConfigError, match="unknown event 'on_step'"):
        function_callbacks(on_step=print)


def test_references_import_a_class_and_bad_ones_name_the_fix() -> None:
    assert import_reference("rlserve.run.callbacks:Callbacks") is Callbacks
    assert type(instantiate("rlserve.run.callbacks:Callbacks")) is Callbacks
    assert instantiate(Recorder).seen == []
    with pytest.raises(ConfigError, match="module:Class"):
        import_reference("rlserve.run.callbacks.Callbacks")
    with pytest.raises(ConfigError, match="PYTHONPATH"):
        import_reference("no_such_module_here:Thing")
    with pytest.raises(ConfigError, match="not a subclass"):
        instantiate("collections:OrderedDict")
