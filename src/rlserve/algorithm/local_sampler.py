"""The Algorithm's environments sampled in its own process: a :class:`LocalSampler`.

One :class:`~rlserve.env.runner.EnvRunner` steps the source with a
:class:`~rlserve.experience.collector.Collector` of numpy policy copies; a round cuts every open
episode at its end, so it holds only the current weights' steps. The collector's policies are
also what the Algorithm acts with (``compute_actions``), so the Algorithm keeps one even when
env-runner processes sample instead.
"""

from __future__ import annotations

from collections.abc import Mapping

from rlserve.env.base import EnvSource
from rlserve.env.runner import EnvRunner
from rlserve.experience.agent_values import PolicyTable
from rlserve.experience.collector import Collector
from rlserve.experience.episode_records import EpisodeSummary
from rlserve.policy import NumpyPolicy
from rlserve.policy.weights import WeightsPackage
from rlserve.protocol.fragment import Fragment
from rlserve.training.sampler import SampleRound


class LocalSampler:
    """Samples ``source`` in this process (a :class:`~rlserve.training.sampler.Sampler`).

    Args:
        source: The environments (its owner closes them).
        table: The policies and the agent -> policy mapping.
        policies: Each policy's numpy copy to act with; the owner swaps new ones into
            :attr:`collector` as it publishes weights.
        fragment_length: Steps per fragment before it is cut.
        seed: Seed of the source's first reset.
        episodes_failed: Failed episodes counted before (a restored checkpoint's).
    """

    num_healthy = 0
    """Sampling processes: none (it samples in the caller's process)."""
    restarts = 0
    """Sampling processes restarted: none."""

    def __init__(
        self,
        source: EnvSource,
        table: PolicyTable,
        policies: dict[str, NumpyPolicy],
        fragment_length: int,
        seed: int,
        episodes_failed: int = 0,
    ):
        self.fragments: list[Fragment] = []
        """The collector's sink: fragments of the round under way."""
        self._summaries: list[EpisodeSummary] = []
        num_envs = int(getattr(source, "num_envs", 1))
        self.collector = Collector(
            table,
            policies,
            fragment_length,
            max(1024, 4 * num_envs),
            self.fragments.append,
            self._summaries.append,
        )
        self.runner = EnvRunner(source, self.collector, seed=seed)
        self.runner.episodes_failed = episodes_failed

    @property
    def episodes_failed(self) -> int:
        """Episodes lost to crashed or hung sub-environments, lifetime."""
        return self.runner.episodes_failed

    def sample(self, steps: int, packages: Mapping[str, WeightsPackage]) -> SampleRound:
        """Step the environments ``steps`` times, then cut every open episode.

        ``packages`` are not used: the collector acts with the policies swapped into it.
        """
        env_steps = self.runner.sample(steps)
        self.runner.cut()
        taken = SampleRound(self.fragments[:], self._summaries[:], env_steps)
        self.fragments.clear()
        self._summaries.clear()
        return taken

    def stop(self) -> None:
        """Nothing to release: the source is its owner's to close."""
