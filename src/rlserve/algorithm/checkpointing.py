"""An Algorithm's checkpoints: :meth:`~CheckpointMixin.save`, :meth:`~CheckpointMixin.restore`.

:class:`CheckpointMixin` writes a checkpoint folder (a run folder ``rlserve export`` reads:
``config.toml``, ``spaces.json``, each policy's learner checkpoints and the Algorithm's counters,
:mod:`rlserve.algorithm.checkpoint_state`) and loads one back, restarting sampling from a state
that depends only on the checkpoint. With a server attached and the folder its run folder, a
checkpoint lets the experience log go up to the position it trained through, and a restore
queues again what was logged after it.
"""

from __future__ import annotations

from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from rlserve.algorithm.checkpoint_state import (
    check_restorable,
    read_state,
    save_learners,
    write_state,
)
from rlserve.algorithm.results import RETURN_WINDOW
from rlserve.algorithm.saved_config import CONFIG_FILE, save_config
from rlserve.algorithm.sources import make_source
from rlserve.config.fields import to_table
from rlserve.errors import ConfigError
from rlserve.learners.registry import DEFAULT_ALGORITHM
from rlserve.run.metrics import MetricsWriter, ProgressLine
from rlserve.run.run_folder import IN_USE_NEW, IN_USE_RESUME, RunFolder
from rlserve.run.run_lock import RunLock
from rlserve.server.policies import is_flat, run_folder_form

if TYPE_CHECKING:
    from rlserve.algorithm.callbacks import CallbackList
    from rlserve.algorithm.config import AlgorithmConfig
    from rlserve.algorithm.runner_group import RunnerGroup
    from rlserve.algorithm.serving import AttachedServer
    from rlserve.env.base import EnvSource
    from rlserve.learners.base import Learner
    from rlserve.policy.weights import WeightsPackage
    from rlserve.protocol.mapping import PolicyMapping
    from rlserve.server.policies import PolicySpec
    from rlserve.training.driver import TrainingDriver
    from rlserve.training.sampler import Sampler


class CheckpointMixin:
    """``save``, ``restore`` and ``use_run_folder`` of an :class:`~rlserve.algorithm.Algorithm`."""

    # The Algorithm's state a checkpoint holds or restarts (documented on Algorithm).
    config: AlgorithmConfig
    specs: dict[str, PolicySpec]
    mapping: PolicyMapping | None
    algorithms: dict[str, str]
    learners: dict[str, Learner]
    driver: TrainingDriver
    callbacks: CallbackList
    iteration: int
    env_steps_sampled: int
    episodes_total: int
    time_total_s: float
    _returns: deque[float]
    _lengths: deque[int]
    _seeds: np.random.SeedSequence
    _packages: dict[str, WeightsPackage]
    _env_sampler: Sampler
    runners: RunnerGroup | None
    source: EnvSource
    server: AttachedServer | None
    run: RunFolder | None
    _metrics: MetricsWriter | None
    _progress: ProgressLine

    def save(self, checkpoint_dir: str | Path | None = None) -> Path:
        """Write a checkpoint folder (a run folder ``rlserve export`` reads) and return it.

        Without ``checkpoint_dir``: into the run folder when there is one, else a new folder
        under ``runs/``. Episodes in flight are not part of it: a restored Algorithm starts
        fresh episodes (their environments are reset with a seed derived from the iteration).

        Raises:
            ConfigError: ``checkpoint_dir`` is in use by another process (a server, another
                Algorithm), or holds a run that is not an Algorithm's (``rlserve serve``'s).
        """
        if checkpoint_dir is None:
            if self.run is None:
                self.run = RunFolder.create("runs", None).hold(IN_USE_NEW)
                self._write_run_files(self.run.path)
            folder = self.run.path
        elif self.run is not None and _same(Path(checkpoint_dir), self.run.path):
            folder = self.run.path  # its own run folder, whose lock it holds
            self._write_run_files(folder)
        else:
            folder = Path(checkpoint_dir)
            folder.mkdir(parents=True, exist_ok=True)
            lock = RunLock.acquire(folder, "save into another folder")
            try:
                _refuse_another_run(folder)
                self._write_run_files(folder)
                self._checkpoint(folder)
            finally:
                lock.release()
            return folder
        self._checkpoint(folder)
        return folder

    def _checkpoint(self, folder: Path) -> None:
        files = save_learners(
            folder,
            self.learners,
            is_flat(self.specs),
            self.iteration,
            self.config.keep_checkpoints,
        )
        for pid, name in files.items():
            self.callbacks.fire(
                "on_checkpoint",
                algorithm=self,
                path=str(folder / name),
                policy_id=pid,
                version=self.learners[pid].version,
            )
        state = {
            "iteration": self.iteration,
            "env_steps_sampled": self.env_steps_sampled,
            "episodes_total": self.episodes_total,
            "time_total_s": self.time_total_s,
            "returns": list(self._returns),
            "lengths": list(self._lengths),
            "episodes_failed": self._episodes_failed,
            "checkpoints": files,
            "algorithms": dict(self.algorithms),
            "log_trained_through": self.driver.trained_through,
        }
        write_state(folder, state)
        if self.server is not None and self.run is not None and _same(folder, self.run.path):
            # The checkpoint holds what the log held through this point: it may go.
            self.server.release_log(self.driver.trained_through)

    def restore(self, checkpoint_dir: str | Path) -> None:
        """Load the learners and counters of a checkpoint folder written by :meth:`save`.

        The environments start fresh episodes, seeded from the restored iteration, so two
        restores of one checkpoint continue identically.
        """
        folder = Path(checkpoint_dir)
        state = read_state(folder)
        check_restorable(folder, state, self.algorithms)
        for pid, learner in self.learners.items():
            learner.load(folder / state["checkpoints"][pid])
        self.iteration = int(state["iteration"])
        self.env_steps_sampled = int(state["env_steps_sampled"])
        self.episodes_total = int(state["episodes_total"])
        self.time_total_s = float(state["time_total_s"])
        self._returns = deque(state["returns"], maxlen=RETURN_WINDOW)
        self._lengths = deque(state["lengths"], maxlen=RETURN_WINDOW)
        # Restart sampling from a state that depends only on the checkpoint.
        self._seeds = np.random.SeedSequence([self.config.seed, self.iteration])
        seed = self.config.seed + 7919 * self.iteration
        self._packages = {pid: learner.weights() for pid, learner in self.learners.items()}
        self._env_sampler.stop()
        if self.runners is None:
            self.source.close()
            self.source = make_source(self.config, seed=seed)
        self._start_sampling(seed, int(state.get("episodes_failed", 0)))
        if self.server is not None:
            for pid, learner in self.learners.items():
                self.server.publish(pid, learner.weights())
            if self.run is not None and _same(folder, self.run.path):
                # Resuming the server's own run: what it logged past the checkpoint is trained.
                position = int(state.get("log_trained_through", 0))
                self.driver.restart_at(position)
                self.server.requeue_after(position)

    def _write_run_files(self, folder: Path) -> None:
        tables, spaces = run_folder_form(self.specs, self.mapping, self.config.algo_name)
        for name in sorted(set(self.algorithms.values()) | {self.config.algo_name}):
            tables[name] = to_table(self.config.policy_settings(name))
        if self.config.algo_name != DEFAULT_ALGORITHM:
            tables["algorithm"] = {"name": self.config.algo_name}
        run = RunFolder(folder)
        run.save(tables, spaces)
        save_config(self.config, folder)

    def use_run_folder(self, folder: str | Path, progress: bool | None = None) -> None:
        """Write metrics and checkpoints into ``folder`` (an existing run, e.g. on resume)."""
        self.run = RunFolder(Path(folder)).hold(IN_USE_RESUME, replacing=self.run)
        if self._metrics is not None:
            self._metrics.close()
        self._metrics = MetricsWriter(self.run.path)
        if progress is not None:
            self._progress = ProgressLine(progress)

    def _start_sampling(self, seed: int, episodes_failed: int = 0) -> None:
        """Start the environments' sampler (and the acting policies) from ``seed``."""
        raise NotImplementedError

    @property
    def _episodes_failed(self) -> int:
        raise NotImplementedError


def _refuse_another_run(folder: Path) -> None:
    """Refuse to save into a run folder that is not an Algorithm's (its files would be replaced).

    Raises:
        ConfigError: ``folder`` holds a run (``config.toml`` and ``spaces.json``) but no saved
            Algorithm config.
    """
    run_files = (folder / "config.toml").exists() and (folder / "spaces.json").exists()
    if run_files and not (folder / CONFIG_FILE).exists():
        raise ConfigError(
            f"{folder} holds a run of rlserve serve (config.toml and spaces.json, no "
            f"{CONFIG_FILE}), which a save would overwrite; save into a new folder"
        )


def _same(a: Path, b: Path) -> bool:
    return a.resolve() == b.resolve()
