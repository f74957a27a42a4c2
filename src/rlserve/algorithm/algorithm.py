"""The Algorithm: env runners, a collector and learners in one object (RLlib's ``Algorithm``).

``train()`` is synchronous, as on-policy PPO wants it: each sampler (the environments, in process
or in env-runner processes; an attached server's clients: :mod:`rlserve.training.sampler`)
samples a round with the current weights, every open episode cut at its end (so a batch holds
only those weights' steps); the :class:`~rlserve.training.driver.TrainingDriver` updates each
ready learner, and the new weights go to the collector (and the server); repeat until
``min_env_steps_per_iteration`` steps were sampled, then return the result dict
(:data:`RESULT_KEYS` documents it). A round is the shortest of the learners' schedules
(``sample_steps``: PPO's ``train_batch_size``, DQN's and SAC's ``train_every``), so in a run
that mixes algorithms each policy trains on its own schedule: a PPO policy once its batch is
full (its weights stay the same until then, so the batch is still on-policy), an off-policy one
each time its round of steps came in (and again while a backlog keeps it ready).

With ``.serving(...)`` a network server is attached: the fragments its clients produce join each
update's batch (taken fairly across clients), and every new version is published to them. With
``env_runners(num_env_runners=N)`` the sampling happens in N env-runner processes instead
(:mod:`rlserve.algorithm.runner_group`), each round in parallel.

The run folder (``.reporting(run_dir=...)``, or the folder :meth:`Algorithm.save` writes) has
the server's layout: ``config.toml``, ``spaces.json``, ``checkpoints/ckpt_*.pt`` per policy,
TensorBoard event files, so ``rlserve export`` works on it.
"""

from __future__ import annotations

import time
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rlserve.algorithm.callbacks import CallbackList, callback_list
from rlserve.algorithm.checkpoint_state import STATE_FILE
from rlserve.algorithm.checkpointing import CheckpointMixin
from rlserve.algorithm.config import AlgorithmConfig, assemble
from rlserve.algorithm.evaluation import Evaluator
from rlserve.algorithm.inference import ActingMixin
from rlserve.algorithm.local_sampler import LocalSampler
from rlserve.algorithm.network_config import run_folder_config
from rlserve.algorithm.placement import close_learners, learner_restarts, make_learners
from rlserve.algorithm.results import RETURN_WINDOW, episode_stats, iteration_result, report
from rlserve.algorithm.runner_group import RunnerGroup, local_source
from rlserve.algorithm.saved_config import load_config
from rlserve.algorithm.sources import make_source, policy_table, source_policies
from rlserve.env.base import EnvSource
from rlserve.experience.collector import Collector
from rlserve.experience.episode_records import EpisodeSummary
from rlserve.policy import NumpyPolicy
from rlserve.policy.weights import WeightsPackage
from rlserve.run.metrics import MetricsWriter, ProgressLine
from rlserve.run.run_folder import IN_USE_NEW, IN_USE_RESUME, RunFolder
from rlserve.training.driver import MAX_UPDATES_PER_ROUND, TrainingDriver
from rlserve.training.policy_learner import PolicyLearner
from rlserve.training.sampler import Sampler

if TYPE_CHECKING:
    from rlserve.algorithm.serving import AttachedServer

RESULT_KEYS = {
    "training_iteration": "iterations done so far",
    "env_runners/episode_return_mean": "mean return of the last 100 finished episodes (NaN: none)",
    "env_runners/episode_return_min": "lowest return in that window",
    "env_runners/episode_return_max": "highest return in that window",
    "env_runners/episode_len_mean": "mean length of the episodes in that window",
    "env_runners/num_episodes": "episodes finished in this iteration",
    "env_runners/num_env_steps_sampled": "agent steps sampled in this iteration",
    "env_runners/num_env_steps_sampled_lifetime": "agent steps sampled since the start",
    "env_runners/episodes_failed": (
        "episodes lost to crashed or hung sub-environments or env-runner processes, lifetime "
        "(without environments: episodes the server closed for silence)"
    ),
    "env_runners/num_healthy_env_runners": (
        "env-runner processes or Ray actors alive (0: sampling in-process)"
    ),
    "env_runners/num_env_runner_restarts": (
        "env-runner processes restarted after a failure since this Algorithm was built or restored"
    ),
    "learners/<policy id>/<name>": "each policy's learner metrics of its last update",
    "learner_restarts": (
        "learner actors (.learners(num_gpus_per_learner=...)) that died and were replaced, "
        "or learner processes restarted (a server without environments), since this Algorithm "
        "was built or restored"
    ),
    "num_env_steps_sampled_lifetime": "as env_runners/num_env_steps_sampled_lifetime",
    "network/num_env_steps": "steps network clients contributed in this iteration",
    "time_this_iter_s": "seconds this iteration took",
    "time_total_s": "seconds of train() since the start",
    "episode_return_mean": "as env_runners/episode_return_mean (old RLlib name)",
    "episode_reward_mean": "as env_runners/episode_return_mean (old RLlib name)",
    "timesteps_total": "as num_env_steps_sampled_lifetime (old RLlib name)",
}
"""Every key of :meth:`Algorithm.train`'s result (``a/b`` is ``result["a"]["b"]``)."""


class Algorithm(CheckpointMixin, ActingMixin):
    """Samples environments, trains a learner per policy and serves the policy when asked.

    Build it with :meth:`AlgorithmConfig.build`, or :meth:`from_checkpoint`.

    Args:
        config: Its settings.
        resume: An earlier run folder of this Algorithm with a server attached: the server
            continues it (counters, weights, experience log) instead of a new folder, and
            :meth:`restore` from it queues again what the restored checkpoint had not trained.
    """

    def __init__(self, config: AlgorithmConfig, *, resume: str | Path | None = None):
        self.config = config
        self.iteration = 0
        self.env_steps_sampled = 0
        self.episodes_total = 0
        self.time_total_s = 0.0
        self._returns: deque[float] = deque(maxlen=RETURN_WINDOW)
        self._lengths: deque[int] = deque(maxlen=RETURN_WINDOW)
        self._episodes_this_iter = 0
        self._seeds = np.random.SeedSequence(config.seed)
        self.callbacks: CallbackList = callback_list(config)
        """The callbacks told of results, episodes and checkpoints (``config.callbacks``)."""
        if config.num_env_runners:
            self.source: EnvSource = local_source(config, seed=config.seed)
        else:
            self.source = make_source(config, seed=config.seed)
        self.specs, self.mapping = source_policies(config, self.source)
        self.algorithms = {
            pid: spec.algorithm_of(config.algo_name) for pid, spec in self.specs.items()
        }
        """Each policy's algorithm, by id."""
        try:
            self.learners = make_learners(config, self.specs, self.algorithms)
        except BaseException:
            self.source.close()
            raise
        """Each policy's learner, by id: in this process, or a Ray actor's proxy
        (``.learners(num_gpus_per_learner=...)``: :mod:`rlserve.algorithm.placement`)."""
        self.driver = TrainingDriver(
            {
                pid: PolicyLearner.in_process(pid, learner, self.specs[pid].frozen)
                for pid, learner in self.learners.items()
            },
            self._updated,
            max_updates_per_round=MAX_UPDATES_PER_ROUND,
        )
        """The learner loop; the Algorithm publishes each round's new weights itself."""
        self._learner_metrics: dict[str, dict[str, float]] = {pid: {} for pid in self.learners}
        self.frame_stacks = {
            pid: int(config.policy_settings(self.algorithms[pid], spec.config).frame_stack)
            for pid, spec in self.specs.items()
        }
        """Each policy's ``frame_stack``: its episodes act on and record stacked frames."""
        self.table = policy_table(self.specs, self.mapping, self.frame_stacks)
        self._packages = {pid: learner.weights() for pid, learner in self.learners.items()}
        self.runners: RunnerGroup | None = None
        """The env-runner processes (with ``num_env_runners`` >= 1)."""
        try:
            self._start_sampling(config.seed)
        except BaseException:
            self.source.close()
            close_learners(self.learners)
            raise
        self._eval: Evaluator | None = None
        self.run: RunFolder | None = None
        self._metrics: MetricsWriter | None = None
        self._progress = ProgressLine(config.progress)
        self.server: AttachedServer | None = None
        try:
            if resume is not None:
                self.run = RunFolder(Path(resume)).hold(IN_USE_RESUME)
            elif config.run_dir is not None:
                self.run = RunFolder.create(config.run_dir, config.run_name).hold(IN_USE_NEW)
            if self.run is not None:
                self._write_run_files(self.run.path)
                self._metrics = MetricsWriter(self.run.path)
            if config.serving_settings is not None:
                self._attach_server(resume=resume is not None)
        except BaseException:
            self.callbacks = CallbackList([])  # never told of the start: not of this stop
            self.stop()
            raise
        self.callbacks.fire("on_algorithm_init", algorithm=self)

    # -- the training loop -------------------------------------------------------------------

    def train(self) -> dict[str, Any]:
        """Sample and update until ``min_env_steps_per_iteration`` steps; return the results."""
        started = time.perf_counter()
        self._episodes_this_iter = 0
        sampled = 0
        network_steps = 0
        batch = min(learner.sample_steps for learner in self.learners.values())
        while sampled < self.config.min_env_steps_per_iteration:
            through = None
            for sampler in self.samplers:
                round_ = sampler.sample(batch, self._packages)
                sampled += round_.env_steps
                network_steps += round_.client_steps
                for summary in round_.summaries:
                    self._episode_done(summary)
                self.driver.take(round_.fragments)
                if round_.log_position is not None:
                    through = round_.log_position
            self.driver.ingest(through)
            for pid in self.driver.train():
                self._packages[pid] = self.learners[pid].weights()
                self._publish(pid, self._packages[pid])
        self.env_steps_sampled += sampled
        self.iteration += 1
        elapsed = time.perf_counter() - started
        self.time_total_s += elapsed
        result = self._result(sampled, network_steps, elapsed)
        interval = self.config.evaluation_interval
        if interval and self.iteration % interval == 0:
            result.update(self.evaluate())  # RLlib's place for it: result["evaluation"]
        self.callbacks.fire("on_train_result", algorithm=self, result=result)
        report(
            result,
            self._metrics,
            self._progress,
            self.env_steps_sampled,
            self.iteration,
            self.episodes_total,
        )
        if (
            self.run is not None
            and self.config.checkpoint_every
            and self.iteration % self.config.checkpoint_every == 0
        ):
            self._checkpoint(self.run.path)
        return result

    @property
    def samplers(self) -> list[Sampler]:
        """Where each round's experience comes from: the environments, then the clients."""
        envs = self._env_sampler
        return [envs] if self.server is None else [envs, self.server]

    def _start_sampling(self, seed: int, episodes_failed: int = 0) -> None:
        """Start the environments' sampler (and the acting policies) from ``seed``."""
        self.local = LocalSampler(
            self.source,
            self.table,
            {pid: self._numpy_policy(package) for pid, package in self._packages.items()},
            self.config.rollout_fragment_length,
            seed,
            episodes_failed,
        )
        """Samples in this process (with ``num_env_runners=0``); acts for compute_actions."""
        if self.config.num_env_runners:
            self.runners = RunnerGroup(
                self.config, self.table, self._packages, seed, episodes_failed
            )
        self._env_sampler: Sampler = self.local if self.runners is None else self.runners

    def _updated(self, policy: PolicyLearner, metrics: dict[str, float]) -> None:
        self._learner_metrics[policy.policy_id] = metrics

    def _publish(self, policy_id: str, package: WeightsPackage) -> None:
        self.collector.set_policy(policy_id, self._numpy_policy(package))
        if self.server is not None:
            self.server.publish(policy_id, package)

    @property
    def collector(self) -> Collector:
        """The collector whose policies act (and sample, with ``num_env_runners=0``)."""
        return self.local.collector

    def _numpy_policy(self, package: WeightsPackage) -> NumpyPolicy:
        seed = int(self._seeds.spawn(1)[0].generate_state(1, np.uint64)[0])
        return NumpyPolicy(package.spec, package.arrays, package.version, seed=seed)

    def _episode_done(self, summary: EpisodeSummary) -> None:
        self.callbacks.fire("on_episode_end", algorithm=self, episode=summary)
        if not summary.training_enabled:
            return
        self._returns.append(summary.episode_return)
        self._lengths.append(summary.length)
        self._episodes_this_iter += 1
        self.episodes_total += 1

    def _result(self, sampled: int, network_steps: int, elapsed: float) -> dict[str, Any]:
        runners = {
            **episode_stats(list(self._returns), list(self._lengths)),
            "num_episodes": self._episodes_this_iter,
            "num_env_steps_sampled": sampled,
            "num_env_steps_sampled_lifetime": self.env_steps_sampled,
            "episodes_failed": self._episodes_failed,
            "num_healthy_env_runners": sum(s.num_healthy for s in self.samplers),
            "num_env_runner_restarts": sum(s.restarts for s in self.samplers),
        }
        return iteration_result(
            self.iteration,
            runners,
            self._learner_metrics,
            network_steps,
            self.env_steps_sampled,
            elapsed,
            self.time_total_s,
            learner_restarts(self.learners),
        )

    @property
    def _episodes_failed(self) -> int:
        return sum(sampler.episodes_failed for sampler in self.samplers)

    # -- acting (compute_single_action and compute_actions: ActingMixin) ----------------------

    def _acting_policy(self, policy_id: str) -> NumpyPolicy:
        """The policy copy that computes actions for :meth:`compute_actions`."""
        return self.collector.policy_of(policy_id)

    def evaluate(self, episodes: int | None = None) -> dict[str, Any]:
        """Run ``episodes`` (default ``evaluation_duration``) greedy episodes, not trained on.

        They run on their own copy of the environment, so training's episodes are not
        disturbed.

        Raises:
            ValueError: ``episodes`` is below 1.
        """
        wanted = self.config.evaluation_duration if episodes is None else episodes
        if isinstance(wanted, bool) or not isinstance(wanted, int) or wanted < 1:
            raise ValueError(
                f"evaluate(episodes={episodes!r}): pass a whole number of episodes, 1 or more"
            )
        if self._eval is None:
            seed = self.config.seed + 1_000_003
            self._eval = Evaluator(
                make_source(self.config, seed=seed, evaluation=True),
                self.table,
                self._acting_policies(),
                self.config.rollout_fragment_length,
                seed,
            )
        return self._eval.run(wanted, self._acting_policies())

    def _acting_policies(self) -> dict[str, NumpyPolicy]:
        return {pid: self.collector.policy_of(pid) for pid in self.specs}

    # -- checkpoints (save, restore, use_run_folder: CheckpointMixin) -------------------------

    @classmethod
    def from_checkpoint(
        cls,
        checkpoint_dir: str | Path,
        config: AlgorithmConfig | None = None,
        *,
        trust_code: bool = False,
    ) -> Algorithm:
        """An Algorithm restored from a checkpoint folder.

        The environment is found again from the saved configuration when it was a registered
        id or an importable class (``module:Class``); otherwise pass ``config`` (the same
        environment and settings) explicitly. A saved function (an env creator, a
        ``policy_mapping_fn``) is imported only with ``trust_code=True``: a folder may come
        from anyone, and the function would be called with arguments the folder chooses.

        With a server attached, and the folder the run folder it served from, the server
        continues that run: clients find the same weights versions, and what it logged after
        the checkpoint is trained on. A run folder of ``rlserve serve`` (or of an Algorithm
        without an environment) resumes that run.
        """
        folder = Path(checkpoint_dir)
        if not (folder / STATE_FILE).exists() and (folder / "experience").is_dir():
            # A run folder of a network-only Algorithm (rlserve serve): resume it.
            chosen = config or run_folder_config(folder, trust_code)
            return assemble(chosen.copy(), resume=folder)
        chosen = (config or load_config(folder, trust_code)).copy()
        served = chosen.serving_settings is not None and (folder / "experience").is_dir()
        algo = cls(chosen, resume=folder if served else None)
        try:
            algo.restore(folder)
        except BaseException:
            algo.stop()  # its runners, server and run-folder lock
            raise
        return algo

    # -- serving -----------------------------------------------------------------------------

    def _attach_server(self, resume: bool = False) -> None:
        from rlserve.algorithm.serving import AttachedServer
        from rlserve.algorithm.serving_settings import ServingSettings

        if self.run is None:
            self.run = RunFolder.create(self.config.run_dir or "runs", self.config.run_name)
            self.run.hold(IN_USE_NEW)
            self._write_run_files(self.run.path)
        settings = ServingSettings(**(self.config.serving_settings or {}))
        self.server = AttachedServer(
            settings,
            self.specs,
            self.run,
            mapping=self.mapping,
            fragment_length=self.config.rollout_fragment_length,
            seed=self.config.seed,
            resume=resume,
            algo=self.config.algo_name,
            frame_stacks=self.frame_stacks,
        )
        self.server.start()
        for pid, learner in self.learners.items():
            self.server.publish(pid, learner.weights())

    @property
    def address(self) -> str | None:
        """The attached server's address (``host:port``), or None without one."""
        return None if self.server is None else str(self.server.address)

    def stop(self) -> None:
        """Close the environments, server and metrics files; tell callbacks; release the run."""
        try:
            for sampler in reversed(self.samplers):
                sampler.stop()
            self.server = self.runners = None
            self.source.close()
            close_learners(self.learners)
            if self._eval is not None:
                self._eval.close()
                self._eval = None
            if self._metrics is not None:
                self._metrics.close()
                self._metrics = None
            self._progress.finish()
            callbacks, self.callbacks = self.callbacks, CallbackList([])
            callbacks.fire("on_algorithm_stop", algorithm=self)
        finally:
            if self.run is not None:
                self.run.release()  # whatever failed above, the folder is free again

    def __enter__(self) -> Algorithm:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
