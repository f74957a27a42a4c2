"""Policies that compute actions with numpy alone (server inference and local-mode clients)."""

from rlserve.policy.numpy_policy import ModelSpec, NumpyPolicy, PolicyOutput

__all__ = ["ModelSpec", "NumpyPolicy", "PolicyOutput"]
