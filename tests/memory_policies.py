"""Hand-made policies with memory for the tests of every place a recurrent policy acts.

No learner is needed: a :class:`~rlserve.policy.ModelSpec` with an LSTM and seeded random
weights, as a :class:`~rlserve.policy.NumpyPolicy` or as the weights package a server serves.
:func:`replay` runs a fragment again from its ``state_in`` and checks its behaviour.
"""

from __future__ import annotations

import numpy as np

from rlserve.policy import LSTMMemory, ModelSpec, NumpyPolicy
from rlserve.policy.weights import WeightsPackage
from rlserve.protocol.fragment import Fragment

CELLS = 3
"""Cells of the LSTM: the state is ``2 * CELLS`` wide."""


def memory_package(
    obs_dim: int = 4, actions: int = 2, version: int = 1, seed: int = 0, scale: float = 2.0
) -> WeightsPackage:
    """Weights of an LSTM of :data:`CELLS` cells over ``obs_dim`` values, ``actions`` logits.

    ``scale``: of the actor's weights; large, the policy samples its greedy action but for a
    chance too small to meet in a test.
    """
    rng = np.random.default_rng(seed)
    spec = ModelSpec(
        obs_dim, ("actor.0",), "tanh", "categorical", actions, memory=LSTMMemory(CELLS, obs_dim)
    )
    arrays = {
        "memory.weight_ih": rng.normal(0, 0.8, (4 * CELLS, obs_dim)),
        "memory.weight_hh": rng.normal(0, 0.8, (4 * CELLS, CELLS)),
        "memory.bias": rng.normal(0, 0.3, 4 * CELLS),
        "actor.0.weight": rng.normal(0, scale, (actions, CELLS)),
        "actor.0.bias": np.zeros(actions),
    }
    return WeightsPackage(version, spec, {k: v.astype(np.float32) for k, v in arrays.items()})


def memory_policy(
    obs_dim: int = 4, actions: int = 2, version: int = 1, seed: int = 0, scale: float = 2.0
) -> NumpyPolicy:
    """:func:`memory_package` as a numpy policy."""
    package = memory_package(obs_dim, actions, version, seed, scale)
    return NumpyPolicy(package.spec, package.arrays, version, seed=seed)


def greedy_run(
    policy: NumpyPolicy, observations: np.ndarray
) -> tuple[list[int], np.ndarray, np.ndarray]:
    """One episode over ``observations`` ``[T, D]`` from zeros: the greedy actions, the states
    each step read ``[T, S]``, and each greedy action's probability ``[T]``."""
    state = policy.initial_state(1)
    actions, states, probs = [], [], []
    for row in observations:
        states.append(state[0])
        out = policy.compute_actions(row[None].astype(np.float32), False, state)
        actions.append(int(out.actions[0]))
        probs.append(float(np.exp(out.logp[0])))
        assert out.state is not None
        state = out.state
    return actions, np.stack(states), np.asarray(probs)


def replay(policy: NumpyPolicy, fragment: Fragment) -> np.ndarray:
    """Run ``policy`` over the fragment from its ``state_in``; the state after its last step.

    Checks on the way that each chosen step's behaviour log-probability is the one of the state
    carried (a logged step has none: it only advances the state).
    """
    assert fragment.state_in is not None, "a memory policy's fragment without state_in"
    assert fragment.state_in.shape == (policy.state_size,)
    state = fragment.state_in[None, :]
    for t in range(len(fragment)):
        obs = fragment.obs[t : t + 1]
        if fragment.policy_chosen[t]:
            logp = policy.log_prob(obs, fragment.actions[t : t + 1], state)
            np.testing.assert_allclose(logp[0], fragment.behaviour_logp[t], rtol=1e-5, atol=1e-5)
        _, state = policy.recurrent_forward(obs, state)
    return state[0]
