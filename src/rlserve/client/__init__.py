"""The client side: what a simulator embeds (numpy, msgpack and the standard library)."""

from rlserve.client.policy_client import PolicyClient

__all__ = ["PolicyClient"]
