"""What the cluster has free, for the warning about an actor Ray has not placed yet."""

from __future__ import annotations

import pytest

from conftest import RayCluster
from rlserve.cluster.resources import free_resources_note, unready_actor_note

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def test_the_note_names_what_another_actor_holds(ray_cluster: RayCluster) -> None:
    class _Holder:
        """An actor that only holds what it was started with (defined here, so Ray ships it
        by value: the workers cannot import this module, whose ``conftest`` is the driver's)."""

        def ping(self) -> str:
            return "held"

    ray = ray_cluster.ray
    ray_cluster.wait_for_free({"GPU": 1})
    assert free_resources_note(ray, {"GPU": 1, "CPU": 0}) == "GPU 1 of 1 free"
    holder = ray.remote(_Holder).options(num_cpus=0, num_gpus=1).remote()
    try:
        assert ray.get(holder.ping.remote(), timeout=60) == "held"
        assert free_resources_note(ray, {"GPU": 1, "sim": 0.5}) == (
            "GPU 0 of 1 free, sim 4 of 4 free"
        )
    finally:
        ray.kill(holder)
    ray_cluster.wait_for_free({"GPU": 1})
    assert free_resources_note(ray, {}) == "nothing asked for"


def test_an_unready_actor_that_started_is_said_to_be_loading_not_waiting_for_resources() -> None:
    note = unready_actor_note("the learner actor", 30.0, "127.0.0.3", {"GPU": 1}, "GPU 0 of 1 free")
    assert note.startswith("the learner actor is not ready after 30 s: it started on 127.0.0.3")
    assert "loading" in note and "free" not in note


def test_an_unready_actor_not_heard_from_names_what_it_asks_for_and_the_fixes() -> None:
    note = unready_actor_note(
        "the learner actor", 60.0, None, {"CPU": 1, "GPU": 0}, "CPU 0 of 2 free"
    )
    assert "not ready after 60 s; it asks for {'CPU': 1} (CPU 0 of 2 free)" in note
    assert "stop what holds them, or start a node with them" in note
    assert "still starting" in note
