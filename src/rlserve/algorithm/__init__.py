"""The Algorithm API: ``PPOConfig().environment(...).env_runners(...).training(...).build()``.

``rlserve.algorithm.config`` is torch-free; :class:`Algorithm` (which trains) loads torch when
first used.
"""

from typing import Any

from rlserve.algorithm.config import AlgorithmConfig, DQNConfig, PPOConfig, SACConfig

__all__ = ["Algorithm", "AlgorithmConfig", "DQNConfig", "PPOConfig", "SACConfig"]


def __getattr__(name: str) -> Any:
    if name == "Algorithm":
        from rlserve.algorithm.algorithm import Algorithm

        return Algorithm
    raise AttributeError(name)
