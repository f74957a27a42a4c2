"""The narrow interface between experience sources and learning algorithms.

A learner is fed finished :class:`~rlserve.protocol.fragment.Fragment` batches and nothing else: it
does not
know whether they came from network clients, hosted environments or logged data. It says when it
has enough for an update, performs the update, and publishes its actor as a
:class:`WeightsPackage` that numpy-only code can run.
"""

from __future__ import annotations

import abc
import logging
from pathlib import Path
from typing import Any

import numpy as np

from rlserve.learners.replay import ReplayBuffer
from rlserve.policy import ModelSpec
from rlserve.policy.weights import WeightsPackage
from rlserve.protocol.fragment import Fragment

logger = logging.getLogger("rlserve.learner")


class Learner(abc.ABC):
    """An algorithm's update step, fed with trajectory fragments."""

    _version: int
    """The weights version; each learner sets it (0 when fresh) and advances it per update."""
    _counters: dict[str, int]
    """The learner's counters (``fragments_excluded_invalid``, ``steps_excluded_invalid``...)."""
    _warnings: Any
    """Its rate-limited warning (``RateLimitedWarning``): ``add(kind, example=...)``."""
    obs_normalization: Any = None
    """Its observation normalisation (``ObservationNormalization``, frozen per weights version),
    or None when it reads raw observations."""

    def _with_normalization(self, spec: ModelSpec) -> ModelSpec:
        """``spec`` with the published version's observation statistics, when it normalises."""
        if self.obs_normalization is None:
            return spec
        result: ModelSpec = self.obs_normalization.spec(spec)
        return result

    def normalized_observations(self, obs: np.ndarray) -> np.ndarray:
        """``[N, D]`` raw observations as the learner's networks read them.

        Normalised with the published version's statistics; without normalisation, the
        observations themselves as float32.
        """
        if self.obs_normalization is None:
            return np.asarray(obs, dtype=np.float32)
        result: np.ndarray = self.obs_normalization.numpy(obs)
        return result

    def _exclude(self, steps: int, problem: str) -> None:
        """Count a fragment of ``steps`` steps left out whole, and warn (rate-limited) why."""
        self._counters["fragments_excluded_invalid"] += 1
        self._counters["steps_excluded_invalid"] += steps
        self._warnings.add("fragments excluded", example=problem)

    def _exclude_fragment(self, fragment: Fragment, problem: str) -> None:
        """:meth:`_exclude` a fragment as received (its steps, when its rewards say how many)."""
        rewards = fragment.rewards
        valid = isinstance(rewards, np.ndarray) and rewards.ndim == 1
        self._exclude(len(rewards) if valid else 0, problem)

    @property
    def version(self) -> int:
        """Version of the current weights (one more after each update that changed them)."""
        return self._version

    def continue_versions_from(self, version: int) -> None:
        """Number later weights after ``version`` if it is ahead (weights never go back)."""
        self._version = max(self._version, version)

    @abc.abstractmethod
    def ingest(self, fragments: list[Fragment]) -> None:
        """Take fragments into the learner's buffer."""

    @property
    @abc.abstractmethod
    def buffered_steps(self) -> int:
        """Steps taken in but not yet trained on."""

    @property
    def owed_steps(self) -> int:
        """Env steps taken in whose scheduled training is still to do (0: trains what it has).

        Off-policy learners train on a schedule and may owe gradient steps for steps they have
        already stored; the server holds its clients while this and the unread log are over the
        bound (:mod:`rlserve.server.pacing`).
        """
        return 0

    @property
    @abc.abstractmethod
    def sample_steps(self) -> int:
        """Env steps a synchronous sampler collects between two looks at :meth:`ready`."""

    @abc.abstractmethod
    def ready(self) -> bool:
        """Whether enough experience is buffered for :meth:`update`."""

    @abc.abstractmethod
    def update(self) -> dict[str, float]:
        """Run one update on the buffered experience and return its metrics (slash names)."""

    @abc.abstractmethod
    def weights(self) -> WeightsPackage:
        """The current actor, for inference."""

    def counters(self) -> dict[str, int]:
        """Step counters that a checkpoint must restore (updates, trained steps...) and version."""
        return dict(self._counters, version=self._version)

    def _restore_counters(self, saved: dict[str, Any]) -> None:
        """Take back the :meth:`counters` a checkpoint holds (the version among them)."""
        counters = dict(saved)
        self._version = int(counters.pop("version"))
        self._counters.update({k: int(v) for k, v in counters.items()})

    def _skip_update(self, nonfinite: bool = True) -> None:
        """Count an update that applied no step, whose version and statistics stay published.

        ``nonfinite`` False: it had nothing to train on (its caller says why).
        """
        if nonfinite:
            self._counters["updates_skipped_nonfinite"] += 1
            self._warnings.add("updates that applied no step (version kept)")
        if self.obs_normalization is not None:
            self.obs_normalization.revert()

    @abc.abstractmethod
    def save(self, path: Path, extra: dict[str, Any]) -> None:
        """Write model, optimiser and counters (and ``extra``) to ``path``."""

    @abc.abstractmethod
    def load(self, path: Path) -> dict[str, Any]:
        """Restore from :meth:`save` output and return its ``extra``."""

    @abc.abstractmethod
    def initialise_from(self, path: Path) -> None:
        """Take the model weights of a :meth:`save` output (e.g. another run's checkpoint).

        Only the weights: the optimiser, counters, version and ``extra`` stay this learner's.
        """


class ReplayLearner(Learner):
    """A learner that stores each step in its replay buffer as it takes it in (DQN, SAC)."""

    replay: ReplayBuffer
    """Its replay buffer."""

    def _restore_replay(self, state: dict[str, Any] | None, path: Path) -> None:
        """Take back a checkpoint's replay buffer (``ReplayBuffer.state`` as tensors), if any.

        One that does not fit this learner (another ``gamma`` or ``n_step``: its sums are not
        this learner's targets) is left out with a warning, and the run resumes with the rest of
        the checkpoint and an empty buffer: the checkpoint is not damaged.
        """
        if state is None:
            return
        try:
            self.replay.load_state({name: value.cpu().numpy() for name, value in state.items()})
        except ValueError as exc:
            logger.warning("%s: replay buffer not restored: %s", path, exc)

    @property
    def buffered_steps(self) -> int:
        """Zero: each step taken in is in the replay buffer at once.

        What it still owes (its scheduled gradient steps) is in the schedule, which checkpoints
        hold, so the log position is settled as soon as the steps are read: a restart never reads
        them again (which would store them twice with ``checkpoint_replay``).
        """
        return 0
