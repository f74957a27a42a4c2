"""Policies that compute actions with numpy alone (server inference and local-mode clients)."""

from rlserve.policy.distributions import ActionDistribution, ActionPart, action_distribution
from rlserve.policy.numpy_policy import ModelSpec, NumpyPolicy, PolicyOutput

__all__ = [
    "ActionDistribution",
    "ActionPart",
    "ModelSpec",
    "NumpyPolicy",
    "PolicyOutput",
    "action_distribution",
]
