"""A policy with memory served by the real server on 127.0.0.1: remote and local clients.

Remote mode: the server carries each episode's recurrent state (per episode, from zeros, logged
steps included) and the fragments it cuts carry the state at their start. Local mode: the client
carries it and reports it as ``state_in``. The policy is hand-made (no learner): an LSTM with
large actor weights, so its sampled action is its greedy one and can be compared with
NumpyPolicy's own run over the same observations.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from memory_policies import greedy_run, memory_package, memory_policy, replay
from rlserve import EpisodeLostError, PolicyClient
from rlserve.algorithm.serving import AttachedServer
from rlserve.algorithm.serving_settings import ServingSettings
from rlserve.protocol.fragment import Fragment
from rlserve.run.run_folder import RunFolder
from rlserve.server.policies import single_policy

OBS = gym.spaces.Box(-2.0, 2.0, (4,), np.float32)
SCALE = 40.0


@pytest.fixture
def server(tmp_path: Path) -> Iterator[AttachedServer]:
    run = RunFolder.create(str(tmp_path), "run")
    srv = AttachedServer(
        ServingSettings(), single_policy(OBS, gym.spaces.Discrete(2)), run, fragment_length=4
    )
    srv.start()
    srv.publish("default", memory_package(scale=SCALE))
    yield srv
    srv.stop()


def _play(client: PolicyClient, seed: int) -> dict[str, list[int | None]]:
    """Two interleaved episodes (one logs two actions), then a third; the actions answered."""
    rng = np.random.default_rng(seed)
    obs = {e: rng.uniform(-2, 2, (11, 4)).astype(np.float32) for e in "abc"}
    ids = {e: client.start_episode() for e in "ab"}
    answered: dict[str, list[int | None]] = {e: [] for e in "abc"}
    for t in range(10):
        for e in "ab":
            if e == "b" and t in (3, 4):
                client.log_action(ids[e], obs[e][t], 1)
                answered[e].append(None)
            else:
                answered[e].append(int(client.get_action(ids[e], obs[e][t])))
            client.log_returns(ids[e], 1.0)
    for e in "ab":
        client.end_episode(ids[e], obs[e][10], truncated=True)
    ids["c"] = client.start_episode()
    for t in range(6):
        answered["c"].append(int(client.get_action(ids["c"], obs["c"][t])))
    client.end_episode(ids["c"], obs["c"][6], truncated=False)
    policy = memory_policy(scale=SCALE)
    sure = 0
    for e in "abc":  # as NumpyPolicy's own run over the episode, from zeros
        expected, _, probs = greedy_run(policy, obs[e][: len(answered[e])])
        for t, got in enumerate(answered[e]):
            if got is not None and probs[t] > 0.999:  # else it may sample the other
                assert got == expected[t], (e, t)
                sure += 1
    assert sure >= 12
    return answered


def _check_fragments(fragments: list[Fragment], episodes: int, lengths: set[int]) -> None:
    """Each episode's fragments chain: zeros first, each next from where the last ended."""
    policy = memory_policy(scale=SCALE)
    chains: dict[str, list[Fragment]] = defaultdict(list)
    for fragment in fragments:
        chains[fragment.episode_id].append(fragment)
    assert len(chains) == episodes
    assert {sum(len(f) for f in chain) for chain in chains.values()} == lengths
    for chain in chains.values():
        assert chain[0].state_in is not None and not chain[0].state_in.any()
        for before, after in itertools.pairwise(chain):
            assert after.state_in is not None and after.state_in.any()
            np.testing.assert_allclose(replay(policy, before), after.state_in, atol=1e-5)
        replay(policy, chain[-1])


@pytest.mark.timeout(120)
def test_a_remote_client_acts_with_the_state_the_server_carries_per_episode(
    server: AttachedServer,
) -> None:
    with PolicyClient(server.address, "remote") as client:
        _play(client, seed=1)
    fragments, _ = server.take()
    logged = [f for f in fragments if not f.policy_chosen.all()]
    assert len({f.episode_id for f in logged}) == 1  # steps 3 and 4 of one episode, logged
    assert sum(int((~f.policy_chosen).sum()) for f in logged) == 2
    _check_fragments(fragments, 3, {10, 6})


@pytest.mark.timeout(120)
def test_a_local_client_carries_the_state_and_reports_state_in(server: AttachedServer) -> None:
    with PolicyClient(server.address, "local", seed=3) as client:
        _play(client, seed=2)
    # Closed: everything it collected was shipped.
    fragments, _ = server.take()
    assert all(f.state_in is not None for f in fragments)
    _check_fragments(fragments, 3, {10, 6})


@pytest.mark.timeout(180)
def test_after_a_restart_a_remote_episode_is_lost_and_a_local_one_carries_on(
    tmp_path: Path,
) -> None:
    run = RunFolder.create(str(tmp_path), "run")
    spaces = single_policy(OBS, gym.spaces.Discrete(2))
    first = AttachedServer(ServingSettings(), spaces, run, fragment_length=4)
    first.start()
    first.publish("default", memory_package(scale=SCALE))
    obs = np.random.default_rng(7).uniform(-2, 2, (14, 4)).astype(np.float32)
    taken: list[Fragment] = []
    remote = PolicyClient(first.address, "remote", reconnect_timeout=60)
    local = PolicyClient(first.address, "local", seed=4, reconnect_timeout=60)
    second: AttachedServer | None = None
    try:
        lost, kept = remote.start_episode(), local.start_episode()
        for t in range(6):
            remote.get_action(lost, obs[t])
            local.get_action(kept, obs[t])
        first.stop()  # the server's memory of the remote episode (and its state) is gone
        taken += first.take()[0]
        second = AttachedServer(
            ServingSettings(port=first.server.port), spaces, run, fragment_length=4, resume=True
        )
        second.start()
        second.publish("default", memory_package(version=2, scale=SCALE))
        with pytest.raises(EpisodeLostError, match="lost: the server restarted"):
            remote.get_action(lost, obs[6])
        for t in range(6, 13):  # the local client's episode carries its state on
            local.get_action(kept, obs[t])
        local.end_episode(kept, obs[13], truncated=True)
        fresh = remote.start_episode()  # a new remote episode starts from zeros
        for t in range(5):
            remote.get_action(fresh, obs[t])
        remote.end_episode(fresh, obs[5], truncated=True)
        local.close()
        remote.close()
        taken += second.take()[0]
    finally:
        for client in (local, remote):
            client.close()
        first.stop()
        if second is not None:
            second.stop()
    mine = [f for f in taken if f.episode_id in (kept, fresh)]
    _check_fragments(mine, 2, {13, 5})
