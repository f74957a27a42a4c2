"""Remote inference on a live server: concurrent clients, batches, off-policy steps, metrics."""

from __future__ import annotations

import threading
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from e2e_support import (
    EpisodeResult,
    play_cartpole,
    run_worker,
    samples_total,
    worker_results,
)

from rlserve import EpisodeError, PolicyClient

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def shared_server(module_launcher: Any) -> Any:
    """One server for the tests that only look at differences in the metrics."""
    server = module_launcher("--fragment-length", "8", "--seed", "3")
    server.wait_for_weights()
    return server


def _client(server: Any, name: str = "test") -> PolicyClient:
    return PolicyClient(
        server.address, inference_mode="remote", client_name=name, timeout=30, reconnect_timeout=5
    )


def test_concurrent_clients_metrics_are_exact(launch_server: Any) -> None:
    """Threads and processes play at once; the metrics count exactly the episodes they played."""
    server = launch_server("--seed", "1", "--metrics-interval", "0.2")
    results: list[EpisodeResult] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def play(index: int) -> None:
        try:
            with _client(server, f"thread-{index}") as client:
                mine = [
                    play_cartpole(client, seed=100 * index + k, max_steps=5 if k == 2 else None)
                    for k in range(3)
                ]
            with lock:
                results.extend(mine)
        except BaseException as exc:  # reported below
            errors.append(exc)

    workers = [run_worker(server.address, "episodes", str(1000 + 10 * i), "3") for i in range(2)]
    threads = [threading.Thread(target=play, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    for worker in workers:
        results.extend(worker_results(worker))

    assert len(results) == 18
    assert len({r.episode_id for r in results}) == 18
    assert sum(not r.terminated for r in results) >= 4  # the max_steps=5 episodes
    metrics = server.wait_until(lambda m: m["server/clients"] == 0, what="clients to disconnect")
    assert metrics["episodes/started"] == 18
    assert metrics["episodes/completed"] == 18
    assert metrics["episodes/timed_out"] == 0
    assert metrics["episodes/empty"] == 0
    assert metrics["server/episodes_active"] == 0
    assert metrics["samples/env_steps"] == sum(r.length for r in results)
    assert metrics["episodes/return_mean"] == pytest.approx(
        np.mean([r.episode_return for r in results]), rel=1e-9
    )
    assert metrics["episodes/length_mean"] == pytest.approx(
        np.mean([r.length for r in results]), rel=1e-9
    )
    assert metrics["server/errors"] == 0
    assert metrics["server/mean_inference_batch"] >= 1.0
    assert samples_total(metrics) == sum(r.length for r in results)


def test_every_logged_reward_counts_in_the_return(launch_server: Any) -> None:
    """Rewards from log_returns (buffered or sent with info), get_action and end_episode add up."""
    server = launch_server("--seed", "2")
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=0)
    with _client(server) as client:
        eid = client.start_episode("reward-sum")
        client.get_action(eid, obs)
        client.log_returns(eid, 0.5)
        client.log_returns(eid, 0.25)  # buffered: travels with the next get_action
        client.get_action(eid, obs)
        client.log_returns(eid, 1.0, info={"source": "test"})  # sent at once
        client.log_returns(eid, -0.125)
        client.log_action(eid, obs, 1)
        client.log_returns(eid, 2.0)  # travels with end_episode
        client.end_episode(eid, obs)
    metrics = server.wait_until(lambda m: m["episodes/completed"] == 1, what="the episode")
    assert metrics["episodes/return_mean"] == pytest.approx(0.5 + 0.25 + 1.0 - 0.125 + 2.0)
    assert metrics["episodes/length_mean"] == 3
    assert metrics["samples/env_steps"] == 3


def test_batched_get_action(shared_server: Any) -> None:
    """A list of ids with dict observations gets a dict of actions; stacked arrays get an array."""
    before = shared_server.metrics()
    envs = [gym.make("CartPole-v1") for _ in range(3)]
    observations = {}
    steps = 0
    with _client(shared_server, "batched") as client:
        ids = [client.start_episode() for _ in envs]
        env_of = dict(zip(ids, envs, strict=True))
        for i, eid in enumerate(ids):
            observations[eid], _ = env_of[eid].reset(seed=40 + i)
        active = list(ids)
        turn = 0
        while active:
            if turn % 3 == 0:
                actions = client.get_action(active, {eid: observations[eid] for eid in active})
                assert isinstance(actions, dict)
                assert list(actions) == active
                assert all(type(a) is int and a in (0, 1) for a in actions.values())
            elif turn % 3 == 1:
                stacked = np.stack([observations[eid] for eid in active])
                array = client.get_action(active, stacked)
                assert isinstance(array, np.ndarray)
                assert array.shape == (len(active),)
                assert np.issubdtype(array.dtype, np.integer)
                assert set(array.tolist()) <= {0, 1}
                actions = dict(zip(active, array.tolist(), strict=True))
            else:
                listed = client.get_action(active, [observations[eid].tolist() for eid in active])
                actions = dict(zip(active, np.asarray(listed).tolist(), strict=True))
            turn += 1
            for eid in list(active):
                obs, reward, terminated, truncated, _ = env_of[eid].step(actions[eid])
                observations[eid] = obs
                steps += 1
                client.log_returns(eid, float(reward))
                if terminated or truncated:
                    client.end_episode(eid, obs, truncated=not terminated)
                    active.remove(eid)
    after = shared_server.metrics()
    assert after["episodes/completed"] - before["episodes/completed"] == 3
    assert after["samples/env_steps"] - before["samples/env_steps"] == steps
    assert after["server/errors"] == before["server/errors"]


def test_training_disabled_episodes_never_reach_the_learner(shared_server: Any) -> None:
    before = shared_server.metrics()
    with _client(shared_server, "eval") as client:
        evaluation = [play_cartpole(client, seed=7 + k, training_enabled=False) for k in range(2)]
    middle = shared_server.metrics()
    steps = sum(r.length for r in evaluation)
    assert middle["episodes/completed"] - before["episodes/completed"] == 2
    assert middle["samples/env_steps"] - before["samples/env_steps"] == steps
    assert samples_total(middle) == samples_total(before)

    with _client(shared_server, "train") as client:
        trained = play_cartpole(client, seed=11)
    after = shared_server.metrics()
    assert samples_total(after) - samples_total(middle) == trained.length
    assert after["episodes/completed"] - middle["episodes/completed"] == 1


def test_log_action_off_policy(shared_server: Any) -> None:
    """Actions chosen by the simulator are recorded, counted and sent to the learner."""
    before = shared_server.metrics()
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=5)
    total, steps, on_policy = 0.0, 0, 0
    with _client(shared_server, "off-policy") as client:
        eid = client.start_episode()
        terminated = truncated = False
        while not (terminated or truncated):
            if steps % 4 == 0:
                action = client.get_action(eid, obs)
                on_policy += 1
            else:
                action = int(obs[2] + 0.5 * obs[3] > 0)  # a fair hand-written controller
                client.log_action(eid, obs, action)
            obs, reward, terminated, truncated, _ = env.step(action)
            client.log_returns(eid, float(reward))
            total += float(reward)
            steps += 1
        client.end_episode(eid, obs, truncated=not terminated)
    after = shared_server.metrics()
    assert steps > on_policy > 0
    assert after["samples/env_steps"] - before["samples/env_steps"] == steps
    assert after["episodes/completed"] - before["episodes/completed"] == 1
    assert samples_total(after) - samples_total(before) == steps
    assert after["server/errors"] == before["server/errors"]


def test_end_episode_truncated(shared_server: Any) -> None:
    before = shared_server.metrics()
    with _client(shared_server, "truncating") as client:
        result = play_cartpole(client, seed=21, max_steps=6)
        assert not result.terminated
        with pytest.raises(EpisodeError, match="ended"):
            client.get_action(result.episode_id, np.zeros(4, dtype=np.float32))
        # The connection keeps working after the error.
        follow_up = play_cartpole(client, seed=22, max_steps=3)
    after = shared_server.metrics()
    assert after["episodes/completed"] - before["episodes/completed"] == 2
    assert after["samples/env_steps"] - before["samples/env_steps"] == 6 + 3
    assert samples_total(after) - samples_total(before) == 6 + follow_up.length
