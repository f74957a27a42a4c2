"""Policies that compute actions with numpy alone (server inference and local-mode clients)."""

from rlserve.policy.distribution import ActionDistribution, ActionPart
from rlserve.policy.memory import LSTMMemory
from rlserve.policy.model_spec import ModelSpec
from rlserve.policy.numpy_policy import NumpyPolicy, PolicyOutput
from rlserve.policy.space_distribution import action_distribution

__all__ = [
    "ActionDistribution",
    "ActionPart",
    "LSTMMemory",
    "ModelSpec",
    "NumpyPolicy",
    "PolicyOutput",
    "action_distribution",
]
