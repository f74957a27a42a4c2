"""A fresh interpreter as a supervised child: started, talked to, reaped, backed off."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlserve.processes.launchers import InterpreterLauncher
from rlserve.processes.restarts import Failure
from rlserve.processes.supervisor import ProcessSupervisor

LOGGER = logging.getLogger("rlserve.tests.launchers")


@pytest.fixture
def supervisor(monkeypatch: pytest.MonkeyPatch) -> Iterator[ProcessSupervisor]:
    # The child module sits next to this file; the launcher passes sys.path on to the child.
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    group = ProcessSupervisor(
        ["rlserve-test-interpreter"],
        ["the echo process"],
        InterpreterLauncher("interpreter_child"),
        what="the echo process",
        wire=None,
        close_message=None,
        logger=LOGGER,
        restart_note="it",
        success="echo",
        max_restarts=None,
        close_wait_s=5.0,
        back_off=(0.5, 2.0),
        log_level=logging.ERROR,
    )
    yield group
    group.stop()


def _echo(sock: socket.socket, text: bytes) -> bytes:
    sock.sendall(text + b"\n")
    received = b""
    while not received.endswith(b"\n"):
        chunk = sock.recv(100)
        assert chunk, "the child closed its socket"
        received += chunk
    return received[:-1]


@pytest.mark.timeout(60)
def test_an_interpreter_child_talks_over_its_socket_and_its_exit_is_told(
    supervisor: ProcessSupervisor,
) -> None:
    supervisor.start(0)
    sock = supervisor.channel(0)
    assert isinstance(sock, socket.socket)
    assert supervisor.pids[0] is not None and supervisor.num_alive == 1
    assert _echo(sock, b"hello") == b"hello"
    sock.sendall(b"exit 3\n")
    assert supervisor.reap(0, 10.0) == "the echo process exited with code 3"
    assert supervisor.pids == [None] and supervisor.channel(0) is None


@pytest.mark.timeout(60)
def test_a_child_that_does_not_exit_is_killed_when_reaped(supervisor: ProcessSupervisor) -> None:
    supervisor.start(0)
    assert _echo(supervisor.channel(0), b"still here") == b"still here"
    assert supervisor.reap(0, 0.1) == "the echo process closed its pipe"
    assert supervisor.num_alive == 0


@pytest.mark.timeout(60)
def test_restarts_back_off_by_failures_in_a_row_and_are_never_given_up(
    supervisor: ProcessSupervisor, caplog: pytest.LogCaptureFixture
) -> None:
    assert supervisor.restart_delay(0) == 0.0
    delays = []
    for _ in range(4):
        supervisor.fail(0, Failure("it died"), "training", note=lambda: "it later")
        delays.append(supervisor.restart_delay(0))
    assert delays == [0.5, 2.0, 2.0, 2.0]
    assert "the echo process failed during training: it died; restarting it later" in caplog.text
    supervisor.succeeded(0)
    assert supervisor.restart_delay(0) == 0.0
