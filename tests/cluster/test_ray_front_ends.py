"""``rlserve serve --ray ADDRESS --replicas 2``: a front-end on each node, one learner.

The driver (the first front-end) listens on 127.0.0.2 and a launcher actor runs the second on
127.0.0.3, both on the same port. Clients of each; kill -9 of the second front-end: its
local-inference clients move to the first and lose nothing, its remote-inference client gets
``EpisodeLostError`` and carries on, and it is started again and replays its log. The learner's
merged log is read back to count: every step a local client took is in it once. Kill -9 of the
learner actor's process: a new one takes over from its checkpoint and the merged log, both
front-ends ship on, and again every step is merged once and read by the learner.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from serving_players import (
    SMALL_PPO,
    LocalPlayer,
    RemotePlayer,
    every_step_merged_and_read_once,
    front_ends,
    learner_actor_pid,
    metrics,
    port_free_on_both,
    wait_for,
)

from conftest import HEAD_IP, SECOND_IP, RayCluster

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


def test_two_front_ends_lose_nothing_when_one_is_killed(
    ray_cluster: RayCluster, launch_server: Any
) -> None:
    port = port_free_on_both()
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
    first, second = front_ends(server.run_folder)
    assert (first["node"], second["node"]) == (HEAD_IP, SECOND_IP)
    assert second["host"] == SECOND_IP and second["port"] == port
    a, b = f"{HEAD_IP}:{port}", f"{SECOND_IP}:{port}"
    on_second = LocalPlayer([b, a], seed=0)
    on_first = LocalPlayer([a, b], seed=1_000)
    remote = RemotePlayer([b, a], seed=10_000)
    players = (on_second, on_first, remote)
    for player, name in zip(players, ("on-second", "on-first", "remote"), strict=True):
        player.name = name
    logs = (server.log_path, server.run_folder / "front_ends" / f"{SECOND_IP}.log")

    def state() -> str:
        return ", ".join(f"{p.name}: {p.state()}" for p in players)

    def wait(condition: Any, what: str, headway: Any = None) -> None:
        wait_for(condition, what, headway, state, logs)

    for player in players:
        player.start()
    try:
        wait(
            lambda: metrics(second).get("samples/steps_reported", 0) > 300,
            "steps on the second",
            lambda: on_second.steps,
        )
        os.kill(int(second["pid"]), signal.SIGKILL)
        steps, episodes = on_second.steps, remote.episodes
        # Each wait fails when what it waits for stalls, not when a loaded machine is slow.
        wait(
            lambda: on_second.steps > steps + 300,
            "the moved client to go on",
            lambda: on_second.steps,
        )
        # Its episode open on the killed front-end ends with EpisodeLostError; between two
        # episodes it has none open there, and simply starts the next one on the first.
        wait(
            lambda: remote.client.front_end == a and remote.episodes > episodes + 3,
            "the remote client to go on",
            lambda: (remote.calls, remote.lost, remote.episodes),
        )
        assert remote.lost <= 1
        restarted = front_ends(server.run_folder, restarts=1)[1]
        assert restarted["pid"] != second["pid"] and restarted["port"] == port
        wait(lambda: metrics(restarted).get("learner/steps_consumed", 0) > 0, "its return")
        # It serves the newest weights the learner published (each put in Ray's store once).
        version = server.metrics()["server/weights_version"]
        wait(
            lambda: metrics(restarted).get("server/weights_version", -1) >= version,
            "the restarted front-end to serve the newest weights",
        )
    finally:
        for player in players:
            player.finish()
    assert remote.errors == []
    # None lost with the killed front-end, none doubled by its replay or the clients' re-sends.
    every_step_merged_and_read_once(server, (on_second, on_first), wait)
    assert server.metrics()["learner/updates"] >= 1
    log = server.log()
    assert "Traceback" not in log, log
    # The second front-end joined the learner in both its lives (told its state afresh).
    second_log = (Path(second["run_folder"]) / "rlserve.log").read_text()
    assert second_log.count(f"front-end {SECOND_IP} joined the learner") == 2, second_log
    assert server.stop() == 0


def test_two_front_ends_lose_nothing_when_the_learner_actor_is_killed(
    ray_cluster: RayCluster, launch_server: Any
) -> None:
    port = port_free_on_both()
    ray_cluster.wait_for_free({"GPU": 1})  # the test before may still hold the one GPU
    server = launch_server(
        *SMALL_PPO,
        "--ray",
        ray_cluster.address,
        "--ray-node-ip",
        HEAD_IP,
        "--ray-learner-resources",
        json.dumps({"GPU": 1}),
        "--replicas",
        "2",
        port=port,
    )
    first, second = front_ends(server.run_folder)
    a, b = f"{HEAD_IP}:{port}", f"{SECOND_IP}:{port}"
    on_second = LocalPlayer([b, a], seed=2)
    on_first = LocalPlayer([a, b], seed=2_000)
    players = (on_second, on_first)
    for player, name in zip(players, ("on-second", "on-first"), strict=True):
        player.name = name
    logs = (server.log_path, server.run_folder / "front_ends" / f"{SECOND_IP}.log")

    def state() -> str:
        return ", ".join(f"{p.name}: {p.state()}" for p in players)

    def wait(condition: Any, what: str, headway: Any = None) -> None:
        wait_for(condition, what, headway, state, logs)

    def local_steps() -> int:
        return on_second.steps + on_first.steps

    for player in players:
        player.start()
    try:
        wait(
            lambda: (
                server.metrics().get("learner/updates", 0) >= 1
                and metrics(second).get("samples/steps_reported", 0) > 300
            ),
            "an update and steps on the second",
            local_steps,
        )
        os.kill(learner_actor_pid(ray_cluster.temp_dir, "SharedLearner"), signal.SIGKILL)
        wait(
            lambda: server.metrics().get("learner/restarts", 0) == 1,
            "the learner restart",
            local_steps,
        )
        steps = local_steps()
        wait(lambda: local_steps() > steps + 600, "the clients to go on", local_steps)
    finally:
        for player in players:
            player.finish()
    # None lost with the learner, none doubled by what the front-ends shipped again to the new
    # one; the new learner read every merged step the dead one had not trained, once.
    every_step_merged_and_read_once(server, players, wait)
    assert server.metrics()["learner/restarts"] == 1
    log = server.log()
    assert log.count("the learner actor failed during") == 1, log
    assert "Traceback" not in log, log
    assert first["node"] == HEAD_IP
    assert server.stop() == 0
