"""``rlserve serve --ray ADDRESS --replicas 2``: kill -9 of the driver, then ``--resume``.

The driver (the first front-end, on 127.0.0.2) owns the learner actor, pinned by its fake GPU
to 127.0.0.3, where a launcher runs the second front-end. Local-inference clients play on both.
Kill -9 of the driver: the learner dies with it (Ray's ownership), the second front-end keeps
serving (it takes the reports of its clients and of the driver's, which move to it, and holds
them on its disk), and ``rlserve serve --resume RUN`` with the same Ray flags starts a driver
again that keeps that front-end, starts a learner the front-end finds, and trains on: every
step the clients took is merged once and read by the learner.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from serving_players import (
    SMALL_PPO,
    LocalPlayer,
    every_step_merged_and_read_once,
    front_ends,
    metrics,
    port_free_on_both,
    wait_for,
)

from conftest import HEAD_IP, SECOND_IP, RayCluster
from rlserve.cluster.front_end_link import NAMESPACE
from rlserve.cluster.replicas import launcher_name, saved_learner_name

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _published_by(run: Path, pid: int) -> list[dict[str, Any]]:
    """The front-ends in ``run``'s ``endpoints.json`` once the driver ``pid`` listed them."""
    try:
        content = json.loads((run / "endpoints.json").read_text())
    except (OSError, ValueError):
        return []
    entries = list(content.get("front_ends", []))
    return entries if content.get("pid") == pid and len(entries) == 2 else []


def _kill_launchers(cluster: RayCluster, run: Path) -> None:
    """Kill the run's launcher actors, which outlive a driver (for a test that failed)."""
    name = saved_learner_name(run)
    for ip in (SECOND_IP,) if name else ():
        with contextlib.suppress(Exception):
            actor = cluster.ray.get_actor(launcher_name(str(name), ip), namespace=NAMESPACE)
            cluster.ray.kill(actor, no_restart=True)


def test_a_resumed_driver_trains_on_every_step_once_after_kill_9(
    ray_cluster: RayCluster, launch_server: Any
) -> None:
    port = port_free_on_both()
    ray_cluster.wait_for_free({"GPU": 1})  # a test before may still hold the one GPU
    ray_flags = (
        *("--ray", ray_cluster.address, "--ray-node-ip", HEAD_IP),
        *("--ray-learner-resources", json.dumps({"GPU": 1}), "--replicas", "2"),
    )
    driver = launch_server(*SMALL_PPO, "--checkpoint-every", "2", *ray_flags, port=port)
    run = driver.run_folder
    _, second = front_ends(run)
    a, b = f"{HEAD_IP}:{port}", f"{SECOND_IP}:{port}"
    on_second = LocalPlayer([b, a], seed=4)
    on_first = LocalPlayer([a, b], seed=4_000)
    players = (on_second, on_first)
    for player, name in zip(players, ("on-second", "on-first"), strict=True):
        player.name = name
    logs = [driver.log_path, run / "front_ends" / f"{SECOND_IP}.log"]

    def state() -> str:
        return ", ".join(f"{p.name}: {p.state()}" for p in players)

    def wait(condition: Any, what: str, headway: Any = None) -> None:
        wait_for(condition, what, headway, state, tuple(logs))

    def local_steps() -> int:
        return on_second.steps + on_first.steps

    def reported_on_second() -> int:
        return int(metrics(second).get("samples/steps_reported", 0))

    for player in players:
        player.start()
    try:
        wait(
            lambda: (
                driver.metrics().get("learner/updates", 0) >= 2
                and metrics(second).get("samples/steps_reported", 0) > 300
            ),
            "updates and steps on the second",
            local_steps,
        )
        version = int(driver.metrics()["server/weights_version"])
        driver.stop(signal.SIGKILL)
        # The second front-end keeps serving without a driver: the driver's clients move to
        # it, and it takes their reports onto its disk (held there, unacknowledged, until a
        # learner merges them; each client waits for the answer to its one report in flight).
        reported = reported_on_second()
        wait(
            lambda: reported_on_second() > reported and on_first.client.front_end == b,
            "the second front-end to take the moved client's reports",
            local_steps,
        )
        assert _alive(int(second["pid"]))
        again = launch_server(*ray_flags, resume=run, port=port)
        logs[0] = again.log_path
        # The same front-end (not a restart) is kept, and joins the new learner.
        wait(lambda: bool(_published_by(run, again.process.pid)), "the front-ends listed")
        assert _published_by(run, again.process.pid)[1]["pid"] == second["pid"]
        wait(
            lambda: again.metrics().get("server/weights_version", -1) > version + 2,
            "training to go on after the resume",
            lambda: again.metrics().get("learner/steps_consumed"),
        )
        wait(
            lambda: metrics(second).get("server/weights_version", -1) > version + 2,
            "the second front-end to serve the new learner's weights",
            lambda: metrics(second).get("learner/steps_consumed"),
        )
        for player in players:
            player.finish()
        # Nothing the clients took was lost with the driver or its learner, nothing was
        # doubled by their re-sends, and the new learner read every merged step once.
        every_step_merged_and_read_once(again, players, wait)
        log = again.log()
        assert "Traceback" not in log, log
        assert again.stop() == 0
        assert not _alive(int(second["pid"]))
    finally:
        for player in players:
            if player.is_alive():
                player.finish()
        _kill_launchers(ray_cluster, run)
