"""The per-episode paths of a policy with memory: the collector (hosted episodes, local clients).

Each episode (each agent) carries its own recurrent state from zeros; logged steps advance it;
every fragment carries the state its first step read (checked by replaying it).
"""

from __future__ import annotations

import itertools
from collections import defaultdict

import gymnasium as gym
import numpy as np

from memory_policies import greedy_run, memory_policy, replay
from rlserve.algorithm.sources import policy_table
from rlserve.experience.collector import Collector
from rlserve.protocol.fragment import Fragment
from rlserve.server.policies import PolicySpec

OBS = gym.spaces.Box(-2.0, 2.0, (4,), np.float32)


def _collector(fragment_length: int) -> tuple[Collector, list[Fragment]]:
    specs = {"default": PolicySpec("default", OBS, gym.spaces.Discrete(2))}
    fragments: list[Fragment] = []
    collector = Collector(
        policy_table(specs, None),
        {"default": memory_policy()},
        fragment_length,
        16,
        fragments.append,
        lambda summary: None,
    )
    collector.explore = False  # greedy: the actions are a function of the state alone
    return collector, fragments


def _check_chains(fragments: list[Fragment], episodes: int) -> None:
    """Per episode: the first fragment starts from zeros, each next from where the last ended."""
    policy = memory_policy()
    by_episode: dict[tuple[str, str], list[Fragment]] = defaultdict(list)
    for fragment in fragments:
        by_episode[(fragment.episode_id, fragment.agent_id)].append(fragment)
    assert len(by_episode) == episodes
    for chain in by_episode.values():
        assert chain[0].state_in is not None and not chain[0].state_in.any()
        for before, after in itertools.pairwise(chain):
            assert after.state_in is not None
            np.testing.assert_allclose(replay(policy, before), after.state_in, atol=1e-5)
        replay(policy, chain[-1])


def test_interleaved_episodes_keep_their_own_state_and_logged_steps_advance_it() -> None:
    collector, fragments = _collector(fragment_length=3)
    rng = np.random.default_rng(1)
    obs = {e: rng.uniform(-2, 2, (9, 4)).astype(np.float32) for e in "abc"}
    reference = {e: greedy_run(memory_policy(), obs[e])[0] for e in "abc"}
    for e in "ab":
        collector.start_episode(e, True)
    for t in range(8):
        for e in "ab":
            if e == "b" and t in (2, 5):
                collector.log_action(e, obs[e][t], 1 - reference[e][t])
            else:
                assert collector.get_one_action(e, obs[e][t]) == reference[e][t], (e, t)
            collector.log_returns(e, 1.0)
    for e in "ab":
        collector.end_episode(e, obs[e][8], truncated=True)
    collector.start_episode("c", True)  # a new episode starts from zeros
    for t in range(4):
        assert collector.get_one_action("c", obs["c"][t]) == reference["c"][t]
    collector.end_episode("c", obs["c"][4], truncated=False)
    logged = [f for f in fragments if not f.policy_chosen.all()]
    assert logged and all(f.episode_id == "b" for f in logged)
    _check_chains(fragments, 3)


def test_a_batched_get_action_carries_each_episodes_state() -> None:
    collector, fragments = _collector(fragment_length=4)
    rng = np.random.default_rng(2)
    obs = rng.uniform(-2, 2, (10, 2, 4)).astype(np.float32)
    reference = [greedy_run(memory_policy(), obs[:, i])[0] for i in range(2)]
    collector.start_episode("x", True)
    collector.start_episode("y", True)
    for t in range(9):
        actions = collector.get_action(["x", "y"], obs[t])
        assert actions.tolist() == [reference[0][t], reference[1][t]]
        collector.log_returns_many(["x", "y"], [0.5, 0.5])
    collector.end_episode("x", obs[9, 0], truncated=True)
    collector.end_episode("y", obs[9, 1], truncated=True)
    _check_chains(fragments, 2)


def test_each_agent_of_a_multi_agent_episode_has_its_own_state() -> None:
    collector, fragments = _collector(fragment_length=3)
    rng = np.random.default_rng(3)
    obs = rng.uniform(-2, 2, (8, 2, 4)).astype(np.float32)
    reference = [greedy_run(memory_policy(), obs[:, i])[0] for i in range(2)]
    collector.start_episode("m", True)
    for t in range(7):
        step = {"p": obs[t, 0], "q": obs[t, 1]}
        if t == 3:
            collector.log_agent_actions("m", step, {"p": 0, "q": 1})
        else:
            got = collector.get_agent_actions("m", step)
            assert got == {"p": reference[0][t], "q": reference[1][t]}, t
        collector.log_agent_returns("m", {"p": 1.0, "q": 0.0}, {}, {})
    collector.end_agent_episode("m", {"p": obs[7, 0], "q": obs[7, 1]}, truncated=True)
    assert {f.agent_id for f in fragments} == {"p", "q"}
    _check_chains(fragments, 2)


def test_without_memory_episode_fragments_have_no_state_in() -> None:
    from rlserve.policy import ModelSpec, NumpyPolicy

    spec = ModelSpec(4, ("l0",), "tanh", "categorical", 2)
    arrays = {"l0.weight": np.ones((2, 4), np.float32), "l0.bias": np.zeros(2, np.float32)}
    specs = {"default": PolicySpec("default", OBS, gym.spaces.Discrete(2))}
    fragments: list[Fragment] = []
    collector = Collector(
        policy_table(specs, None),
        {"default": NumpyPolicy(spec, arrays, 0)},
        2,
        4,
        fragments.append,
        lambda summary: None,
    )
    collector.start_episode("e", True)
    for _ in range(3):
        collector.get_one_action("e", np.zeros(4, np.float32))
    collector.end_episode("e", np.zeros(4, np.float32), truncated=False)
    assert len(fragments) == 2 and all(f.state_in is None for f in fragments)
    assert collector.table._active == {}


def test_agents_joining_later_start_from_zeros_and_keep_the_others_states() -> None:
    collector, fragments = _collector(fragment_length=2)
    rng = np.random.default_rng(6)
    names = ["a0", "a1", "a2", "a3", "a4", "a5"]  # more than the columns' first rows
    obs = rng.uniform(-2, 2, (6, len(names), 4)).astype(np.float32)
    collector.start_episode("m", True)
    for t in range(5):
        present = names[:2] if t < 2 else names  # four agents join at the third tick
        step = {a: obs[t, names.index(a)] for a in present}
        collector.get_agent_actions("m", step)
        collector.log_agent_returns("m", dict.fromkeys(present, 0.5), {}, {})
    collector.end_agent_episode("m", {a: obs[5, i] for i, a in enumerate(names)}, True)
    _check_chains(fragments, len(names))
