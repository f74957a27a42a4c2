"""The Algorithm API: ``PPOConfig().environment(...).env_runners(...).training(...).build()``.

``rlserve.algorithm.config`` is torch-free; :class:`Algorithm` (which trains) loads torch when
first used. This ``__init__`` is where the two kinds of Algorithm meet their config: it
installs the function :meth:`AlgorithmConfig.build` makes an Algorithm with, so no module of
the package imports one above it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlserve.algorithm.callbacks import Callbacks, DefaultCallbacks, RLlibCallback
from rlserve.algorithm.config import (
    AlgorithmConfig,
    DQNConfig,
    PPOConfig,
    SACConfig,
    install_assembler,
)
from rlserve.algorithm.serving_settings import RAY_SETTINGS
from rlserve.errors import ConfigError

if TYPE_CHECKING:
    from rlserve.algorithm.algorithm import Algorithm

__all__ = [
    "Algorithm",
    "AlgorithmConfig",
    "Callbacks",
    "DQNConfig",
    "DefaultCallbacks",
    "MLflowLoggerCallback",
    "PPOConfig",
    "RLlibCallback",
    "SACConfig",
    "WandbLoggerCallback",
]


def _assemble(config: AlgorithmConfig, resume: Path | None) -> Algorithm:
    """An Algorithm hosting ``config``'s environments, or serving network clients without any."""
    if config.env is None:
        from rlserve.algorithm.network import NetworkAlgorithm

        return NetworkAlgorithm(config, resume=resume)
    from rlserve.algorithm.algorithm import Algorithm

    ray = {k: v for k, v in (config.serving_settings or {}).items() if k in RAY_SETTINGS}
    if ray.get("ray_address") is not None or ray.get("replicas", 1) != 1:
        raise ConfigError(
            "serving(ray_address=..., replicas=...) places a server without environments on "
            "Ray; with environments, place the env runners (env_runners(backend='ray')) and "
            "the learner (learners(...)) instead, or drop environment(env=...)"
        )
    return Algorithm(config, resume=resume)


install_assembler(_assemble)


def __getattr__(name: str) -> Any:
    if name == "Algorithm":
        from rlserve.algorithm.algorithm import Algorithm

        return Algorithm
    if name in ("MLflowLoggerCallback", "WandbLoggerCallback"):
        from rlserve.algorithm import tracking

        return getattr(tracking, name)
    raise AttributeError(name)
