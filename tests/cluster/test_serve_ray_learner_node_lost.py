"""One front-end's learner node lost with its disk: the run goes on from the server's point.

``rlserve serve --ray`` (one front-end, the driver on 127.0.0.2) with its learner actor pinned
by a custom resource, ``learnerdisk``, that two more nodes have (127.0.0.8 and 127.0.0.9: other
modules add .4 to .7 to the same cluster). Local and remote clients play; once the server
holds a recovery point, the learner's node is lost (its raylet and the learner's process
killed) and with it its disk: its checkpoints are deleted (every node shares this machine's
disk, so deleting is what a lost local disk looks like). A new learner on the other
``learnerdisk`` node goes on from the point's checkpoint, not from scratch, reads the server's
log on from there, and every step logged is read once by the learner's lineage.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from typing import Any

import pytest
from serving_players import (
    SMALL_PPO,
    LocalPlayer,
    RemotePlayer,
    learner_actor_pid,
    wait_for,
)

from conftest import HEAD_IP, RayCluster
from rlserve.cluster.recovery import RECOVERY_FILE, load_point

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

LEARNER_NODES = ("127.0.0.8", "127.0.0.9")
"""The nodes with the resource the learner asks for: it starts on one, goes on on the other."""

READY = re.compile(r"the learner actor is ready on (127\.0\.0\.\d+)")


@pytest.fixture
def learner_nodes(ray_cluster: RayCluster) -> Iterator[RayCluster]:
    """The cluster with the two ``learnerdisk`` nodes, which are lost again after the test."""
    with ray_cluster.nodes_with("learnerdisk", LEARNER_NODES):
        yield ray_cluster


def test_one_front_ends_learner_node_lost_with_its_disk_goes_on_from_the_point(
    learner_nodes: RayCluster, launch_server: Any
) -> None:
    ray_cluster = learner_nodes
    server = launch_server(
        *SMALL_PPO,
        *("--checkpoint-every", "2"),
        "--ray",
        ray_cluster.address,
        "--ray-node-ip",
        HEAD_IP,
        "--ray-learner-resources",
        json.dumps({"learnerdisk": 1}),
    )
    run = server.run_folder
    local = LocalPlayer(server.address, seed=5)
    remote = RemotePlayer(server.address, seed=50_000)
    logs = (server.log_path,)

    def state() -> str:
        return f"local: {local.state()}; remote: {remote.state()}"

    def headway() -> int:
        return local.steps + remote.calls

    def wait(condition: Any, what: str) -> None:
        wait_for(condition, what, headway, state, logs)

    def ready_on() -> list[str]:
        return READY.findall(server.log())

    local.start()
    remote.start()
    try:
        wait(lambda: (run / RECOVERY_FILE).exists(), "a recovery point held by the server")
        point = load_point(run / RECOVERY_FILE)
        assert point is not None
        [lost_ip] = ready_on()
        assert lost_ip in LEARNER_NODES
        pid = learner_actor_pid(ray_cluster.temp_dir, node=lost_ip)
        ray_cluster.lose_node_and_process(lost_ip, pid)
        # Its disk is lost with it: the checkpoints (the server's log is on the driver's node).
        shutil.rmtree(run / "checkpoints")
        wait(lambda: server.metrics().get("learner/restarts", 0) == 1, "the learner restart")
        wait(lambda: len(ready_on()) == 2, "the new learner to be ready")
        # The new learner is on the other learnerdisk node and trains on.
        assert ready_on()[1] == next(ip for ip in LEARNER_NODES if ip != lost_ip)
        updates = server.metrics()["learner/updates"]
        wait(lambda: server.metrics()["learner/updates"] > updates, "an update of the new learner")
    finally:
        local.finish()
        remote.finish()
    assert local.client.local is not None
    assert local.client.local.buffered_steps == local.client.local.dropped_steps == 0
    metrics = server.wait_until(
        lambda m: (
            m.get("learner/steps_consumed") == m["samples/steps_logged"]
            and m["samples/steps_queued"] == 0
        ),
        timeout=120,
        what="the learner to read the whole experience log",
    )
    # Each local step was acknowledged once, and every logged step (remote fragments too) was
    # read once by the learner's lineage: the point's checkpoint had read the steps before its
    # position, the new learner the log after it.
    assert metrics["samples/steps_reported"] == local.steps
    assert metrics["learner/steps_consumed"] == metrics["samples/steps_logged"]
    assert remote.errors == []
    # The new learner went on from the point's checkpoint, not from scratch.
    log = server.log()
    own_log = (run / "rlserve.log").read_text()
    [name] = [c["name"] for c in point["checkpoints"].values()]
    assert own_log.count("the learner continues from") == 1, own_log
    assert metrics["learner/updates"] > int(name.split("_")[1].split(".")[0])
    assert log.count("the learner actor failed during") == 1, log
    assert "Traceback" not in log, log
    assert server.stop() == 0
