"""A real two-node Ray cluster on loopback for the tests of ``rlserve.cluster``.

The head node listens on 127.0.0.2 and the second node, which alone has the custom resource
``sim`` and one GPU (fake: Ray takes ``--num-gpus`` on trust), on 127.0.0.3: Ray rewrites
127.0.0.1 to the machine's network address, and no test traffic may leave loopback. Each
cluster has a temp dir of its own, so parallel test sessions do not share one, and it is stopped
by killing the processes that name that dir, and the head's client server, which names only the
cluster's address (``ray stop`` would stop every Ray cluster of the machine, other sessions'
too). A test process starts its cluster for the first module that needs one and stops it when
its next test does not (under xdist a worker runs other directories' files in between). The
tests are skipped when Ray is not installed (``pip install -e '.[ray]'``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

HEAD_IP = "127.0.0.2"
SECOND_IP = "127.0.0.3"
OBJECT_STORE_BYTES = 200 * 1024 * 1024
START_TIMEOUT_S = 120.0
STOP_GRACE_S = 2.0
CLUSTER_NICENESS = -5
"""The niceness of this test process while its cluster runs, and so of the nodes it starts
(their processes and actors inherit it), where the tests may raise their priority (as root).

The Ray tests mostly wait: on actors to start (a Python process importing torch each), on
nodes noticed lost, on calls with timeouts of their own. ``make test`` runs four workers and
the other checks on two cores, and the CPU-bound learning tests it starts beside them took the
cores: the first learner test ran 124-143 s where it takes 30 s alone, and in one CI run past
its 180-s timeout. At -5 a Ray process weighs about three times another in the scheduler's
share; the learning tests, which only count steps, take a little longer instead."""


@dataclass
class RayCluster:
    """A running two-node cluster and the ``ray`` module connected to it."""

    ray: Any
    address: str
    temp_dir: Path
    env: dict[str, str]
    head_ip: str = HEAD_IP
    second_ip: str = SECOND_IP
    """The node with the custom resource ``sim`` and a (fake) GPU."""

    def add_node(self, ip: str, *flags: str) -> None:
        """Start one more node on the loopback address ``ip`` (127.0.0.4...) and wait for it."""
        _start(
            [
                f"--address={self.address}",
                f"--node-ip-address={ip}",
                *_common(self.temp_dir),
                *flags,
            ],
            self.env,
        )
        _wait_for_node(self.ray, ip, alive=True)

    def remove_node(self, ip: str) -> None:
        """Lose the node on ``ip`` (:meth:`kill_raylet`) and wait until Ray marks it dead.

        So the next test sees only the nodes it expects (Ray notices a lost node in seconds).
        """
        self.kill_raylet(ip)
        _wait_for_node(self.ray, ip, alive=False)

    def wait_for_free(self, need: dict[str, float], timeout: float = 60.0) -> None:
        """Wait until the cluster has ``need`` free: the previous test's actors are gone."""
        deadline = time.monotonic() + timeout
        while True:
            free = self.ray.available_resources()
            if all(free.get(name, 0.0) >= amount for name, amount in need.items()):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"{need} still not free after {timeout} s: {free}")
            time.sleep(0.2)

    def fill_cpus(self) -> list[Any]:
        """Actors holding the one CPU of each of the two nodes, so that new actors land on a
        node added next (free them with ``ray.kill``).

        The second node's holder is placed first: the other could land on either node.
        """

        class _CpuHolder:
            """Holds its resources (defined here: Ray ships it by value; the workers cannot
            import this ``conftest``)."""

            def ready(self) -> bool:
                return True

        self.wait_for_free({"CPU": 2})
        held = []
        for resources in ({"sim": 1}, {}):
            holder = self.ray.remote(num_cpus=1, resources=resources)(_CpuHolder).remote()
            self.ray.get(holder.ready.remote(), timeout=60)
            held.append(holder)
        return held

    @contextlib.contextmanager
    def nodes_with(self, resource: str, ips: Sequence[str]) -> Iterator[None]:
        """Nodes on ``ips`` with one ``resource`` each, lost again at the end (the next
        modules see the two nodes they expect)."""
        try:
            for ip in ips:
                self.add_node(ip, f'--resources={{"{resource}": 1}}')
            yield
        finally:
            for ip in ips:
                self.remove_node(ip)

    def lose_node_and_process(self, ip: str, pid: int, timeout: float = 30.0) -> None:
        """Lose the node on ``ip`` and SIGKILL its process ``pid`` (an actor's), waiting until
        that process is gone (dead or a zombie)."""
        self.kill_raylet(ip)
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + timeout
        while not _zombie(pid) and time.monotonic() < deadline:
            time.sleep(0.05)

    def kill_raylet(self, ip: str) -> None:
        """SIGKILL the raylet of the node on ``ip``: the node is lost, its actors with it."""
        for pid in _cluster_pids(self.temp_dir, "raylet", f"--node_ip_address={ip}"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _common(temp_dir: Path) -> list[str]:
    """The flags of every node: 1 CPU, a small object store, this cluster's temp dir."""
    return [
        "--num-cpus=1",
        f"--object-store-memory={OBJECT_STORE_BYTES}",
        f"--temp-dir={temp_dir}",
        "--disable-usage-stats",
    ]


def _alive_nodes(ray: Any) -> int:
    return len([n for n in ray.nodes() if n.get("Alive")])


def _wait_for_nodes(ray: Any, count: int) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while _alive_nodes(ray) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{count} Ray nodes did not come up")
        time.sleep(0.2)


def _wait_for_node(ray: Any, ip: str, alive: bool) -> None:
    """Wait until a node on ``ip`` is alive (``alive``), or none is."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        up = any(n.get("Alive") and n.get("NodeManagerAddress") == ip for n in ray.nodes())
        if up == alive:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the Ray node on {ip} is {'not up' if alive else 'still alive'}")
        time.sleep(0.2)


def _free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _ray_command() -> str:
    script = Path(sys.executable).parent / "ray"
    return str(script) if script.exists() else "ray"


def _cluster_pids(temp_dir: Path, *also: str) -> list[int]:
    """The processes whose command line names ``temp_dir`` (and ``also``): this cluster's."""
    return _pids_naming(str(temp_dir).encode(), *(a.encode() for a in also))


def _client_server_pids(address: str) -> list[int]:
    """The head's Ray client server, whose command line names the cluster's GCS address but
    not its temp dir (the NUL ends the argument: port 4955 is not 49551)."""
    return _pids_naming(b"ray.util.client.server", f"--address={address}\0".encode())


def _pids_naming(*markers: bytes) -> list[int]:
    """The processes (other than this one) whose command line holds every one of ``markers``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            cmdline = (entry / "cmdline").read_bytes()
            if all(m in cmdline for m in markers):
                found.append(int(entry.name))
    return found


def _stop(temp_dir: Path, address: str) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = _cluster_pids(temp_dir) + _client_server_pids(address)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + STOP_GRACE_S
        while pids and time.monotonic() < deadline:
            pids = [p for p in pids if Path(f"/proc/{p}").exists() and not _zombie(p)]
            time.sleep(0.1)
        if not pids:
            return


def _zombie(pid: int) -> bool:
    with contextlib.suppress(OSError):
        return ") Z " in Path(f"/proc/{pid}/stat").read_text()
    return True


def _start(args: list[str], env: dict[str, str]) -> None:
    done = subprocess.run(
        [_ray_command(), "start", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT_S,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"ray start {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")


_running: RayCluster | None = None
"""This test process's two nodes while they run: started by the first module that needs them,
stopped once the next test does not (an idle cluster costs a few percent of a core)."""


_niceness_before: int | None = None
"""This process's niceness before its cluster started, while it runs at CLUSTER_NICENESS."""


def _raise_priority() -> None:
    """Run at CLUSTER_NICENESS (the nodes started next inherit it), where allowed.

    Linux keeps a niceness per thread: this sets the calling (main) thread's, which the
    ``ray start`` processes and the threads made later (``ray.init``'s) inherit; those threads
    keep it after :func:`_restore_priority` (Ray's, idle once the module disconnects).
    """
    global _niceness_before
    before = os.getpriority(os.PRIO_PROCESS, 0)
    if before <= CLUSTER_NICENESS:
        return
    try:
        os.setpriority(os.PRIO_PROCESS, 0, CLUSTER_NICENESS)
    except PermissionError:
        return  # not root: the cluster runs at the usual priority
    _niceness_before = before


def _restore_priority() -> None:
    global _niceness_before
    if _niceness_before is not None:
        os.setpriority(os.PRIO_PROCESS, 0, _niceness_before)
        _niceness_before = None


def _start_nodes(ray: Any) -> RayCluster:
    temp_dir = Path(tempfile.mkdtemp(prefix="rlray", dir="/tmp"))
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    # A lost node is noticed in about 2 s rather than Ray's default 15 s or more.
    env["RAY_health_check_period_ms"] = "500"
    env["RAY_health_check_timeout_ms"] = "500"
    env["RAY_health_check_failure_threshold"] = "3"
    # Each node's log monitor forwards its workers' output to the drivers (the tests read the
    # `rlserve serve --ray` drivers' logs for tracebacks). Below this many log files it lists the
    # log folder on every pass, ten times a second when idle: 47 CPU-s over the ten nodes of a
    # `make test`. At 0 it lists the folder every 0.5 s and still reads every file from its start.
    env["RAY_LOG_MONITOR_MANY_FILES_THRESHOLD"] = "0"
    # The worker processes import rlserve (and the tests' envs) from where this session does.
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    port = _free_port(HEAD_IP)
    common = _common(temp_dir)
    address = f"{HEAD_IP}:{port}"
    _raise_priority()
    try:
        _start(
            [
                "--head",
                f"--port={port}",
                f"--node-ip-address={HEAD_IP}",
                "--include-dashboard=false",
                # Not Ray's fixed 10001: the clusters of two test processes may run at once.
                f"--ray-client-server-port={_free_port(HEAD_IP)}",
                *common,
            ],
            env,
        )
        _start(
            [
                f"--address={address}",
                f"--node-ip-address={SECOND_IP}",
                '--resources={"sim": 4}',
                "--num-gpus=1",
                *common,
            ],
            env,
        )
    except BaseException:
        _stop_and_remove(temp_dir, address)
        _restore_priority()
        raise
    return RayCluster(ray, address, temp_dir, env)


def _stop_and_remove(temp_dir: Path, address: str) -> None:
    _stop(temp_dir, address)
    shutil.rmtree(temp_dir, ignore_errors=True)


def _stop_running() -> None:
    global _running
    if _running is not None:
        cluster, _running = _running, None
        try:
            _stop_and_remove(cluster.temp_dir, cluster.address)
        finally:
            _restore_priority()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, Any, None]:
    """After a test's teardown, stop the nodes when no module is connected to them any more
    (its ``ray.shutdown`` done) and the next test of this process does not use them; a later
    module starts them again. A driver whose nodes go away is killed by Ray: never stop them
    under a connected module (one of its tests may not use the cluster)."""
    yield
    if (
        _running is not None
        and not _running.ray.is_initialized()
        and "ray_cluster" not in getattr(nextitem, "fixturenames", ())
    ):
        _stop_running()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Stop the nodes of an interrupted session too."""
    _stop_running()


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[RayCluster]:
    """This process's two-node cluster (started if it is not running), connected for one test
    module (``ray.init``).

    Disconnected after the module, so that the other modules of a test process sample in
    processes as before (with Ray initialised, env runners default to Ray actors).
    """
    global _running
    ray = pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[ray]'")
    if _running is None:
        _running = _start_nodes(ray)
    cluster = _running
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    ray.init(address=cluster.address, _node_ip_address=HEAD_IP, logging_level="ERROR")
    try:
        _wait_for_nodes(ray, 2)
        yield cluster
    finally:
        ray.shutdown()
