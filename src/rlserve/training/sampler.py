"""Where experience comes from: the :class:`Sampler` interface and one round of it.

Every experience source of a trainer is a sampler: the Algorithm's environments in its own
process, its env-runner processes, the network clients of an attached server (and, next, Ray
env-runner actors). A round hands back fragments, the summaries of the episodes that ended and
how many steps it took; the trainer's :class:`~rlserve.training.driver.TrainingDriver` trains on
the fragments.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from rlserve.experience.episode_records import EpisodeSummary
from rlserve.policy.weights import WeightsPackage
from rlserve.protocol.fragment import Fragment


@dataclass
class SampleRound:
    """What one :meth:`Sampler.sample` round brought back."""

    fragments: list[Fragment] = field(default_factory=list)
    summaries: list[EpisodeSummary] = field(default_factory=list)
    """Every episode that ended in the round (hosted ones and ones clients reported)."""
    env_steps: int = 0
    """Steps sampled from hosted environments: an iteration runs until enough of these."""
    client_steps: int = 0
    """Steps network clients delivered: trained on and reported, not counted towards an
    iteration (clients set their own pace)."""
    log_position: int | None = None
    """The experience-log position through which every record was handed on (None: the
    fragments were never logged)."""


class Sampler(Protocol):
    """One source of experience for a trainer, sampled a round at a time."""

    @property
    def episodes_failed(self) -> int:
        """Episodes lost to failed environments or processes, lifetime."""
        ...

    @property
    def num_healthy(self) -> int:
        """Sampling processes alive (0 for one that samples in the caller's process)."""
        ...

    @property
    def restarts(self) -> int:
        """Sampling processes restarted after a failure."""
        ...

    def sample(self, steps: int, packages: Mapping[str, WeightsPackage]) -> SampleRound:
        """One round of about ``steps`` steps acted with ``packages``' weights.

        Args:
            steps: Steps to take (a sampler of clients hands on at most this many).
            packages: Each policy's current weights. A sampler that acts in other processes
                sends those whose version changed; one that acts with policies its trainer
                swaps in at publication (in-process envs, an attached server) ignores them.
        """
        ...

    def stop(self) -> None:
        """Stop sampling and release what it holds (idempotent)."""
        ...
