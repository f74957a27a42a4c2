"""rlserve: train and serve RL policies for simulators that run their own loop.

The public surface is re-exported here; ``import rlserve`` never imports torch.
"""

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType as _ModuleType
from typing import Any as _Any

from rlserve.algorithm.config import AlgorithmConfig, DQNConfig, PPOConfig, SACConfig
from rlserve.client.local_config import LocalConfig
from rlserve.client.policy_client import PolicyClient
from rlserve.errors import (
    AuthenticationError,
    CapacityError,
    ClientClosedError,
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
from rlserve.version import __version__

__all__ = [
    "AlgorithmConfig",
    "AuthenticationError",
    "CapacityError",
    "ClientClosedError",
    "ConfigError",
    "ConnectionLostError",
    "DQNConfig",
    "EpisodeError",
    "EpisodeLostError",
    "LocalConfig",
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

_MOVED_MODULES = {
    "rlserve.spaces": "rlserve.protocol.spaces",
    "rlserve.values": "rlserve.protocol.values",
    "rlserve.samples": "rlserve.protocol.fragment",
    "rlserve.multiagent": "rlserve.protocol.mapping",
    "rlserve.spaces_file": "rlserve.config.spaces_file",
    "rlserve.durable": "rlserve.run.durable",
    "rlserve.episodes": "rlserve.experience.episodes",
    "rlserve.agent_columns": "rlserve.experience.agent_columns",
    "rlserve.agent_groups": "rlserve.experience.agent_groups",
    "rlserve.vector_rollout": "rlserve.experience.vector_rollout",
    "rlserve.collector": "rlserve.experience.collector",
    "rlserve.client.agent_values": "rlserve.experience.agent_values",
    "rlserve.server.checkpoints": "rlserve.run.checkpoints",
    "rlserve.server.experience_log": "rlserve.run.experience_log",
    "rlserve.server.state_store": "rlserve.run.state_store",
    "rlserve.server.run_folder": "rlserve.run.run_folder",
    "rlserve.server.metrics": "rlserve.run.metrics",
    "rlserve.server.learner_worker": "rlserve.training.learner_worker",
    "rlserve.server.policy_learner": "rlserve.training.policy_learner",
    "rlserve.policies_config": "rlserve.server.policies_config",
    "rlserve.demo": "rlserve.cli.demo",
    "rlserve.status": "rlserve.cli.status",
    "rlserve.train": "rlserve.cli.train",
    "rlserve.export": "rlserve.algorithm.export",
    "rlserve.algorithms": "rlserve.learners",
    "rlserve.algorithms.advantages": "rlserve.learners.advantages",
    "rlserve.algorithms.base": "rlserve.learners.base",
    "rlserve.algorithms.dqn": "rlserve.learners.dqn",
    "rlserve.algorithms.dqn_config": "rlserve.learners.dqn_config",
    "rlserve.algorithms.models": "rlserve.learners.models",
    "rlserve.algorithms.normalization": "rlserve.learners.normalization",
    "rlserve.algorithms.ppo": "rlserve.learners.ppo",
    "rlserve.algorithms.ppo_config": "rlserve.learners.ppo_config",
    "rlserve.algorithms.registry": "rlserve.learners.registry",
    "rlserve.algorithms.replay": "rlserve.learners.replay",
    "rlserve.algorithms.running_stats": "rlserve.learners.running_stats",
    "rlserve.algorithms.sac": "rlserve.learners.sac",
    "rlserve.algorithms.sac_config": "rlserve.learners.sac_config",
    "rlserve.algorithms.sac_models": "rlserve.learners.sac_models",
}
"""Module paths before the layered layout (0.1) -> where the module lives now."""


class _MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports a module by its old path as the module at its new path, with a DeprecationWarning.

    The old name becomes another name of the same module object, so classes stay identical
    whichever path a user's code (or a pickled-free saved reference) names.
    """

    def __init__(self) -> None:
        self._specs: dict[str, _Any] = {}

    def find_spec(self, fullname: str, path: _Any, target: _Any = None) -> _Any:
        """Claim the old paths only; everything else is left to the normal finders."""
        if fullname not in _MOVED_MODULES:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> _ModuleType:
        """Import the module at its new path and hand it over under the old name."""
        new = _MOVED_MODULES[spec.name]
        warnings.warn(f"{spec.name} is now {new}: import it from there", DeprecationWarning, 2)
        module = importlib.import_module(new)
        self._specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module: _ModuleType) -> None:
        """Give the module back its own spec, which the import system replaced by the alias's."""
        for old, spec in list(self._specs.items()):
            if spec is not None and spec.name == module.__name__:
                module.__spec__ = spec
                del self._specs[old]


if not any(isinstance(finder, _MovedModuleFinder) for finder in sys.meta_path):
    sys.meta_path.insert(0, _MovedModuleFinder())
