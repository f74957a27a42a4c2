"""rlserve: train and serve RL policies for simulators that run their own loop.

The public surface is re-exported here; ``import rlserve`` never imports torch.
"""

__version__ = "0.1.0"

from rlserve.algorithm.config import AlgorithmConfig, DQNConfig, PPOConfig, SACConfig
from rlserve.client.policy_client import PolicyClient
from rlserve.errors import (
    AuthenticationError,
    CapacityError,
    ConfigError,
    ConnectionLostError,
    EpisodeError,
    EpisodeLostError,
    ProtocolError,
    RequestTimeoutError,
    RLServeError,
    ServerError,
    SpaceError,
    TLSError,
    VersionMismatchError,
)

__all__ = [
    "AlgorithmConfig",
    "AuthenticationError",
    "CapacityError",
    "ConfigError",
    "ConnectionLostError",
    "DQNConfig",
    "EpisodeError",
    "EpisodeLostError",
    "PPOConfig",
    "PolicyClient",
    "ProtocolError",
    "RLServeError",
    "RequestTimeoutError",
    "SACConfig",
    "ServerError",
    "SpaceError",
    "TLSError",
    "VersionMismatchError",
    "__version__",
]
