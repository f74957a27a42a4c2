"""The client side: what a simulator embeds (numpy, msgpack and the standard library)."""

from rlserve.client.local_config import LocalConfig
from rlserve.client.policy_client import PolicyClient

__all__ = ["LocalConfig", "PolicyClient"]
