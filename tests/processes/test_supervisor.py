"""The process supervisor with real forked children: answers, failures, restarts, giving up."""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Iterator, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rlserve.errors import ConfigError
from rlserve.processes.child import enter_child
from rlserve.processes.restarts import Failure
from rlserve.processes.supervisor import KEEP_WAITING, ProcessSupervisor, SupervisedGroup
from rlserve.processes.wire import CODEC, PICKLE, Wire

LOGGER = logging.getLogger("rlserve.tests.supervisor")


def _child(conn: Connection, greeting: str, inherited: Sequence[Connection]) -> None:
    """Greets, then does what each ``(command, value)`` says."""
    enter_child(inherited)
    conn.send(("ok", greeting))
    while True:
        try:
            command, value = conn.recv()
        except EOFError:
            return
        if command == "echo":
            conn.send(("ok", value))
        elif command == "raise":
            try:
                raise ValueError(value)
            except ValueError as exc:
                conn.send(("error", f"ValueError: {exc}", "Traceback: here"))
        elif command == "exit":
            os._exit(value)
        elif command == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif command == "hang":
            time.sleep(3600)
        elif command == "stale":
            conn.send(("stale", value))
            conn.send(("ok", value))
        elif command == "config":
            conn.send(("config_error", value))
        else:
            return


def _judge(slot: int, message: Any) -> Any:
    if message[0] == "ok":
        return message[1]
    if message[0] == "stale":
        return KEEP_WAITING
    if message[0] == "config_error":
        raise ConfigError(f"in worker {slot}: {message[1]}")
    return Failure(f"child raised {message[1]}", message[2])


def _group(size: int = 2, wire: Wire = PICKLE, **kwargs: Any) -> ProcessSupervisor:
    return ProcessSupervisor(
        [f"rlserve-test-{slot}" for slot in range(size)],
        [f"worker {slot}" for slot in range(size)],
        _child,
        what="worker",
        wire=wire,
        close_message=("close", None),
        logger=LOGGER,
        restart_note="the worker",
        success="echo",
        **kwargs,
    )


@pytest.fixture
def group() -> Iterator[ProcessSupervisor]:
    supervisor = _group(max_restarts=2)
    try:
        for slot in range(supervisor.size):
            supervisor.start(slot, f"hello {slot}")
        assert supervisor.gather(range(2), 30.0, _judge) == {0: "hello 0", 1: "hello 1"}
        yield supervisor
    finally:
        supervisor.stop()


def _bring_up(group: ProcessSupervisor, slot: int) -> Any:
    group.start(slot, "again")
    return group.gather([slot], 30.0, _judge)[slot]


def test_it_is_a_supervised_group() -> None:
    assert isinstance(_group(), SupervisedGroup)


@pytest.mark.timeout(30)
def test_answers_come_back_by_slot(group: ProcessSupervisor) -> None:
    rng = np.random.default_rng(7)
    values = [rng.normal(size=3) for _ in range(group.size)]
    for slot, value in enumerate(values):
        assert group.send(slot, ("echo", value)) is None
    answers = group.gather(range(group.size), 30.0, _judge)
    for slot, value in enumerate(values):
        np.testing.assert_array_equal(answers[slot], value)
    assert group.num_alive == 2 and all(group.pids)
    assert group.restarts == 0 and group.failures == 0


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("command", "value", "reason"),
    [
        ("raise", "boom", "child raised ValueError: boom"),
        ("exit", 3, "worker exited with code 3"),
        ("kill", None, "worker was killed by SIGKILL"),
        ("hang", None, "worker did not answer within 0.5 s and was killed"),
    ],
)
def test_a_failed_child_is_restarted_and_the_other_goes_on(
    group: ProcessSupervisor,
    command: str,
    value: Any,
    reason: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    victim = group.pids[1]
    group.send(0, ("echo", "fine"))
    group.send(1, (command, value))
    answers = group.gather(range(2), 0.5 if command == "hang" else 30.0, _judge)
    assert answers[0] == "fine"
    assert isinstance(answers[1], Failure) and answers[1].reason == reason
    with caplog.at_level(logging.WARNING, logger=LOGGER.name):
        group.fail(1, answers[1], "echo")
    assert f"worker 1 failed during echo: {reason}; restarting the worker" in caplog.text
    assert group.pids[1] is None
    assert group.restart(1, lambda: _bring_up(group, 1)) == "again"
    assert group.pids[1] not in (None, victim)
    group.send(1, ("echo", "back"))
    assert group.gather([1], 30.0, _judge) == {1: "back"}
    assert group.restarts == 1 and group.failures == 1


@pytest.mark.timeout(30)
def test_a_child_that_keeps_failing_is_given_up(group: ProcessSupervisor) -> None:
    group.send(0, ("exit", 4))
    first = group.gather([0], 30.0, _judge)[0]
    group.fail(0, first, "echo")

    def bring_up() -> Any:
        _bring_up(group, 0)
        group.send(0, ("raise", "still broken"))
        return group.gather([0], 30.0, _judge)[0]

    with pytest.raises(
        RuntimeError,
        match=r"(?s)^worker 0 failed 3 times in a row without a successful echo; last error "
        r"during restart: child raised ValueError: still broken\nTraceback: here$",
    ):
        group.restart(0, bring_up)
    assert group.restarts == 2 and group.failures == 3
    assert group.send(0, ("echo", 1)) == Failure("worker is not running")
    assert group.num_alive == 1


@pytest.mark.timeout(30)
def test_a_success_starts_the_count_again(group: ProcessSupervisor) -> None:
    for _ in range(4):  # more failures than max_restarts, none in a row past it
        group.send(0, ("raise", "once"))
        group.fail(0, group.gather([0], 30.0, _judge)[0], "echo")
        group.restart(0, lambda: _bring_up(group, 0))
        group.send(0, ("echo", "ok"))
        assert group.gather([0], 30.0, _judge) == {0: "ok"}
        group.succeeded(0)
    assert group.failures == 4 and group.policy.in_a_row(0) == 0


@pytest.mark.timeout(30)
def test_a_stalled_child_is_hung_and_a_stale_answer_is_skipped(group: ProcessSupervisor) -> None:
    group.send(0, ("stale", "current"))
    group.send(1, ("hang", None))
    answers = group.gather(
        range(2), None, _judge, stalled=lambda slot, now: "is stuck" if slot == 1 else None
    )
    assert answers == {0: "current", 1: Failure("worker is stuck and was killed")}


@pytest.mark.timeout(30)
def test_an_answer_no_restart_mends_is_raised(group: ProcessSupervisor) -> None:
    group.send(1, ("config", "bad env_config"))
    with pytest.raises(ConfigError, match="in worker 1: bad env_config"):
        group.gather([1], 30.0, _judge)


def _codec_child(conn: Connection, inherited: Sequence[Connection]) -> None:
    """Echoes each message; answers ``garbage`` with bytes that are no message."""
    enter_child(inherited)
    while True:
        try:
            message = CODEC.receive(conn)
        except EOFError:
            return
        if message["kind"] == "close":
            return
        CODEC.transmit(conn, b"\xc1" if message["kind"] == "garbage" else CODEC.encode(message))


@pytest.mark.timeout(30)
def test_the_codec_wire_sends_once_encoded_and_catches_garbage() -> None:
    group = ProcessSupervisor(
        ["rlserve-test-codec-0", "rlserve-test-codec-1"],
        ["codec 0", "codec 1"],
        _codec_child,
        what="codec child",
        wire=CODEC,
        close_message={"kind": "close"},
        logger=LOGGER,
        restart_note="it",
        success="echo",
    )
    try:
        group.start(0)
        group.start(1)
        message = {"kind": "echo", "values": np.arange(4, dtype=np.float32)}
        assert group.send_all(message, [0, 1]) == {}
        answers = group.gather([0, 1], 30.0, lambda slot, m: m)
        for slot in (0, 1):
            np.testing.assert_array_equal(answers[slot]["values"], message["values"])
        group.send(1, {"kind": "garbage"})
        failure = group.gather([1], 30.0, lambda slot, m: m)[1]
        assert isinstance(failure, Failure)
        assert failure.reason.startswith("sent a malformed message")
    finally:
        group.stop()
    assert group.pids == [None, None] and group.num_alive == 0


@pytest.mark.timeout(30)
def test_stop_reaps_every_child_even_a_hung_one() -> None:
    group = _group(close_wait_s=0.5)
    for slot in range(2):
        group.start(slot, "hi")
    group.gather(range(2), 30.0, _judge)
    pids = [pid for pid in group.pids if pid is not None]
    group.send(1, ("hang", None))
    group.stop()
    group.stop()  # twice is fine
    assert len(pids) == 2
    assert not [pid for pid in pids if Path(f"/proc/{pid}").exists()]  # not even zombies
