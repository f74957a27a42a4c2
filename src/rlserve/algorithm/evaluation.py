"""An Algorithm's evaluation: greedy episodes on their own copy of the environment.

Exploration is off and the episodes are not trained on; running on their own copy, they do not
disturb training's episodes. The result has RLlib's form, ``{"evaluation": {"env_runners":
{...}}}``.
"""

from __future__ import annotations

from typing import Any

from rlserve.algorithm.results import episode_stats
from rlserve.env.base import EnvSource
from rlserve.env.runner import EnvRunner
from rlserve.experience.agent_values import PolicyTable
from rlserve.experience.collector import Collector
from rlserve.experience.episode_records import EpisodeSummary
from rlserve.policy import NumpyPolicy


class Evaluator:
    """Runs greedy episodes on ``source`` with the policies it is given.

    Args:
        source: The evaluation's own copy of the environment (closed by :meth:`close`).
        table: The policies and who acts with which (the training collector's).
        policies: The policies to start with, by id.
        fragment_length: Steps of an episode per fragment.
        seed: Seed of the environment's resets and of sampling.
    """

    def __init__(
        self,
        source: EnvSource,
        table: PolicyTable,
        policies: dict[str, NumpyPolicy],
        fragment_length: int,
        seed: int,
    ):
        self._finished: list[EpisodeSummary] = []
        collector = Collector(
            table, policies, fragment_length, 1024, lambda _fragment: None, self._finished.append
        )
        collector.explore = False
        self.runner = EnvRunner(source, collector, training_enabled=False, seed=seed)

    def run(self, episodes: int, policies: dict[str, NumpyPolicy]) -> dict[str, Any]:
        """Run ``episodes`` episodes with ``policies`` (by id); return their statistics."""
        for pid, policy in policies.items():
            self.runner.collector.set_policy(pid, policy)
        self._finished.clear()
        while len(self._finished) < episodes:
            self.runner.sample(1)
        done = self._finished[:episodes]
        stats = episode_stats([s.episode_return for s in done], [s.length for s in done])
        return {"evaluation": {"env_runners": {**stats, "num_episodes": len(done)}}}

    def close(self) -> None:
        """Close the evaluation's environment."""
        self.runner.source.close()
