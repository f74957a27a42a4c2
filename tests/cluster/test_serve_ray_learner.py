"""``rlserve serve --ray``: the server's learner as a Ray actor on the node with its resources.

A real server process (the driver) connects to the session's two-node cluster; the learner
actor is pinned to the second node by its pretend GPU, and is fed the server's log records
through Ray. Every step the clients were acknowledged must reach it, once, also when the learner
actor's process is killed and a new one takes over.
"""

from __future__ import annotations

import json
import os
import signal
import socket
from typing import Any

import pytest
from serving_players import SMALL_PPO, LocalPlayer, RemotePlayer, learner_actor_pid, wait_for

from conftest import HEAD_IP, SECOND_IP, RayCluster
from rlserve.cluster.connect import LearnerPlacement
from rlserve.cluster.front_ends import check_ports, front_end_nodes
from rlserve.errors import ConfigError

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

REPLAY_STALL_S = 150.0
"""Seconds a restarted learner actor may go without visible headway: it reads the log it replays
(tens of thousands of steps under load) and makes its first update from them before it reports
anything."""


def learner_headway(server: Any) -> tuple[Any, ...]:
    """What moves while the learner actor works: the steps it read, its updates, the version.

    (After a restart the learner reads and trains on a long replayed backlog first: on a loaded
    2-core machine a minute or more may pass with none of these moving, hence the longer stall
    allowed below.)
    """
    m = server.metrics()
    keys = ("learner/steps_consumed", "learner/updates", "server/weights_version")
    return tuple(m.get(k) for k in keys)


def settled(server: Any) -> dict[str, Any]:
    """Metrics once the learner has read everything the server logged."""

    def taken(m: dict[str, Any]) -> bool:
        return bool(
            m.get("learner/steps_consumed") == m["samples/steps_logged"]
            and m["samples/steps_queued"] == 0
        )

    wait_for(
        lambda: taken(server.metrics()),
        "the learner actor to take the whole experience log",
        lambda: learner_headway(server),
        logs=(server.log_path,),
        stall_s=REPLAY_STALL_S,
    )
    return dict(server.metrics())


def _serve_with_the_learner_on_the_gpu_node(ray_cluster: RayCluster, launch_server: Any) -> Any:
    """``rlserve serve --ray`` with its learner actor placed by the second node's fake GPU,
    once the first weights are out."""
    # The learner actor of the test before may still hold the one GPU for a moment.
    ray_cluster.wait_for_free({"GPU": 1})
    server = launch_server(
        *SMALL_PPO,
        "--ray",
        ray_cluster.address,
        "--ray-node-ip",
        HEAD_IP,
        "--ray-learner-resources",
        json.dumps({"GPU": 1}),
    )
    server.wait_for_weights(0, timeout=120)
    return server


def _updates_and_reports(metrics: dict[str, Any]) -> bool:
    return bool(metrics.get("learner/updates", 0) >= 2 and metrics["samples/steps_reported"] > 600)


@pytest.mark.timeout(480)  # its waits fail first, on a stall (see serving_players.wait_for)
def test_the_learner_on_the_gpu_node_gets_every_acknowledged_step(
    ray_cluster: RayCluster, launch_server: Any
) -> None:
    server = _serve_with_the_learner_on_the_gpu_node(ray_cluster, launch_server)
    local = LocalPlayer(server.address, seed=0)
    remote = RemotePlayer(server.address, seed=10_000)
    local.start()
    remote.start()
    try:
        wait_for(
            lambda: _updates_and_reports(server.metrics()),
            "updates from both kinds of clients",
            lambda: learner_headway(server),
            logs=(server.log_path,),
        )
    finally:
        local.finish()
        remote.finish()
    assert local.client.local is not None
    assert local.client.local.buffered_steps == local.client.local.dropped_steps == 0
    metrics = settled(server)
    # Each step the local client took was acknowledged once, and every logged step (remote
    # fragments too) reached the learner actor: none lost on the way through Ray.
    assert metrics["samples/steps_reported"] == local.steps
    assert metrics["learner/steps_consumed"] == metrics["samples/steps_logged"]
    assert metrics["samples/steps_dropped_queue_full"] == 0
    assert metrics["server/weights_version"] >= 2
    assert remote.errors == []
    log = server.log()
    assert f"the learner actor is ready on {SECOND_IP}" in log, log
    assert "Traceback" not in log
    assert server.stop() == 0
    # Its checkpoints are where --resume finds them.
    assert server.checkpoints


@pytest.mark.timeout(480)  # its waits fail first, on a stall (see serving_players.wait_for)
def test_a_killed_learner_actor_is_restarted_and_every_acknowledged_step_trained_once(
    ray_cluster: RayCluster, launch_server: Any
) -> None:
    server = _serve_with_the_learner_on_the_gpu_node(ray_cluster, launch_server)
    local = LocalPlayer(server.address, seed=1)
    remote = RemotePlayer(server.address, seed=20_000)
    local.start()
    remote.start()
    try:
        wait_for(
            lambda: server.metrics().get("learner/updates", 0) >= 2,
            "some updates",
            lambda: learner_headway(server),
            logs=(server.log_path,),
        )
        version = int(server.health()["weights_version"])
        os.kill(learner_actor_pid(ray_cluster.temp_dir), signal.SIGKILL)
        server.wait_until(lambda m: m["learner/restarts"] == 1, 60, "the learner restart")
        # Serving never stopped, and training goes on with versions that never go back.
        wait_for(
            lambda: server.metrics()["server/weights_version"] > version,
            "training after it",
            lambda: learner_headway(server),
            logs=(server.log_path,),
            stall_s=REPLAY_STALL_S,
        )
    finally:
        local.finish()
        remote.finish()
    assert local.client.local is not None
    assert local.client.local.buffered_steps == local.client.local.dropped_steps == 0
    metrics = settled(server)
    # Every step the local client took was acknowledged once, and every logged step reached
    # the learner's lineage once: what the dead actor had not trained was sent to the new one.
    assert metrics["samples/steps_reported"] == local.steps
    assert metrics["learner/steps_consumed"] == metrics["samples/steps_logged"]
    assert metrics["learner/restarts"] == 1
    assert remote.errors == []
    log = server.log()
    assert log.count("the learner actor failed during") == 1, log
    assert "Traceback" not in log
    assert server.stop() == 0


def test_a_learner_resource_no_node_has_is_refused(ray_cluster: RayCluster) -> None:
    placement = LearnerPlacement.parse('{"TPU": 1}')
    with pytest.raises(ConfigError, match=r"TPU=1 for one learner \(--ray-learner-resources") as e:
        placement.check(ray_cluster.ray)
    assert "ray start --address=HEAD" in str(e.value) and "\n" not in str(e.value)
    LearnerPlacement.parse('{"GPU": 1, "sim": 1}').check(ray_cluster.ray)  # the second node


def test_a_port_taken_on_a_node_and_too_few_nodes_are_refused(ray_cluster: RayCluster) -> None:
    ray = ray_cluster.ray
    with socket.socket() as taken:
        taken.bind((SECOND_IP, 0))
        taken.listen()
        port = int(taken.getsockname()[1])
        with pytest.raises(ConfigError, match=rf"port {port} on node {SECOND_IP} is taken") as e:
            check_ports(ray, [HEAD_IP, SECOND_IP], port)
        assert "pass --port with a port free on every node" in str(e.value)
    assert front_end_nodes(ray, 2, SECOND_IP) == [SECOND_IP, HEAD_IP]
    with pytest.raises(ConfigError, match=r"--replicas 3: the Ray cluster has 2 live node"):
        front_end_nodes(ray, 3, HEAD_IP)
