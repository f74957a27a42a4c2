"""The Algorithm's network server: real clients on CartPole feed take(), fairly and durably."""

from __future__ import annotations

import dataclasses
import itertools
import threading
from collections.abc import Iterator
from pathlib import Path

import gymnasium as gym
import httpx
import numpy as np
import pytest

from rlserve import PolicyClient
from rlserve.algorithm.serving import AttachedServer
from rlserve.algorithm.serving_settings import ServingSettings
from rlserve.algorithm.source_queues import client_source, fair_shares, split_fragment
from rlserve.errors import AuthenticationError, ConfigError
from rlserve.learners.ppo import PPOLearner
from rlserve.learners.ppo_config import PPOSettings
from rlserve.policy.weights import WeightsPackage
from rlserve.protocol.fragment import Fragment
from rlserve.run.experience_log import ExperienceLog
from rlserve.run.run_folder import RunFolder
from rlserve.run.state_store import StateStore
from rlserve.server.policies import single_policy

ENV = gym.make("CartPole-v1")
OBS_SPACE, ACT_SPACE = ENV.observation_space, ENV.action_space


@pytest.fixture(scope="module")
def initial() -> WeightsPackage:
    """The initial weights of a real PPO learner (seeded), as the Algorithm publishes them."""
    return PPOLearner(OBS_SPACE, ACT_SPACE, PPOSettings(seed=3, hidden=(16,))).weights()


def versioned(package: WeightsPackage, version: int) -> WeightsPackage:
    return dataclasses.replace(package, version=version)


@pytest.fixture
def run(tmp_path: Path) -> RunFolder:
    return RunFolder.create(str(tmp_path), "run")


def attached(run: RunFolder, **settings: object) -> AttachedServer:
    server = AttachedServer(
        ServingSettings(**settings),  # type: ignore[arg-type]
        single_policy(OBS_SPACE, ACT_SPACE),
        run,
        fragment_length=16,
        seed=1,
    )
    server.start()
    return server


@pytest.fixture
def server(run: RunFolder, initial: WeightsPackage) -> Iterator[AttachedServer]:
    srv = attached(run)
    srv.publish("default", versioned(initial, 1))
    yield srv
    srv.stop()


def play(
    client: PolicyClient, episodes: int, seed: int, max_steps: int = 500
) -> tuple[int, list[str]]:
    """Step CartPole through ``episodes`` episodes (cut at ``max_steps``); steps and ids."""
    env = gym.make("CartPole-v1")
    steps, ids = 0, []
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + i)
        episode_id = client.start_episode()
        ids.append(episode_id)
        for t in range(max_steps):
            action = client.get_action(episode_id, obs)
            obs, reward, terminated, truncated, _ = env.step(action)
            steps += 1
            client.log_returns(episode_id, float(reward))
            if terminated or truncated or t == max_steps - 1:
                client.end_episode(episode_id, obs, truncated=not terminated)
                break
    return steps, ids


def steps_of(fragments: list[Fragment], episode_ids: list[str] | None = None) -> int:
    wanted = None if episode_ids is None else set(episode_ids)
    return sum(len(f) for f in fragments if wanted is None or f.episode_id in wanted)


@pytest.mark.timeout(120)
def test_remote_and_local_clients_feed_take_and_every_step_is_in_the_log(
    server: AttachedServer, run: RunFolder
) -> None:
    remote = PolicyClient(server.address, "remote", client_name="remote")
    local = PolicyClient(server.address, "local", client_name="local", seed=5)
    remote_steps, remote_ids = play(remote, 3, seed=10)
    local_steps, local_ids = play(local, 3, seed=20)
    remote.close()
    local.close()  # ships everything buffered; the reply comes once it is logged and queued

    fragments, summaries = server.take()

    assert steps_of(fragments, remote_ids) == remote_steps
    assert steps_of(fragments, local_ids) == local_steps
    assert steps_of(fragments) == remote_steps + local_steps
    assert sorted(s.episode_id for s in summaries) == sorted(remote_ids + local_ids)
    assert server.steps_by_source == {
        client_source(remote.client_id): remote_steps,
        client_source(local.client_id): local_steps,
    }
    assert server.dropped_steps_by_source == {}
    assert not any(c.client_id in name for c in (remote, local) for name in server.steps_by_source)
    assert all((f.weights_version == 1).all() for f in fragments)
    assert server.take() == ([], [])
    assert server.taken_through == server.server.log.last_seq

    # Durable: everything taken was appended to the experience log first.
    server.stop()
    server.stop()  # idempotent
    log = ExperienceLog(run.path / "experience")
    records = log.open()
    log.close()
    logged = [Fragment.from_wire(raw) for record in records for raw in record.fragments()]
    assert sum(r.steps for r in records) == remote_steps + local_steps
    key = lambda f: (f.episode_id, f.rewards.tobytes(), f.obs.tobytes())  # noqa: E731
    assert sorted(map(key, logged)) == sorted(map(key, fragments))
    assert {r.kind for r in records} == {"fragments", "report"}


@pytest.mark.timeout(120)
def test_published_weights_act_for_remote_clients_and_reach_local_ones(
    server: AttachedServer, run: RunFolder, initial: WeightsPackage
) -> None:
    remote = PolicyClient(server.address, "remote")
    local = PolicyClient(server.address, "local", update_interval=None, seed=2)
    _, first = play(remote, 1, seed=0)
    play(local, 1, seed=1)
    assert local.weights_version == 1

    newer = versioned(initial, 2)
    newer.arrays = {k: v * 0.5 for k, v in initial.arrays.items()}
    server.publish("default", newer)

    _, second = play(remote, 1, seed=2)
    local.update_policy_weights()
    assert local.weights_version == 2
    _, local_second = play(local, 1, seed=3)
    remote.close()
    local.close()

    fragments, _ = server.take()
    by_episode: dict[str, set[int]] = {}
    for f in fragments:
        by_episode.setdefault(f.episode_id, set()).update(f.weights_version.tolist())
    assert by_episode[first[0]] == {1}
    assert by_episode[second[0]] == {2}
    assert by_episode[local_second[0]] == {2}
    assert server.stats.policy_versions["default"] == 2
    stored = StateStore(run.path, {"default": run.path / "weights" / "policy.npz"})
    package = stored.load_weights("default")
    assert package is not None and package.version == 2
    np.testing.assert_array_equal(
        next(iter(package.arrays.values())), next(iter(newer.arrays.values()))
    )
    with pytest.raises(KeyError, match="unknown policy"):
        server.publish("other", newer)


@pytest.mark.timeout(120)
def test_remote_clients_wait_for_the_first_weights(run: RunFolder, initial: WeightsPackage) -> None:
    server = attached(run)
    try:
        client = PolicyClient(server.address, "remote")
        episode_id = client.start_episode()
        obs, _ = gym.make("CartPole-v1").reset(seed=0)
        actions: list[int] = []
        waiter = threading.Thread(target=lambda: actions.append(client.get_action(episode_id, obs)))
        waiter.start()
        server.publish("default", versioned(initial, 1))
        waiter.join(60)
        assert actions and actions[0] in (0, 1)
        client.close()
    finally:
        server.stop()


@pytest.mark.timeout(120)
def test_a_fast_client_cannot_crowd_a_slow_one_out_of_a_take(server: AttachedServer) -> None:
    fast = PolicyClient(server.address, "remote", client_name="fast")
    slow = PolicyClient(server.address, "local", client_name="slow", seed=4)
    fast_steps, fast_ids = play(fast, 12, seed=100)
    slow_steps, slow_ids = play(slow, 1, seed=200, max_steps=10)
    fast.close()
    slow.close()
    assert fast_steps > 60 and slow_steps == 10

    fragments, _ = server.take(max_steps=16)
    # Max-min fair: the slow source's 10 steps do not fit in its share of 8, so each gets 8.
    assert steps_of(fragments, fast_ids) == 8
    assert steps_of(fragments, slow_ids) == 8
    assert server.queued_steps_by_source == {
        client_source(fast.client_id): fast_steps - 8,
        client_source(slow.client_id): 2,
    }

    fragments2, _ = server.take(max_steps=30)
    assert steps_of(fragments2, slow_ids) == 2  # what it has left; the fast one gets the rest
    assert steps_of(fragments2, fast_ids) == 28

    rest, _ = server.take()
    everything = fragments + fragments2 + rest
    assert steps_of(everything, fast_ids) == fast_steps
    assert steps_of(everything, slow_ids) == slow_steps
    # Cut fragments fit together again: each episode's pieces chain observation to observation.
    for episode_id in fast_ids + slow_ids:
        pieces = [f for f in everything if f.episode_id == episode_id]
        for a, b in itertools.pairwise(pieces):
            np.testing.assert_array_equal(a.obs[-1], b.obs[0])
        assert pieces[-1].terminated or pieces[-1].truncated
        assert not any(p.terminated or p.truncated for p in pieces[:-1])


@pytest.mark.timeout(120)
def test_a_full_source_drops_only_its_own_oldest_steps(
    run: RunFolder, initial: WeightsPackage
) -> None:
    server = attached(run, max_queued_steps_per_source=50)
    try:
        server.publish("default", versioned(initial, 1))
        fast = PolicyClient(server.address, "remote", client_name="fast")
        slow = PolicyClient(server.address, "remote", client_name="slow")
        slow_steps, slow_ids = play(slow, 1, seed=7, max_steps=10)
        fast_steps, fast_ids = play(fast, 10, seed=300)
        fast.close()
        slow.close()
        assert fast_steps > 50
        fast_key, slow_key = client_source(fast.client_id), client_source(slow.client_id)
        assert server.dropped_steps_by_source == {fast_key: fast_steps - 50}
        assert server.steps_by_source == {fast_key: fast_steps, slow_key: slow_steps}

        fragments, summaries = server.take()
        assert steps_of(fragments, slow_ids) == slow_steps
        assert steps_of(fragments, fast_ids) == 50
        # The newest were kept: the last fast episode ends the queue.
        assert any(f.episode_id == fast_ids[-1] and f.terminated for f in fragments)
        assert len(summaries) == 11  # summaries are never dropped
        assert server.stats.steps_dropped_queue_full == fast_steps - 50
    finally:
        server.stop()


@pytest.mark.timeout(60)
def test_binding_beyond_loopback_needs_a_token(run: RunFolder, initial: WeightsPackage) -> None:
    with pytest.raises(ConfigError, match="token"):
        ServingSettings(host="0.0.0.0")
    assert ServingSettings(host="0.0.0.0", token="s3cret").server_config(16, 0).token == "s3cret"
    with pytest.raises(ConfigError, match="max_connections"):
        ServingSettings(server={"max_connections": 0})
    with pytest.raises(ConfigError, match="not a further ServerConfig field"):
        ServingSettings(server={"port": 1})

    server = attached(run, token="s3cret")
    try:
        server.publish("default", versioned(initial, 1))
        with pytest.raises(AuthenticationError):
            PolicyClient(server.address, "remote", reconnect_timeout=0.5)
        client = PolicyClient(server.address, "remote", token="s3cret")
        steps, _ = play(client, 1, seed=0)
        client.close()
        assert steps_of(server.take()[0]) == steps
    finally:
        server.stop()


def test_fair_shares_are_max_min_fair() -> None:
    assert fair_shares({"a": 100, "b": 3}, 10) == {"a": 7, "b": 3}
    assert fair_shares({"a": 100, "b": 100}, 10) == {"a": 5, "b": 5}
    assert fair_shares({"a": 4, "b": 4}, 100) == {"a": 4, "b": 4}
    assert fair_shares({"a": 9, "b": 9, "c": 1}, 6) == {"a": 3, "b": 2, "c": 1}
    assert fair_shares({"a": 9, "b": 9, "c": 1}, 6, first=1) == {"a": 2, "b": 3, "c": 1}
    assert fair_shares({"a": 5}, 0) == {"a": 0}


def test_split_fragment_keeps_the_steps_and_the_flags_at_the_end() -> None:
    steps = 5
    fragment = Fragment(
        episode_id="e",
        agent_id="agent0",
        policy_id="default",
        obs=np.arange((steps + 1) * 2, dtype=np.float32).reshape(steps + 1, 2),
        actions=np.arange(steps),
        rewards=np.ones(steps, np.float32),
        behaviour_logp=np.zeros(steps, np.float32),
        policy_chosen=np.ones(steps, bool),
        weights_version=np.full(steps, 3),
        terminated=True,
        truncated=False,
        infos=[None, {"k": 1}, None, None, None],
    )
    head, tail = split_fragment(fragment, 2)
    assert (len(head), len(tail)) == (2, 3)
    np.testing.assert_array_equal(head.obs[-1], tail.obs[0])
    assert not head.terminated and tail.terminated
    assert head.infos == [None, {"k": 1}] and tail.infos == [None, None, None]
    with pytest.raises(ValueError):
        split_fragment(fragment, 5)


@pytest.mark.timeout(120)
def test_a_server_that_cannot_listen_raises_from_start(
    server: AttachedServer, tmp_path: Path
) -> None:
    port = int(server.address.rsplit(":", 1)[1])
    other = AttachedServer(
        ServingSettings(port=port),
        single_policy(OBS_SPACE, ACT_SPACE),
        RunFolder.create(str(tmp_path), "other"),
    )
    with pytest.raises(OSError):
        other.start()
    other.stop()  # nothing left running; harmless


@pytest.mark.timeout(120)
def test_health_and_log_release(run: RunFolder, initial: WeightsPackage) -> None:
    server = AttachedServer(
        ServingSettings(), single_policy(OBS_SPACE, ACT_SPACE), run, fragment_length=8
    )
    server.server.log.segment_bytes = 2048  # a few records per segment
    server.start()
    try:
        server.publish("default", versioned(initial, 1))
        health = httpx.get(f"http://{server.address}/v1/health", timeout=30).json()
        assert health["status"] == "ok"
        client = PolicyClient(server.address, "remote")
        play(client, 5, seed=0)
        client.close()
        segments = lambda: sorted((run.path / "experience").iterdir())  # noqa: E731
        before = len(segments())
        assert before > 2
        assert server.taken_through == 0  # nothing taken yet: nothing may be released
        server.release_log(server.server.log.last_seq)
        assert len(segments()) == before
        server.take()
        server.release_log(server.taken_through)
        assert len(segments()) == 1  # only the newest (open) segment is left
    finally:
        server.stop()


@pytest.mark.timeout(120)
def test_with_sync_reports_a_report_is_answered_once_fsynced(
    run: RunFolder, initial: WeightsPackage
) -> None:
    server = attached(run, sync_reports=True)
    try:
        server.publish("default", versioned(initial, 1))
        client = PolicyClient(server.address, "local", seed=9)
        steps, ids = play(client, 2, seed=0)
        client.close()  # returns once every batch was answered
        assert server.server.log.synced_seq == server.server.log.last_seq
        fragments, summaries = server.take()
        assert steps_of(fragments, ids) == steps
        assert len(summaries) == 2
    finally:
        server.stop()
