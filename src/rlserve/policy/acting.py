"""Whether an episode's actions explore: evaluation episodes of DQN act greedily.

An episode started with ``training_enabled=False`` (an evaluation run, a demo) is never trained
on. A policy whose exploration is added on top of what it learned, DQN's epsilon-greedy, then
takes its greedy action (epsilon 0), on the server (remote inference) and in a local-mode
client's numpy policy alike. A stochastic policy (PPO's categorical or Gaussian, SAC's squashed
Gaussian) samples as in any other episode: sampling is the policy it learned (``Algorithm.
evaluate`` and ``compute_single_action`` take every policy's mode instead).
"""

from __future__ import annotations

import numpy as np

from rlserve.policy.numpy_policy import NumpyPolicy, PolicyOutput

GREEDY_IN_EVALUATION = frozenset({"epsilon_greedy"})
"""The action distributions whose evaluation episodes take the greedy action."""


def greedy_in_evaluation(policy: NumpyPolicy) -> bool:
    """Whether ``policy``'s evaluation episodes (``training_enabled=False``) act greedily."""
    return policy.spec.distribution in GREEDY_IN_EVALUATION


def explores(policy: NumpyPolicy, training_enabled: bool, explore: bool = True) -> bool:
    """Whether ``policy`` samples its action in an episode (False: its greedy action).

    Args:
        policy: The acting policy.
        training_enabled: The episode's ``training_enabled``.
        explore: Whether the caller explores at all (False: every episode is greedy).
    """
    return explore and (training_enabled or not greedy_in_evaluation(policy))


def compute_actions(
    policy: NumpyPolicy,
    obs: np.ndarray,
    greedy_rows: np.ndarray | None = None,
    state: np.ndarray | None = None,
) -> PolicyOutput:
    """The actions of a batch whose rows ``greedy_rows`` (bool ``[N]``) take the greedy action.

    Rows of evaluation episodes and rows of training episodes share the batch; the others
    sample. None, or no greedy row: one call that samples every row, as before. ``state``:
    each row's recurrent state, for a policy with memory (see
    :meth:`~rlserve.policy.numpy_policy.NumpyPolicy.compute_actions`); the output's ``state``
    does not depend on which rows explore.
    """
    if greedy_rows is None or not greedy_rows.any():
        return policy.compute_actions(obs, True, state)
    if greedy_rows.all():
        return policy.compute_actions(obs, False, state)
    out = policy.compute_actions(obs, True, state)
    greedy_state = None if state is None else state[greedy_rows]
    greedy = policy.compute_actions(obs[greedy_rows], False, greedy_state)
    out.actions[greedy_rows] = greedy.actions
    out.logp[greedy_rows] = greedy.logp
    return out
