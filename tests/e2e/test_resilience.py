"""Dead clients, server restarts, resumed runs and reconnection, with real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from typing import Any

import numpy as np
import pytest
from e2e_support import play_cartpole, run_worker, samples_total

from rlserve import EpisodeError, PolicyClient, SpaceError

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

GOOD = np.array([0.01, -0.02, 0.03, 0.04], dtype=np.float32)


def _client(server: Any, **kwargs: Any) -> PolicyClient:
    kwargs.setdefault("inference_mode", "remote")
    kwargs.setdefault("timeout", 30)
    kwargs.setdefault("reconnect_timeout", 30)
    return PolicyClient(server.address, **kwargs)


def test_killed_client_episode_times_out(launch_server: Any) -> None:
    server = launch_server("--idle-timeout", "1", "--metrics-interval", "0.2")
    server.wait_for_weights(0)
    worker = run_worker(server.address, "hang", "7", "5")
    try:
        assert worker.stdout is not None
        line = worker.stdout.readline()
        assert line.startswith("ready "), (line, worker.stderr and worker.stderr.read())
        server.wait_until(
            lambda m: m["server/episodes_active"] == 1 and m["server/clients"] == 1,
            what="the worker's episode",
        )
    finally:
        worker.kill()
        worker.wait(10)
    assert worker.returncode == -signal.SIGKILL

    metrics = server.wait_until(
        lambda m: m["episodes/timed_out"] == 1, timeout=30, what="the idle timeout"
    )
    assert metrics["server/episodes_active"] == 0
    assert metrics["episodes/completed"] == 0  # a timed-out episode is not a completed one
    assert metrics["samples/env_steps"] == 5
    # The 4 steps that were followed by an observation go to the learner; the 5th cannot.
    assert samples_total(metrics) == 4
    server.wait_until(lambda m: m["server/clients"] == 0, what="the dead connection to go")

    with _client(server) as client:  # the server keeps serving
        result = play_cartpole(client, seed=1)
    metrics = server.wait_until(lambda m: m["episodes/completed"] == 1, what="the new episode")
    assert metrics["episodes/timed_out"] == 1
    assert metrics["episodes/return_mean"] == result.episode_return


def test_live_client_is_not_timed_out(launch_server: Any) -> None:
    """Only silence closes an episode: one that keeps stepping outlives many idle timeouts."""
    server = launch_server("--idle-timeout", "1", "--metrics-interval", "0.1")
    server.wait_for_weights(0)
    with _client(server) as client:
        eid = client.start_episode()
        deadline = time.monotonic() + 3.0
        steps = 0
        while time.monotonic() < deadline:
            client.get_action(eid, GOOD)
            client.log_returns(eid, 1.0)
            steps += 1
            time.sleep(0.05)
        client.end_episode(eid, GOOD)
    metrics = server.wait_until(lambda m: m["episodes/completed"] == 1, what="the episode")
    assert metrics["episodes/timed_out"] == 0
    assert metrics["episodes/return_mean"] == steps


def test_waiting_for_the_first_weights_is_not_idleness(launch_server: Any) -> None:
    """A get_action that waits for the learner's first weights must not expire its episode.

    The client did everything right: it is the server that has not answered yet.
    """
    idle = 0.5
    server = launch_server("--idle-timeout", str(idle), "--metrics-interval", "0.1")
    with _client(server) as client:
        eid = client.start_episode()
        asked = time.monotonic()
        assert client.get_action(eid, GOOD) in (0, 1)  # waits for the first weights
        if time.monotonic() - asked < 2 * idle:
            pytest.skip("the first weights came too soon for the idle timeout to matter")
        client.log_returns(eid, 1.0)
        assert client.get_action(eid, GOOD) in (0, 1)
        client.end_episode(eid, GOOD)
    metrics = server.wait_until(lambda m: m["episodes/completed"] == 1, what="the episode")
    assert metrics["episodes/timed_out"] == 0


def _settled_metrics(server: Any, quiet: float = 1.5, timeout: float = 60.0) -> dict[str, Any]:
    """Metrics once every step reached the learner and no new weights came for ``quiet`` s."""
    deadline = time.monotonic() + timeout
    last = server.metrics()
    since = time.monotonic()
    while True:
        time.sleep(0.1)
        now = server.metrics()
        if (
            now["samples/steps_queued"]
            or now["server/weights_version"] != last["server/weights_version"]
        ):
            since = time.monotonic()
        last = now
        if time.monotonic() - since >= quiet:
            return last
        assert time.monotonic() < deadline, f"the learner never settled: {last}"


def test_restart_and_resume_continue_the_run(launch_server: Any) -> None:
    flags = (
        "--ppo-train-batch-size",
        "256",
        "--ppo-minibatch-size",
        "64",
        "--ppo-num-epochs",
        "2",
        "--fragment-length",
        "32",
        "--checkpoint-every",
        "0",
        "--seed",
        "5",
    )
    server = launch_server(*flags, name="resumable")
    server.wait_for_weights(0)
    with _client(server) as client:
        episodes = 0
        while server.health()["weights_version"] < 1:
            play_cartpole(client, seed=episodes)
            episodes += 1
            assert episodes < 400, "no learner update after 400 episodes"
    before = _settled_metrics(server)
    assert before["server/weights_version"] >= 1
    assert before["learner/updates"] == before["server/weights_version"]

    assert server.stop(signal.SIGTERM) == 0, server.log()
    assert "final checkpoint" in server.stdout()
    checkpoints = server.checkpoints
    assert checkpoints, f"no checkpoint in {server.run_folder}"

    import torch

    state = torch.load(checkpoints[-1], weights_only=True)  # documented as safe to load
    assert isinstance(state, dict)

    resumed = launch_server(resume=server.run_folder)
    assert resumed.run_folder == server.run_folder
    resumed.wait_for_weights(before["server/weights_version"])
    after = resumed.metrics()
    assert after["server/weights_version"] == before["server/weights_version"]
    assert after["samples/env_steps"] == before["samples/env_steps"]
    assert after["episodes/completed"] == before["episodes/completed"]
    assert after["episodes/started"] == before["episodes/started"]
    assert after["episodes/return_mean"] == pytest.approx(before["episodes/return_mean"])

    # The resumed run carries on counting from where it stopped.
    with _client(resumed) as client:
        result = play_cartpole(client, seed=10_000)
    later = resumed.metrics()
    assert later["samples/env_steps"] == before["samples/env_steps"] + result.length
    assert later["episodes/completed"] == before["episodes/completed"] + 1
    assert resumed.stop(signal.SIGTERM) == 0, resumed.log()


def test_sigint_to_the_server_writes_a_final_checkpoint(launch_server: Any) -> None:
    """SIGINT to the server alone (SIGTERM: see test_restart_and_resume_continue_the_run)."""
    server = launch_server()
    server.wait_for_weights(0)
    with _client(server) as client:
        play_cartpole(client, seed=0)
    assert server.stop(signal.SIGINT) == 0, server.log()
    assert "final checkpoint" in server.stdout()
    assert server.checkpoints


@pytest.mark.parametrize(
    "sig",
    [
        pytest.param(signal.SIGINT, id="ctrl-c"),  # a terminal signals its foreground group
        pytest.param(signal.SIGTERM, id="group-sigterm"),  # systemd, timeout(1), kill -- -PGID
    ],
)
def test_signal_to_the_process_group_writes_a_final_checkpoint(
    launch_server: Any, sig: int
) -> None:
    """The learner process gets the signal too; the server must still checkpoint and exit 0."""
    server = launch_server()
    server.wait_for_weights(0)
    with _client(server) as client:
        play_cartpole(client, seed=0)
    os.killpg(server.process.pid, sig)  # the server leads its own process group
    try:
        server.process.wait(20)  # a clean stop takes about a second
    except subprocess.TimeoutExpired:
        server.process.kill()
        pytest.fail(f"the server hung for 20 s after {sig!r} to its group:\n{server.log()}")
    assert server.process.returncode == 0, server.log()
    assert server.checkpoints, f"no final checkpoint; stderr:\n{server.log()}"


def test_client_reconnects_to_a_restarted_server(launch_server: Any) -> None:
    first = launch_server()
    port = first.port
    client = _client(first, reconnect_timeout=60)
    try:
        old = client.start_episode()
        assert client.get_action(old, GOOD) in (0, 1)
        assert first.stop(signal.SIGTERM) == 0, first.log()

        second = launch_server(port=port)
        assert second.port == port
        # An EpisodeLostError (an EpisodeError), raised by the client: nothing is sent.
        with pytest.raises(EpisodeError, match="lost: the server restarted"):
            client.get_action(old, GOOD)
        assert client.reconnects == 1
        result = play_cartpole(client, seed=3)
        assert result.length > 0
        metrics = second.metrics()
        assert metrics["episodes/completed"] == 1
        assert metrics["server/errors"] == 0
    finally:
        client.close()


def test_a_restarted_server_with_other_spaces_gets_its_own_observation_checks(
    launch_server: Any,
) -> None:
    """The client keeps its observation check; a welcome with another space replaces it."""
    first = launch_server()
    port = first.port
    client = _client(first, reconnect_timeout=60)
    try:
        old = client.start_episode()
        assert client.get_action(old, GOOD) in (0, 1)
        assert first.stop(signal.SIGTERM) == 0, first.log()

        launch_server(port=port, spaces=("--spaces-from", "MountainCar-v0"))
        with pytest.raises(EpisodeError, match="lost: the server restarted"):
            client.get_action(old, GOOD)
        episode = client.start_episode()
        with pytest.raises(SpaceError, match=r"shape \(4,\) does not fit Box"):
            client.get_action(episode, GOOD)  # CartPole's observation, MountainCar's server
        assert client.get_action(episode, np.array([-0.5, 0.0], np.float32)) in (0, 1, 2)
    finally:
        client.close()


def test_client_waits_for_a_server_that_comes_back(launch_server: Any) -> None:
    """A call made while the server is down blocks, reconnects when it is back, and answers."""
    first = launch_server()
    port = first.port
    client = _client(first, reconnect_timeout=90)
    outcome: list[Any] = []
    try:
        old = client.start_episode()
        client.get_action(old, GOOD)
        assert first.stop(signal.SIGTERM) == 0, first.log()

        def call() -> None:
            try:
                outcome.append(client.start_episode())
            except BaseException as exc:
                outcome.append(exc)

        caller = threading.Thread(target=call)
        caller.start()
        second = launch_server(port=port)
        caller.join(90)
        assert not caller.is_alive()
        assert len(outcome) == 1 and isinstance(outcome[0], str), outcome
        fresh = outcome[0]
        assert client.get_action(fresh, GOOD) in (0, 1)
        client.end_episode(fresh, GOOD)
        with pytest.raises(EpisodeError, match="is lost: the server restarted"):
            client.get_action(old, GOOD)
        second.wait_until(lambda m: m["episodes/completed"] == 1, what="the new episode")
    finally:
        client.close()


def test_learner_keeps_up_with_steps_sent(launch_server: Any) -> None:
    """Every step handed on reaches the learner once it asks (no step stays queued forever)."""
    server = launch_server("--ppo-train-batch-size", "128", "--ppo-minibatch-size", "64")
    workers = [run_worker(server.address, "episodes", str(50 * i), "4") for i in range(2)]
    for worker in workers:
        assert worker.wait(120) == 0, worker.stderr and worker.stderr.read()
    metrics = server.wait_until(lambda m: m["samples/steps_queued"] == 0, what="the queue to drain")
    assert metrics["samples/steps_sent_to_learner"] == metrics["samples/env_steps"]
