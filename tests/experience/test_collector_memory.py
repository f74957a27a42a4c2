"""The hosted vector path with a policy with memory: per-copy state, reset per episode, state_in."""

from __future__ import annotations

import itertools
from collections import defaultdict

import numpy as np
import pytest

from rlserve.algorithm.sources import policy_table
from rlserve.env import InProcessVectorSource
from rlserve.env.runner import EnvRunner
from rlserve.experience.collector import Collector
from rlserve.experience.episode_records import EpisodeSummary
from rlserve.experience.vector_rollout import VectorRollout
from rlserve.policy import LSTMMemory, ModelSpec, NumpyPolicy
from rlserve.protocol.fragment import Fragment
from rlserve.server.policies import PolicySpec

CELLS = 3


def _memory_policy(seed: int = 0) -> NumpyPolicy:
    """A hand-made recurrent CartPole policy: 4 values -> LSTM of 3 cells -> 2 logits."""
    rng = np.random.default_rng(seed)
    spec = ModelSpec(4, ("actor.0",), "tanh", "categorical", 2, memory=LSTMMemory(CELLS, 4))
    arrays = {
        "memory.weight_ih": rng.normal(0, 0.8, (4 * CELLS, 4)),
        "memory.weight_hh": rng.normal(0, 0.8, (4 * CELLS, CELLS)),
        "memory.bias": rng.normal(0, 0.3, 4 * CELLS),
        "actor.0.weight": rng.normal(0, 1.0, (2, CELLS)),
        "actor.0.bias": np.zeros(2),
    }
    return NumpyPolicy(spec, {k: v.astype(np.float32) for k, v in arrays.items()}, 5, seed=seed)


def _run(fragment_length: int, steps: int) -> tuple[list[Fragment], list[EpisodeSummary]]:
    source = InProcessVectorSource("CartPole-v1", None, num_envs=3, seed=1)
    specs = {"default": PolicySpec("default", source.observation_space, source.action_space)}
    fragments: list[Fragment] = []
    summaries: list[EpisodeSummary] = []
    collector = Collector(
        policy_table(specs, None),
        {"default": _memory_policy()},
        fragment_length,
        64,
        fragments.append,
        summaries.append,
    )
    runner = EnvRunner(source, collector)
    runner.sample(steps)
    runner.cut()
    source.close()
    return fragments, summaries


def _replay(policy: NumpyPolicy, fragment: Fragment) -> np.ndarray:
    """Run the policy over the fragment's acting steps from its state_in; the state after."""
    assert fragment.state_in is not None
    state = fragment.state_in[None, :]
    for t in range(len(fragment)):
        obs = fragment.obs[t : t + 1]
        logp = policy.log_prob(obs, fragment.actions[t : t + 1], state)
        # The logged behaviour log-probability was computed from this very state.
        np.testing.assert_allclose(logp[0], fragment.behaviour_logp[t], rtol=1e-5, atol=1e-5)
        _, state = policy.recurrent_forward(obs, state)
    return state[0]


@pytest.mark.timeout(60)
def test_fragments_carry_the_state_at_their_start_and_episodes_start_from_zeros() -> None:
    fragments, summaries = _run(fragment_length=7, steps=450)
    policy = _memory_policy()
    by_episode: dict[str, list[Fragment]] = defaultdict(list)
    for fragment in fragments:
        assert fragment.state_in is not None and fragment.state_in.shape == (2 * CELLS,)
        assert fragment.state_in.dtype == np.float32
        by_episode[fragment.episode_id].append(fragment)
    ended = [e for e in by_episode.values() if e[-1].terminated or e[-1].truncated]
    assert len(ended) >= 10 and len(summaries) >= 10  # episodes ended and copies reset
    cut_mid_episode = 0
    for episode in by_episode.values():
        assert not episode[0].state_in.any()  # type: ignore[union-attr]  # zeros at the start
        for before, after in itertools.pairwise(episode):
            np.testing.assert_array_equal(before.obs[-1], after.obs[0])
            np.testing.assert_allclose(_replay(policy, before), after.state_in, atol=1e-5)
            assert after.state_in is not None and after.state_in.any()
            cut_mid_episode += 1
        _replay(policy, episode[-1])
    assert cut_mid_episode >= 20


def test_an_abandoned_copy_starts_its_next_episode_from_zeros() -> None:
    got: list[Fragment] = []
    rollout = VectorRollout(2, 4, "p", True, got.append, lambda s: None, state_size=4)
    assert rollout.state is not None and not rollout.state.any()
    obs = np.zeros((2, 3), np.float32)
    states = [np.full((2, 4), float(k + 1), np.float32) for k in range(3)]
    for k in range(3):
        rollout.record(obs + k, np.zeros(2, np.int64), np.zeros(2, np.float32), 0, states[k])
        rollout.rewards(np.zeros(2), {})
    rollout.abandon(0, "failed")  # drops copy 0's last step; its next episode reads zeros
    assert not rollout.state[0].any() and (rollout.state[1] == 3.0).all()
    (dropped,) = got
    assert len(dropped) == 2 and not dropped.state_in.any()  # type: ignore[union-attr]
    rollout.record(obs, np.zeros(2, np.int64), np.zeros(2, np.float32), 0, states[0] * 9)
    rollout.rewards(np.zeros(2), {})
    rollout.cut(obs)
    first_new, other = sorted(got[1:], key=lambda f: len(f))
    assert not first_new.state_in.any()  # type: ignore[union-attr]  # the new episode
    assert len(other) == 4 and not other.state_in.any()  # type: ignore[union-attr]


def test_without_memory_fragments_have_no_state_in() -> None:
    got: list[Fragment] = []
    rollout = VectorRollout(2, 4, "p", True, got.append, lambda s: None)
    assert rollout.state is None
    rollout.record(np.zeros((2, 3), np.float32), np.zeros(2, np.int64), np.zeros(2, np.float32), 0)
    rollout.rewards(np.zeros(2), {})
    rollout.cut(np.zeros((2, 3), np.float32))
    assert len(got) == 2 and all(f.state_in is None for f in got)
