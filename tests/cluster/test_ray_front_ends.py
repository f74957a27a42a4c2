"""``rlserve serve --ray ADDRESS --replicas 2``: a front-end on each node, one learner.

The driver (the first front-end) listens on 127.0.0.2 and a launcher actor runs the second on
127.0.0.3, both on the same port. Clients of each; kill -9 of the second front-end: its
local-inference clients move to the first and lose nothing, its remote-inference client gets
``EpisodeLostError`` and carries on, and it is started again and replays its log. The learner's
merged log is read back to count: every step a local client took is in it once.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
from serving_players import LocalPlayer, RemotePlayer

from conftest import HEAD_IP, SECOND_IP, RayCluster
from rlserve.run.experience_log import LogCorruptError, LogReader

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

SMALL_PPO = (
    "--ppo-train-batch-size",
    "256",
    "--ppo-minibatch-size",
    "128",
    "--ppo-num-epochs",
    "1",
    "--fragment-length",
    "16",
    "--max-sample-queue-steps",
    "1000000",
)


def _port_free_on_both() -> int:
    for _ in range(50):
        with socket.socket() as sock:
            sock.bind((HEAD_IP, 0))
            port = int(sock.getsockname()[1])
        with socket.socket() as other:
            try:
                other.bind((SECOND_IP, port))
            except OSError:
                continue
        return port
    raise RuntimeError("no port free on both nodes")


def _front_ends(run: Path, timeout: float = 60.0, **want: Any) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            entries = json.loads((run / "endpoints.json").read_text()).get("front_ends", [])
        except (OSError, ValueError):
            entries = []
        if (
            len(entries) == 2
            and entries[1].get("pid")
            and all(entries[1].get(k) == v for k, v in want.items())
        ):
            return list(entries)
        time.sleep(0.2)
    raise AssertionError(f"endpoints.json never listed both front-ends ({want})")


def _metrics(entry: dict[str, Any]) -> dict[str, Any]:
    url = f"http://{entry['host']}:{entry['http_port']}/v1/metrics"
    return dict(httpx.get(url, timeout=10).json())


def _merged(run: Path) -> list[Any]:
    """The learner's merged log, read as far as it goes."""
    reader = LogReader(run / "learner" / "experience")
    records: list[Any] = []
    try:
        records.extend(reader.records(0, 1 << 40))
    except LogCorruptError:
        pass  # its end
    finally:
        reader.close()
    return records


def _wait(condition: Any, what: str, timeout: float = 60.0, logs: tuple[Path, ...] = ()) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            tails = "\n".join(p.read_text(errors="replace")[-3000:] for p in logs if p.exists())
            raise AssertionError(f"timed out waiting for {what}\n{tails}")
        time.sleep(0.2)


def test_two_front_ends_lose_nothing_when_one_is_killed(
    ray_cluster: RayCluster, launch_server: Any
) -> None:
    port = _port_free_on_both()
    server = launch_server(
        *SMALL_PPO,
        "--ray",
        ray_cluster.address,
        "--ray-node-ip",
        HEAD_IP,
        "--replicas",
        "2",
        port=port,
    )
    assert server.host == HEAD_IP and server.port == port
    first, second = _front_ends(server.run_folder)
    assert (first["node"], second["node"]) == (HEAD_IP, SECOND_IP)
    assert second["host"] == SECOND_IP and second["port"] == port
    a, b = f"{HEAD_IP}:{port}", f"{SECOND_IP}:{port}"
    on_second = LocalPlayer([b, a], seed=0)
    on_first = LocalPlayer([a, b], seed=1_000)
    remote = RemotePlayer([b, a], seed=10_000)
    players = (on_second, on_first, remote)
    logs = (server.log_path, server.run_folder / "front_ends" / f"{SECOND_IP}.log")

    def wait(condition: Any, what: str) -> None:
        _wait(condition, what, logs=logs)

    for player in players:
        player.start()
    try:
        wait(lambda: _metrics(second).get("samples/steps_reported", 0) > 300, "steps on the second")
        os.kill(int(second["pid"]), signal.SIGKILL)
        steps = on_second.steps
        wait(lambda: on_second.steps > steps + 300, "the moved client to go on")
        wait(lambda: remote.lost >= 1 and remote.episodes > 3, "the remote client to go on")
        restarted = _front_ends(server.run_folder, restarts=1)[1]
        assert restarted["pid"] != second["pid"] and restarted["port"] == port
        wait(lambda: _metrics(restarted).get("learner/steps_consumed", 0) > 0, "its return")
        # It serves the newest weights the learner published (each put in Ray's store once).
        version = server.metrics()["server/weights_version"]
        wait(
            lambda: _metrics(restarted).get("server/weights_version", -1) >= version,
            "the restarted front-end to serve the newest weights",
        )
    finally:
        for player in players:
            player.finish()
    for player in (on_second, on_first):
        assert player.client.local is not None
        assert player.client.local.buffered_steps == player.client.local.dropped_steps == 0
        assert player.client.local.rejected_steps == 0
    assert remote.errors == []
    local_steps = on_second.steps + on_first.steps

    def reported() -> int:
        return sum(r.steps for r in _merged(server.run_folder) if r.kind.startswith("report"))

    # Every step the local clients took reached the learner's log once: none lost with the
    # killed front-end, none doubled by its replay or the clients' re-sends.
    wait(lambda: reported() >= local_steps, "every reported step to be merged")
    records = _merged(server.run_folder)
    copies = Counter(r.batch_id for r in records if r.batch_id is not None)
    assert [batch for batch, n in copies.items() if n > 1] == []
    assert reported() == local_steps

    def everything_read() -> bool:
        total = sum(r.steps for r in _merged(server.run_folder))
        return bool(server.metrics()["learner/steps_consumed"] == total)

    # The learner read every merged step (front-ends still replaying are waited for).
    wait(everything_read, "the learner to read the whole merged log")
    assert server.metrics()["learner/updates"] >= 1
    log = server.log()
    assert "Traceback" not in log, log
    # The second front-end joined the learner in both its lives (told its state afresh).
    second_log = (Path(second["run_folder"]) / "rlserve.log").read_text()
    assert second_log.count(f"front-end {SECOND_IP} joined the learner") == 2, second_log
    assert server.stop() == 0
