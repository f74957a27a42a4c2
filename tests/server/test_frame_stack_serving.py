"""frame_stack served by the real server on 127.0.0.1: clients send single frames.

Remote mode: the server stacks each episode's frames (the first frame copied into every slot,
logged steps included) and acts on the stack. Local mode: the client stacks. Either way the
actions are NumpyPolicy's on the stacks rlserve.env.FrameStacker builds from the same frames,
and the fragments hold those stacks. The policy is a hand-made conv net with large actor weights,
so its sampled action is its greedy one.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from rlserve import PolicyClient
from rlserve.algorithm.serving import AttachedServer
from rlserve.algorithm.serving_settings import ServingSettings
from rlserve.env import FrameStacker
from rlserve.errors import RLServeError
from rlserve.policy import ModelSpec, NumpyPolicy
from rlserve.policy.encoder_choice import choose_encoder
from rlserve.policy.weights import WeightsPackage
from rlserve.run.run_folder import RunFolder
from rlserve.server.policies import single_policy

FRAME = gym.spaces.Box(0, 255, (6, 6, 1), np.uint8)
FRAMES = 2


def _package() -> WeightsPackage:
    """A conv net over two stacked 6x6 frames: 4 filters of 2x2, stride 2, then two logits."""
    stacked = FrameStacker(FRAME, FRAMES).space
    encoder = choose_encoder(stacked, conv_filters=[[4, 2, 2]])
    spec = ModelSpec(72, ("actor.0",), "relu", "categorical", 2, encoder=encoder)
    rng = np.random.default_rng(0)
    arrays = {
        "encoder.0.0.weight": rng.normal(0, 1.0, (4, FRAMES, 2, 2)),
        "encoder.0.0.bias": np.zeros(4),
        "actor.0.weight": rng.normal(0, 40.0, (2, 36)),
        "actor.0.bias": np.zeros(2),
    }
    return WeightsPackage(1, spec, {k: v.astype(np.float32) for k, v in arrays.items()})


@pytest.fixture
def server(tmp_path: Path) -> Iterator[AttachedServer]:
    run = RunFolder.create(str(tmp_path), "run")
    srv = AttachedServer(
        ServingSettings(),
        single_policy(FRAME, gym.spaces.Discrete(2)),
        run,
        fragment_length=4,
        frame_stacks={"default": FRAMES},
    )
    srv.start()
    srv.publish("default", _package())
    yield srv
    srv.stop()


def _frames(rng: np.random.Generator, count: int) -> np.ndarray:
    return (rng.random((count, 6, 6, 1)) < 0.3).astype(np.uint8) * 255


def _play(client: PolicyClient, seed: int) -> dict[str, np.ndarray]:
    """Two interleaved episodes (one logs an action), then a third; the stacks each one saw."""
    rng = np.random.default_rng(seed)
    frames = {e: _frames(rng, 9) for e in "abc"}
    package = _package()
    policy = NumpyPolicy(package.spec, package.arrays, 1)
    stackers = {e: FrameStacker(FRAME, FRAMES) for e in "abc"}
    stacks: dict[str, list[np.ndarray]] = defaultdict(list)
    sure = 0

    def step(e: str, episode: str, t: int, log: bool = False) -> None:
        nonlocal sure
        stacker = stackers[e]
        stack = stacker.reset(frames[e][t]) if t == 0 else stacker.push(frames[e][t])
        stacks[e].append(stack)
        if log:
            client.log_action(episode, frames[e][t], 1)
            return
        got = int(client.get_action(episode, frames[e][t]))
        out = policy.compute_actions(stack.reshape(1, -1).astype(np.float32), False)
        if np.exp(out.logp[0]) > 0.999:  # else it may sample the other
            assert got == int(out.actions[0]), (e, t)
            sure += 1

    ids = {e: client.start_episode() for e in "ab"}
    for t in range(8):
        for e in "ab":
            step(e, ids[e], t, log=e == "b" and t == 3)
            client.log_returns(ids[e], 1.0)
    for e in "ab":
        stacks[e].append(stackers[e].push(frames[e][8]))
        client.end_episode(ids[e], frames[e][8], truncated=True)
    ids["c"] = client.start_episode()
    for t in range(5):
        step("c", ids["c"], t)
    stacks["c"].append(stackers["c"].push(frames["c"][5]))
    client.end_episode(ids["c"], frames["c"][5], truncated=False)
    assert sure >= 15
    return {e: np.stack(s).reshape(len(s), -1).astype(np.float32) for e, s in stacks.items()}


def _check_fragments(server: AttachedServer, stacks: dict[str, np.ndarray]) -> None:
    """Each episode's fragments hold the stacks, in order, ending in its final stack."""
    fragments, _ = server.take()
    chains: dict[str, list[np.ndarray]] = defaultdict(list)
    for fragment in fragments:
        chains[fragment.episode_id].append(fragment.obs)
    seen = []
    for chain in chains.values():
        # A fragment ends in the next one's first observation: drop each but the last's last.
        rows = np.concatenate([obs[:-1] for obs in chain[:-1]] + [chain[-1]])
        seen.append(rows)
    assert sorted(len(r) for r in seen) == sorted(len(s) for s in stacks.values())
    for expected in stacks.values():
        assert any(r.shape == expected.shape and np.array_equal(r, expected) for r in seen)


@pytest.mark.timeout(120)
def test_a_remote_client_sends_frames_and_the_server_acts_on_their_stack(
    server: AttachedServer,
) -> None:
    with PolicyClient(server.address, "remote") as client:
        assert client.observation_space == FRAME  # the per-frame space, checked client-side
        stacks = _play(client, seed=1)
        episode = client.start_episode()
        with pytest.raises(RLServeError):  # a stack is not a frame
            client.get_action(episode, stacks["a"][0].reshape(6, 6, 2).astype(np.uint8))
    _check_fragments(server, stacks)


@pytest.mark.timeout(120)
def test_a_local_client_stacks_its_frames_itself(server: AttachedServer) -> None:
    with PolicyClient(server.address, "local", seed=3) as client:
        stacks = _play(client, seed=2)
    _check_fragments(server, stacks)


def _play_agents(client: PolicyClient, seed: int) -> dict[str, np.ndarray]:
    """Two agents of one episode, in turns and together (p2 joins at the second turn, p1 logs
    one action); the stacks each agent saw, its final one included."""
    rng = np.random.default_rng(seed)
    frames = {agent: _frames(rng, 9) for agent in ("p1", "p2")}
    package = _package()
    policy = NumpyPolicy(package.spec, package.arrays, 1)
    stackers = {agent: FrameStacker(FRAME, FRAMES) for agent in frames}
    stacks: dict[str, list[np.ndarray]] = defaultdict(list)
    seen = {agent: 0 for agent in frames}
    sure = 0

    def observe(agent: str) -> np.ndarray:
        frame = frames[agent][seen[agent]]
        stacker = stackers[agent]
        stack = stacker.reset(frame) if seen[agent] == 0 else stacker.push(frame)
        stacks[agent].append(stack)
        seen[agent] += 1
        return frame

    episode = client.start_episode()
    for turn in range(7):
        acting = ["p1", "p2"] if turn % 3 == 2 else [("p1", "p2")[turn % 2]]
        observation = {agent: observe(agent) for agent in acting}
        if turn == 4:
            client.log_action(episode, observation, dict.fromkeys(acting, 1))
            continue
        got = client.get_action(episode, observation)
        for agent in acting:
            stack = stacks[agent][-1].reshape(1, -1).astype(np.float32)
            out = policy.compute_actions(stack, False)
            if np.exp(out.logp[0]) > 0.999:  # else it may sample the other
                assert int(got[agent]) == int(out.actions[0]), (agent, turn)
                sure += 1
    client.end_episode(episode, {agent: observe(agent) for agent in frames}, truncated=True)
    assert sure >= 6
    return {a: np.stack(s).reshape(len(s), -1).astype(np.float32) for a, s in stacks.items()}


def _check_agent_fragments(server: AttachedServer, stacks: dict[str, np.ndarray]) -> None:
    """Each fragment holds consecutive stacks of one agent, and they cover every agent's steps.

    (A local client's report names no agent: its fragments are matched by their stacks.)
    """
    fragments, _ = server.take()
    steps = dict.fromkeys(stacks, 0)
    for fragment in fragments:
        owners = [
            agent
            for agent, rows in stacks.items()
            for start in range(len(rows) - len(fragment.obs) + 1)
            if np.array_equal(rows[start : start + len(fragment.obs)], fragment.obs)
        ]
        assert len(owners) == 1, (fragment.agent_id, owners)
        steps[owners[0]] += len(fragment)
    assert steps == {agent: len(rows) - 1 for agent, rows in stacks.items()}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["remote", "local"])
def test_each_agent_of_a_multi_agent_episode_is_acted_on_its_own_stack(
    server: AttachedServer, mode: str
) -> None:
    with PolicyClient(server.address, mode, seed=4, multiagent=True) as client:
        stacks = _play_agents(client, seed=5)
    _check_agent_fragments(server, stacks)
