"""Shared fixtures: a real ``rlserve serve`` process on 127.0.0.1 for end-to-end tests.

``launch_server(*flags)`` starts the server as a subprocess with ``--port 0 --http-port 0``, reads
its stdout until the ``rlserve listening on ...`` line and returns a :class:`ServerHandle`. Every
server a test started is stopped at teardown: SIGTERM, then SIGKILL if it does not exit in time.
``module_launcher`` does the same for servers shared by a whole module.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from xdist_units import run_order, scheduling_unit

# A developer's own token or CA must not leak into the servers and clients of the tests; the
# tests that need them set them (monkeypatch.setenv).
for _name in ("RLSERVE_TOKEN", "RLSERVE_TLS_CA"):
    os.environ.pop(_name, None)

STARTUP_TIMEOUT = 60.0
"""Seconds a server may take to print its listening line."""

STOP_TIMEOUT = 60.0
"""Seconds a server may take to write its final checkpoint and exit after SIGTERM."""

WAIT_TIMEOUT = 90.0
"""Seconds ``ServerHandle.wait_until`` and ``wait_for_weights`` wait by default: a hang catcher.

Most waits are for the learner (an update, its steps consumed). On a saturated 2-core machine
(``make test``'s 4 workers, on a slow phase of the VM) a starved learner has made 2 updates in
55 s (the durability test's failure of 2026-11-29, docs/benchmarks.md): a 30-s wait fails a test
that would have passed. The test's own pytest timeout (120 s unless marked) still bounds it."""

LISTENING = re.compile(
    r"rlserve listening on (?P<tls>tls://)?(?P<host>.+?):(?P<port>\d+) \(binary\)"
    r"(?: and https?://(?P<http_host>.+?):(?P<http_port>\d+) \(HTTP\))?"
    r"; run folder (?P<run>.+)$"
)


def rlserve_command() -> list[str]:
    """The ``rlserve`` console script of this interpreter's environment."""
    script = Path(sys.executable).parent / "rlserve"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "rlserve.cli"]


def server_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("MKL_NUM_THREADS", "1")
    return env


@dataclass
class ServerHandle:
    """A running ``rlserve serve`` process."""

    process: subprocess.Popen[str]
    host: str
    port: int
    http_port: int | None
    run_folder: Path
    log_path: Path
    stdout_lines: list[str] = field(default_factory=list)
    _reader: threading.Thread | None = None
    on_listening_result: Any = None
    tls: bool = False
    http_verify: Any = True
    """httpx's ``verify`` for the HTTP views (a CA file for a TLS server)."""

    @property
    def address(self) -> str:
        """``host:port`` of the binary carrier, as PolicyClient takes it."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"{'tls://' if self.tls else ''}{host}:{self.port}"

    @property
    def http_url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"{'https' if self.tls else 'http'}://{host}:{self.http_port}"

    @property
    def checkpoints(self) -> list[Path]:
        return sorted((self.run_folder / "checkpoints").glob("ckpt_*.pt"))

    def alive(self) -> bool:
        return self.process.poll() is None

    def stdout(self) -> str:
        return "".join(self.stdout_lines)

    def log(self) -> str:
        """What the server wrote to stderr so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    # -- HTTP views ----------------------------------------------------------------------

    def _auth(self, token: str | None) -> dict[str, str]:
        return {} if token is None else {"Authorization": f"Bearer {token}"}

    def metrics(self, token: str | None = None) -> dict[str, Any]:
        """``GET /v1/metrics`` as a dict."""
        import httpx

        reply = httpx.get(
            f"{self.http_url}/v1/metrics",
            headers=self._auth(token),
            timeout=10,
            verify=self.http_verify,
        )
        reply.raise_for_status()
        return reply.json()

    def health(self) -> dict[str, Any]:
        import httpx

        reply = httpx.get(f"{self.http_url}/v1/health", timeout=10, verify=self.http_verify)
        reply.raise_for_status()
        return reply.json()

    def wait_until(
        self,
        predicate: Callable[[dict[str, Any]], bool],
        timeout: float = WAIT_TIMEOUT,
        what: str = "condition",
        token: str | None = None,
    ) -> dict[str, Any]:
        """Poll ``/v1/metrics`` until ``predicate(metrics)``; return those metrics."""
        deadline = time.monotonic() + timeout
        last: dict[str, Any] = {}
        while True:
            assert self.alive(), f"server exited while waiting for {what}:\n{self.log()}"
            last = self.metrics(token)
            if predicate(last):
                return last
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout} s waiting for {what}; {last}")
            time.sleep(0.05)

    def wait_for_weights(self, version: int = 0, timeout: float = WAIT_TIMEOUT) -> int:
        """Poll ``/v1/health`` until the learner published weights of at least ``version``."""
        deadline = time.monotonic() + timeout
        while True:
            assert self.alive(), f"server exited while waiting for weights:\n{self.log()}"
            current = int(self.health()["weights_version"])
            if current >= version:
                return current
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"weights version stayed {current} (< {version}) for {timeout} s; the "
                    f"server's log ends:\n{self.log()[-4000:]}"
                )
            time.sleep(0.05)

    # -- lifecycle -----------------------------------------------------------------------

    def stop(self, sig: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT) -> int:
        """Send ``sig`` and wait for the exit; SIGKILL after ``timeout``. Returns the code."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(sig)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        if self._reader is not None:
            self._reader.join(5)
        return int(self.process.returncode)


def _wait_accepting(handle: ServerHandle, timeout: float = 20.0) -> None:
    host, port = handle.http_url.split("://", 1)[1].rsplit(":", 1)
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((host, int(port)), 5).close()
            return
        except OSError:
            if time.monotonic() > deadline or not handle.alive():
                raise RuntimeError(
                    f"the HTTP port {port} never accepted a connection\n{handle.log()}"
                ) from None
            time.sleep(0.02)


class ServerLauncher:
    """Starts servers under ``base`` and stops them all at :meth:`close`."""

    def __init__(self, base: Path):
        self.base = base
        self.servers: list[ServerHandle] = []
        self._count = 0

    def __call__(
        self,
        *flags: str,
        name: str | None = None,
        resume: Path | None = None,
        spaces: tuple[str, ...] = ("--spaces-from", "CartPole-v1"),
        port: int = 0,
        wait_http: bool = True,
        on_listening: Callable[[re.Match[str]], Any] | None = None,
    ) -> ServerHandle:
        """Start ``rlserve serve`` with ``flags`` and wait for its listening line.

        Args:
            flags: Extra command-line flags.
            name: Run name (default: a fresh one); ignored with ``resume``.
            resume: A run folder to ``--resume`` instead of starting a new run.
            spaces: Flags that give the spaces (not used with ``resume``).
            port: The binary port (0: a free one).
            wait_http: Wait until the HTTP port accepts connections (see ``test_http``: the
                listening line may come before the HTTP carrier listens).
            on_listening: Called with the parsed listening line as soon as it is read (before
                anything else happens); its result is kept in ``handle.on_listening_result``.
        """
        self._count += 1
        log_path = self.base / f"server-{self._count}.log"
        command = [*rlserve_command(), "serve"]
        if resume is not None:
            command += ["--resume", str(resume)]
        else:
            command += [*spaces, "--run-dir", str(self.base / "runs")]
            command += ["--name", name or f"run{self._count}"]
        command += ["--port", str(port), "--http-port", "0", "--no-progress"]
        algo = flags[flags.index("--algo") + 1] if "--algo" in flags else "ppo"
        if resume is None and not any(flag.endswith("-device") for flag in flags):
            # The run's algorithm's learner (a resumed run keeps the device it started with).
            command += [f"--{algo}-device", "cpu"]
        command += list(flags)
        with log_path.open("w") as log:
            process = subprocess.Popen(
                command,
                stdout=subprocess.PIPE,
                stderr=log,
                stdin=subprocess.DEVNULL,
                text=True,
                env=server_env(),
                start_new_session=True,
            )
        lines: list[str] = []
        found: queue.Queue[str | None] = queue.Queue()
        probe: list[Any] = []

        def read() -> None:
            assert process.stdout is not None
            for line in process.stdout:
                lines.append(line)
                match = LISTENING.search(line.strip())
                if match:
                    if on_listening is not None:
                        try:
                            probe.append(on_listening(match))
                        except Exception as exc:
                            probe.append(exc)
                    found.put(line.strip())
            found.put(None)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            line = found.get(timeout=STARTUP_TIMEOUT)
        except queue.Empty:
            line = None
        if line is None:
            process.kill()
            process.wait(10)
            raise RuntimeError(
                f"rlserve serve did not print its listening line within {STARTUP_TIMEOUT} s "
                f"(exit code {process.returncode})\ncommand: {command}\nstdout:\n"
                f"{''.join(lines)}\nstderr:\n{log_path.read_text(errors='replace')}"
            )
        match = LISTENING.search(line)
        assert match is not None
        handle = ServerHandle(
            process=process,
            host=match["host"],
            port=int(match["port"]),
            http_port=int(match["http_port"]) if match["http_port"] else None,
            run_folder=Path(match["run"]),
            log_path=log_path,
            stdout_lines=lines,
            _reader=reader,
            on_listening_result=probe[0] if probe else None,
            tls=bool(match["tls"]),
        )
        self.servers.append(handle)
        if wait_http and handle.http_port is not None:
            _wait_accepting(handle)
        return handle

    def close(self) -> None:
        for handle in self.servers:
            handle.stop()


@pytest.fixture
def learning_device() -> str:
    """The torch device of the learning tests that pin one: ``cpu`` unless ``RLSERVE_TEST_DEVICE``
    names another (the GPU check runs them with ``RLSERVE_TEST_DEVICE=cuda``)."""
    return os.environ.get("RLSERVE_TEST_DEVICE", "cpu")


@pytest.fixture
def launch_server(tmp_path: Path) -> Iterator[ServerLauncher]:
    """Factory: ``launch_server(*flags)`` starts a real server; all are stopped at teardown."""
    launcher = ServerLauncher(tmp_path)
    try:
        yield launcher
    finally:
        launcher.close()


@pytest.fixture(scope="module")
def module_launcher(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerLauncher]:
    """Like ``launch_server``, for servers shared by the tests of one module."""
    launcher = ServerLauncher(tmp_path_factory.mktemp("servers"))
    try:
        yield launcher
    finally:
        launcher.close()


@pytest.fixture
def run_rlserve(tmp_path: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run ``rlserve ARGS...`` to completion (for commands that must fail fast)."""

    # A guard against a hang, not a speed check: a loaded 2-core machine takes tens of seconds
    # to import torch and onnx in a fresh interpreter.
    def run(*args: str, timeout: float = 180.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*rlserve_command(), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=server_env(),
            cwd=tmp_path,
            check=False,
        )

    return run


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "e2e: end-to-end test against a real 'rlserve serve' subprocess"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The order xdist hands the modules out in (see :func:`pytest_xdist_make_scheduler`): the
    Ray units, then the longest modules (:func:`xdist_units.run_order`), then the others as
    collected. A stable sort: each module's tests keep their order."""
    items.sort(key=lambda item: run_order(item.path, config.rootpath))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile`` (``make test``), except that the Ray modules go to two units
    (:func:`scheduling_unit`) and the units are handed out in collection order.

    Not ``--dist loadgroup`` with ``xdist_group`` marks: with pytest 9.2 those are silently
    ignored (pytest-dev/pytest-xdist#1386: xdist renames node ids through a field pytest no
    longer reads), and every test went to any worker, with its module's fixtures and Ray
    cluster started again there.
    """
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scheduling_unit(config.rootpath / nodeid.split("::", 1)[0])

    config.option.loadscopereorder = False
    return ModuleScheduling(config, log)


ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"
"""Where tests leave files for a person to look at (the dashboard's screenshot); gitignored."""

_SESSION_STARTED = time.time()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """List the artifacts this run wrote, so CI's output says where the screenshot is."""
    if not ARTIFACTS.is_dir():
        return
    written = [p for p in sorted(ARTIFACTS.iterdir()) if p.stat().st_mtime >= _SESSION_STARTED]
    for path in written:
        terminalreporter.write_line(f"test artifact: {path} ({path.stat().st_size:,} bytes)")
