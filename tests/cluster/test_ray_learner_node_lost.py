"""The shared learner's node lost with its disk: the run goes on from the driver's recovery point.

Two front-ends (127.0.0.2, the driver, and 127.0.0.3) and the learner pinned by a custom
resource, ``learnerbox``, that two more nodes have (127.0.0.6 and 127.0.0.7: other modules add
.4 and .5 to the same cluster). After some updates and a recovery point held by the driver, the
learner's node is lost (its raylet and the learner's process killed) and with it its disk: the
learner's merged log and checkpoints are deleted (every node shares this machine's disk, so
deleting is what a lost local disk looks like). A new learner on the other ``learnerbox`` node
goes on from the driver's recovery point, both front-ends ship it what the point does not
include, and every step the clients took is trained once (the learner's count of steps read
equals the clients' count).
"""

from __future__ import annotations

import json
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from serving_players import (
    SMALL_PPO,
    LocalPlayer,
    front_ends,
    metrics,
    port_free_on_both,
    wait_for,
)

from conftest import HEAD_IP, SECOND_IP, RayCluster
from rlserve.cluster.front_end_link import NAMESPACE
from rlserve.cluster.recovery import RECOVERY_FILE, load_point

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

LEARNER_NODES = ("127.0.0.6", "127.0.0.7")
"""The nodes with the resource the learner asks for: it starts on one, goes on on the other."""


def _learner(ray: Any, run: Path) -> dict[str, Any]:
    """Where the learner actor runs: its ``node`` and ``pid`` (it says so itself)."""
    found = re.search(
        r"joined the learner \((rlserve-learner-\w+);", (run / "rlserve.log").read_text()
    )
    assert found is not None
    actor = ray.get_actor(found[1], namespace=NAMESPACE)
    return dict(ray.get(actor.greet.remote(), timeout=60))


@pytest.fixture
def learner_nodes(ray_cluster: RayCluster) -> Iterator[RayCluster]:
    """The cluster with the two ``learnerbox`` nodes, which are lost again after the test."""
    with ray_cluster.nodes_with("learnerbox", LEARNER_NODES):
        yield ray_cluster


def test_a_learner_node_lost_with_its_disk_loses_nothing(
    learner_nodes: RayCluster, launch_server: Any
) -> None:
    ray_cluster = learner_nodes
    port = port_free_on_both()
    server = launch_server(
        *SMALL_PPO,
        *("--checkpoint-every", "2"),
        "--ray",
        ray_cluster.address,
        "--ray-node-ip",
        HEAD_IP,
        "--ray-learner-resources",
        json.dumps({"learnerbox": 1}),
        "--replicas",
        "2",
        port=port,
    )
    run = server.run_folder
    first, second = front_ends(run)
    assert (first["node"], second["node"]) == (HEAD_IP, SECOND_IP)
    a, b = f"{HEAD_IP}:{port}", f"{SECOND_IP}:{port}"
    players = (LocalPlayer([b, a], seed=3), LocalPlayer([a, b], seed=3_000))
    for player, name in zip(players, ("on-second", "on-first"), strict=True):
        player.name = name
    logs = (server.log_path, run / "front_ends" / f"{SECOND_IP}.log")

    def state() -> str:
        return ", ".join(f"{p.name}: {p.state()}" for p in players)

    def wait(condition: Any, what: str, headway: Any = None) -> None:
        wait_for(condition, what, headway, state, logs)

    def local_steps() -> int:
        return sum(p.steps for p in players)

    for player in players:
        player.start()
    try:
        wait(
            lambda: (
                (run / RECOVERY_FILE).exists()
                and metrics(second).get("samples/steps_reported", 0) > 300
            ),
            "a recovery point held by the driver and steps on the second",
            local_steps,
        )
        point = load_point(run / RECOVERY_FILE)
        assert point is not None
        learner = _learner(ray_cluster.ray, run)
        lost_ip, pid = learner["node"], int(learner["pid"])
        assert lost_ip in LEARNER_NODES
        ray_cluster.lose_node_and_process(lost_ip, pid)
        # Its disk is lost with it: the merged log and the checkpoints.
        shutil.rmtree(run / "learner")
        shutil.rmtree(run / "checkpoints")
        wait(
            lambda: server.metrics().get("learner/restarts", 0) == 1,
            "the learner restart",
            local_steps,
        )
        wait(
            lambda: (run / "rlserve.log").read_text().count("joined the learner") == 2,
            "the new learner to be ready",
            local_steps,
        )
        # The new learner is on the other learnerbox node and trains on.
        other = next(ip for ip in LEARNER_NODES if ip != lost_ip)
        assert _learner(ray_cluster.ray, run)["node"] == other
        updates = server.metrics()["learner/updates"]
        wait(
            lambda: server.metrics()["learner/updates"] > updates,
            "an update of the new learner",
            local_steps,
        )
    finally:
        for player in players:
            player.finish()
    for player in players:
        assert player.client.local is not None
        assert player.client.local.buffered_steps == player.client.local.dropped_steps == 0
        assert player.client.local.rejected_steps == 0
    total = local_steps()

    def consumed() -> float:
        return float(server.metrics().get("learner/steps_consumed", 0))

    # Every step the clients took is read by the learner's lineage once: what the recovery
    # point's checkpoint had trained, and what the front-ends shipped to the new learner.
    wait(lambda: consumed() >= total, "the learner to read every step", consumed)
    time.sleep(1.0)
    assert consumed() == total
    # The new learner went on from the point's checkpoint, not from scratch.
    own_log = (run / "rlserve.log").read_text()
    [name] = [c["name"] for c in point["checkpoints"].values()]
    assert own_log.count("the learner continues from") == 1, own_log
    assert server.metrics()["learner/updates"] > int(name.split("_")[1].split(".")[0])
    log = server.log()
    assert log.count("the learner actor failed during") == 1, log
    assert "Traceback" not in log, log
    assert server.stop() == 0
