"""What a policy's forward pass gives for a batch: actions, log-probabilities, next state."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(slots=True)
class PolicyOutput:
    """Actions for a batch of observations.

    Attributes:
        actions: ``[N]`` int64 (categorical, epsilon_greedy) or ``[N, A]`` float32 (every
            other distribution, in the layout of :mod:`rlserve.policy.distribution`; Gaussian
            values in the space's units (scaled by ``action_scale``) and unclipped: this is what
            was sampled and what the learner trains on).
        logp: ``[N]`` float32 log-probability of each action.
        state: ``[N, state_size]`` float32, the recurrent state after these observations (to
            pass with the episode's next observation), for a policy with memory; None without.
    """

    actions: np.ndarray
    logp: np.ndarray
    state: np.ndarray | None = None
