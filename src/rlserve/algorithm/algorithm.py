"""The Algorithm: env runners, a collector and learners in one object (RLlib's ``Algorithm``).

``train()`` is synchronous, as on-policy PPO wants it: sample a round of steps with the current
weights, cut every open episode there (so a batch holds only those weights' steps), update each
policy's learner that is ready, and hand the new weights to the collector; repeat until
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

import json
import logging
import time
from collections import deque
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from rlserve.algorithm.config import AlgorithmConfig
from rlserve.algorithm.runner_group import RunnerGroup, local_source
from rlserve.algorithm.sources import make_source, source_policies
from rlserve.config.fields import to_table
from rlserve.env.base import EnvSource
from rlserve.env.runner import EnvRunner
from rlserve.errors import ConfigError
from rlserve.experience.agent_values import PolicyTable
from rlserve.experience.collector import Collector
from rlserve.experience.episodes import EpisodeSummary
from rlserve.learners.registry import DEFAULT_ALGORITHM, algorithm
from rlserve.policy import NumpyPolicy
from rlserve.policy.action_layout import actions_to_space
from rlserve.policy.weights import WeightsPackage
from rlserve.protocol.episode_requests import DEFAULT_POLICY_ID
from rlserve.protocol.fragment import Fragment
from rlserve.protocol.mapping import PolicyMapping
from rlserve.protocol.spaces import check_batch, describe
from rlserve.run.checkpoints import checkpoint_path, prune
from rlserve.run.durable import atomic_write_bytes
from rlserve.run.metrics import MetricsWriter, ProgressLine
from rlserve.run.run_folder import RunFolder
from rlserve.server.policies import PolicySpec, is_flat, policy_paths, run_folder_form

logger = logging.getLogger("rlserve.algorithm")

RETURN_WINDOW = 100
"""Episodes in the moving window of ``episode_return_mean``."""

MAX_UPDATES_PER_ROUND = 64
"""Updates of one learner after one round of sampling at most: an off-policy learner that is
still ready after an update has a backlog (more steps came in than one round trains on)."""

STATE_FILE = "algorithm.json"
"""The Algorithm's own counters in a checkpoint folder (next to the learners' files)."""

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
    "env_runners/num_healthy_env_runners": "env-runner processes alive (0: sampling in-process)",
    "env_runners/num_env_runner_restarts": (
        "env-runner processes restarted after a failure since this Algorithm was built or restored"
    ),
    "learners/<policy id>/<name>": "each policy's learner metrics of its last update",
    "num_env_steps_sampled_lifetime": "as env_runners/num_env_steps_sampled_lifetime",
    "network/num_env_steps": "steps network clients contributed in this iteration",
    "time_this_iter_s": "seconds this iteration took",
    "time_total_s": "seconds of train() since the start",
    "episode_return_mean": "as env_runners/episode_return_mean (old RLlib name)",
    "episode_reward_mean": "as env_runners/episode_return_mean (old RLlib name)",
    "timesteps_total": "as num_env_steps_sampled_lifetime (old RLlib name)",
}
"""Every key of :meth:`Algorithm.train`'s result (``a/b`` is ``result["a"]["b"]``)."""


class Algorithm:
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
        self._log_trained_through = 0
        self.iteration = 0
        self.env_steps_sampled = 0
        self.episodes_total = 0
        self.time_total_s = 0.0
        self._returns: deque[float] = deque(maxlen=RETURN_WINDOW)
        self._lengths: deque[int] = deque(maxlen=RETURN_WINDOW)
        self._episodes_this_iter = 0
        self._fragments: list[Fragment] = []
        self._seeds = np.random.SeedSequence(config.seed)
        if config.num_env_runners:
            self.source: EnvSource = local_source(config, seed=config.seed)
        else:
            self.source = make_source(config, seed=config.seed)
        self.specs, self.mapping = source_policies(config, self.source)
        self.algorithms = {
            pid: spec.algorithm_of(config.algo_name) for pid, spec in self.specs.items()
        }
        """Each policy's algorithm, by id."""
        self.learners = {
            pid: algorithm(self.algorithms[pid]).make_learner(
                spec.observation_space,
                spec.action_space,
                config.policy_settings(
                    self.algorithms[pid], {**spec.config, "seed": config.seed + index}
                ),
            )
            for index, (pid, spec) in enumerate(self.specs.items())
        }
        self._learner_metrics: dict[str, dict[str, float]] = {pid: {} for pid in self.learners}
        self.table = _policy_table(self.specs, self.mapping)
        self._packages = {pid: learner.weights() for pid, learner in self.learners.items()}
        self.collector = self._make_collector()
        self.runner = EnvRunner(self.source, self.collector, seed=config.seed)
        """Samples in this process (with ``num_env_runners=0``)."""
        self.runners: RunnerGroup | None = None
        """The env-runner processes (with ``num_env_runners`` >= 1)."""
        if config.num_env_runners:
            try:
                self.runners = RunnerGroup(config, self.table, self._packages, config.seed)
            except BaseException:
                self.source.close()
                raise
        self._eval: tuple[EnvRunner, list[EpisodeSummary]] | None = None
        self.run: RunFolder | None = None
        self._metrics: MetricsWriter | None = None
        self._progress = ProgressLine(config.progress)
        if resume is not None:
            self.run = RunFolder(Path(resume))
            self._write_run_files(self.run.path)
            self._metrics = MetricsWriter(self.run.path)
        elif config.run_dir is not None:
            self.run = RunFolder.create(config.run_dir, config.run_name)
            self._write_run_files(self.run.path)
            self._metrics = MetricsWriter(self.run.path)
        self.server: Any = None
        if config.serving_settings is not None:
            self._attach_server(resume=resume is not None)

    # -- the training loop -------------------------------------------------------------------

    def train(self) -> dict[str, Any]:
        """Sample and update until ``min_env_steps_per_iteration`` steps; return the results."""
        started = time.perf_counter()
        self._episodes_this_iter = 0
        sampled = 0
        network_steps = 0
        batch = min(learner.sample_steps for learner in self.learners.values())
        while sampled < self.config.min_env_steps_per_iteration:
            if self.runners is not None:
                round_ = self.runners.sample(batch, self._packages)
                sampled += round_.env_steps
                fragments = round_.fragments
                for summary in round_.summaries:
                    self._episode_done(summary)
            else:
                sampled += self.runner.sample(batch)
                self.runner.cut()
                fragments, self._fragments[:] = list(self._fragments), []
            through = None
            if self.server is not None:
                taken, summaries = self.server.take(batch)
                through = self.server.taken_through
                network_steps += sum(len(f) for f in taken)
                fragments += taken
                for summary in summaries:
                    self._episode_done(summary)
            self._update(fragments)
            if through is not None and not any(
                learner.buffered_steps for learner in self.learners.values()
            ):
                # Every log record through `through` is now in the learners' weights.
                self._log_trained_through = through
        self.env_steps_sampled += sampled
        self.iteration += 1
        elapsed = time.perf_counter() - started
        self.time_total_s += elapsed
        result = self._result(sampled, network_steps, elapsed)
        self._report(result)
        if (
            self.run is not None
            and self.config.checkpoint_every
            and self.iteration % self.config.checkpoint_every == 0
        ):
            self._checkpoint(self.run.path)
        return result

    def _update(self, fragments: list[Fragment]) -> None:
        by_policy: dict[str, list[Fragment]] = {}
        for fragment in fragments:
            by_policy.setdefault(fragment.policy_id, []).append(fragment)
        for pid, own in by_policy.items():
            learner = self.learners.get(pid)
            if learner is not None:
                learner.ingest(own)
        for pid, learner in self.learners.items():
            updated = False
            for _ in range(MAX_UPDATES_PER_ROUND):
                if not learner.ready():
                    break
                self._learner_metrics[pid] = learner.update()
                updated = True
            if updated:
                self._packages[pid] = learner.weights()
                self._publish(pid, self._packages[pid])

    def _publish(self, policy_id: str, package: WeightsPackage) -> None:
        self.collector.set_policy(policy_id, self._numpy_policy(package))
        if self.server is not None:
            self.server.publish(policy_id, package)

    def _make_collector(self) -> Collector:
        return Collector(
            self.table,
            {pid: self._numpy_policy(package) for pid, package in self._packages.items()},
            self.config.rollout_fragment_length,
            max(1024, 4 * _num_envs(self.source)),
            self._fragments.append,
            self._episode_done,
        )

    def _numpy_policy(self, package: WeightsPackage) -> NumpyPolicy:
        seed = int(self._seeds.spawn(1)[0].generate_state(1, np.uint64)[0])
        return NumpyPolicy(package.spec, package.arrays, package.version, seed=seed)

    def _episode_done(self, summary: EpisodeSummary) -> None:
        if not summary.training_enabled:
            return
        self._returns.append(summary.episode_return)
        self._lengths.append(summary.length)
        self._episodes_this_iter += 1
        self.episodes_total += 1

    def _result(self, sampled: int, network_steps: int, elapsed: float) -> dict[str, Any]:
        returns = list(self._returns)
        mean = float(np.mean(returns)) if returns else float("nan")
        runners = {
            "episode_return_mean": mean,
            "episode_return_min": float(min(returns)) if returns else float("nan"),
            "episode_return_max": float(max(returns)) if returns else float("nan"),
            "episode_len_mean": float(np.mean(self._lengths)) if returns else float("nan"),
            "num_episodes": self._episodes_this_iter,
            "num_env_steps_sampled": sampled,
            "num_env_steps_sampled_lifetime": self.env_steps_sampled,
            "episodes_failed": self._episodes_failed,
            "num_healthy_env_runners": 0 if self.runners is None else self.runners.num_healthy,
            "num_env_runner_restarts": 0 if self.runners is None else self.runners.restarts,
        }
        learners = {
            pid: {k.removeprefix("learner/"): v for k, v in metrics.items()}
            for pid, metrics in self._learner_metrics.items()
        }
        return {
            "training_iteration": self.iteration,
            "env_runners": runners,
            "learners": learners,
            "network": {"num_env_steps": network_steps},
            "num_env_steps_sampled_lifetime": self.env_steps_sampled,
            "time_this_iter_s": elapsed,
            "time_total_s": self.time_total_s,
            "episode_return_mean": mean,
            "episode_reward_mean": mean,
            "timesteps_total": self.env_steps_sampled,
        }

    def _report(self, result: dict[str, Any]) -> None:
        runners = result["env_runners"]
        if self._metrics is not None:
            flat = {f"episodes/{k}": float(v) for k, v in runners.items()}
            for pid, metrics in result["learners"].items():
                prefix = "learner" if pid == DEFAULT_POLICY_ID else f"policies/{pid}/learner"
                flat.update({f"{prefix}/{k}": float(v) for k, v in metrics.items()})
            flat["time/iteration_seconds"] = result["time_this_iter_s"]
            self._metrics.write(flat, self.env_steps_sampled)
        mean = runners["episode_return_mean"]
        shown = "n/a" if mean != mean else f"{mean:.1f}"
        rate = runners["num_env_steps_sampled"] / max(result["time_this_iter_s"], 1e-9)
        self._progress.show(
            f"iter {self.iteration}  steps {self.env_steps_sampled:,}  "
            f"return(100) {shown}  episodes {self.episodes_total:,}  {rate:,.0f} steps/s"
        )

    @property
    def _episodes_failed(self) -> int:
        if self.runners is not None:
            return self.runners.episodes_failed
        return self.runner.episodes_failed

    # -- acting ------------------------------------------------------------------------------

    def compute_single_action(
        self, observation: Any, *, explore: bool = False, policy_id: str | None = None
    ) -> Any:
        """The action of one observation (greedy unless ``explore``), as the env takes it."""
        spec = self.specs.get(policy_id or self._default_policy)
        if spec is None:
            raise ConfigError(f"no policy '{policy_id}'; the policies are {sorted(self.specs)}")
        space = spec.observation_space
        batch = (
            np.asarray(observation)[None] if isinstance(space, gym.spaces.Box) else [observation]
        )
        return self._compute(batch, 1, explore, policy_id)[0]

    def compute_actions(
        self, observations: Any, *, explore: bool = False, policy_id: str | None = None
    ) -> Any:
        """The actions of a batch of observations (an array ``[N, ...]`` for a Box, else a list)."""
        count = len(observations)
        return self._compute(observations, count, explore, policy_id)

    def _compute(self, observations: Any, count: int, explore: bool, policy_id: str | None) -> Any:
        pid = policy_id or self._default_policy
        if pid not in self.specs:
            raise ConfigError(f"no policy '{pid}'; the policies are {sorted(self.specs)}")
        spec = self.specs[pid]
        obs = _cast_box(spec.observation_space, observations)
        checked = check_batch(spec.observation_space, obs, count, "observation")
        policy = self._acting_policy(pid)
        out = policy.compute_actions(checked, explore)
        sent = policy.to_env_actions(out.actions)
        if isinstance(spec.action_space, gym.spaces.Discrete):
            return [int(a) for a in sent]
        return actions_to_space(spec.action_space, sent)

    def _acting_policy(self, policy_id: str) -> NumpyPolicy:
        """The policy copy that computes actions for :meth:`compute_actions`."""
        return self.collector.policy_of(policy_id)

    @property
    def _default_policy(self) -> str:
        return DEFAULT_POLICY_ID if DEFAULT_POLICY_ID in self.specs else next(iter(self.specs))

    def evaluate(self, episodes: int | None = None) -> dict[str, Any]:
        """Run ``episodes`` (default ``evaluation_duration``) greedy episodes, not trained on.

        They run on their own copy of the environment, so training's episodes are not
        disturbed.
        """
        wanted = episodes or self.config.evaluation_duration
        if self._eval is None:
            finished: list[EpisodeSummary] = []
            source = make_source(self.config, seed=self.config.seed + 1_000_003, evaluation=True)
            collector = Collector(
                self.table,
                {pid: self.collector.policy_of(pid) for pid in self.specs},
                self.config.rollout_fragment_length,
                1024,
                lambda _fragment: None,
                finished.append,
            )
            collector.explore = False
            runner = EnvRunner(
                source, collector, training_enabled=False, seed=self.config.seed + 1_000_003
            )
            self._eval = (runner, finished)
        runner, finished = self._eval
        for pid in self.specs:
            runner.collector.set_policy(pid, self.collector.policy_of(pid))
        finished.clear()
        while len(finished) < wanted:
            runner.sample(1)
        done = finished[:wanted]
        returns = [s.episode_return for s in done]
        return {
            "evaluation": {
                "env_runners": {
                    "episode_return_mean": float(np.mean(returns)),
                    "episode_return_min": float(min(returns)),
                    "episode_return_max": float(max(returns)),
                    "episode_len_mean": float(np.mean([s.length for s in done])),
                    "num_episodes": len(done),
                }
            }
        }

    # -- checkpoints -------------------------------------------------------------------------

    def save(self, checkpoint_dir: str | Path | None = None) -> Path:
        """Write a checkpoint folder (a run folder ``rlserve export`` reads) and return it.

        Without ``checkpoint_dir``: into the run folder when there is one, else a new folder
        under ``runs/``. Episodes in flight are not part of it: a restored Algorithm starts
        fresh episodes (their environments are reset with a seed derived from the iteration).
        """
        if checkpoint_dir is None:
            if self.run is None:
                self.run = RunFolder.create("runs", None)
                self._write_run_files(self.run.path)
            folder = self.run.path
        else:
            folder = Path(checkpoint_dir)
            folder.mkdir(parents=True, exist_ok=True)
            self._write_run_files(folder)
        self._checkpoint(folder)
        return folder

    def _checkpoint(self, folder: Path) -> None:
        flat = is_flat(self.specs)
        files = {}
        for pid, learner in self.learners.items():
            checkpoints = policy_paths(folder, pid, flat).checkpoints
            checkpoints.mkdir(parents=True, exist_ok=True)
            path = checkpoint_path(checkpoints, learner.counters()["updates"])
            learner.save(path, {"iteration": self.iteration})
            prune(checkpoints, self.config.keep_checkpoints)
            files[pid] = str(path.relative_to(folder))
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
            "log_trained_through": self._log_trained_through,
        }
        atomic_write_bytes(folder / STATE_FILE, json.dumps(state, indent=2).encode())
        if self.server is not None and self.run is not None and _same(folder, self.run.path):
            # The checkpoint holds what the log held through this point: it may go.
            self.server.release_log(self._log_trained_through)

    def restore(self, checkpoint_dir: str | Path) -> None:
        """Load the learners and counters of a checkpoint folder written by :meth:`save`.

        The environments start fresh episodes, seeded from the restored iteration, so two
        restores of one checkpoint continue identically.
        """
        folder = Path(checkpoint_dir)
        try:
            state = json.loads((folder / STATE_FILE).read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(
                f"{folder} is not an Algorithm checkpoint ({STATE_FILE} unreadable: {exc}); "
                "pass the folder algo.save() returned"
            ) from exc
        saved_algorithms = state.get("algorithms") or {}
        for pid in self.learners:
            relative = state["checkpoints"].get(pid)
            if relative is None:
                raise ConfigError(f"{folder} has no checkpoint of the policy '{pid}'")
            before = saved_algorithms.get(pid, self.algorithms[pid])
            if before != self.algorithms[pid]:
                raise ConfigError(
                    f"the checkpoint of policy '{pid}' in {folder} is {before}'s, and this "
                    f"Algorithm trains it with {self.algorithms[pid]}, which cannot continue "
                    f"it; declare the policy with algo='{before}' (or restore without a config: "
                    "Algorithm.from_checkpoint(folder)), or start a new run"
                )
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
        self._fragments.clear()
        seed = self.config.seed + 7919 * self.iteration
        failed = int(state.get("episodes_failed", 0))
        self._packages = {pid: learner.weights() for pid, learner in self.learners.items()}
        if self.runners is None:
            self.source.close()
            self.source = make_source(self.config, seed=seed)
        self.collector = self._make_collector()
        self.runner = EnvRunner(self.source, self.collector, seed=seed)
        if self.runners is None:
            self.runner.episodes_failed = failed
        else:
            self.runners.stop()
            self.runners = RunnerGroup(self.config, self.table, self._packages, seed, failed)
        if self.server is not None:
            for pid, learner in self.learners.items():
                self.server.publish(pid, learner.weights())
            if self.run is not None and _same(folder, self.run.path):
                # Resuming the server's own run: what it logged past the checkpoint is trained.
                self._log_trained_through = int(state.get("log_trained_through", 0))
                self.server.requeue_after(self._log_trained_through)

    @classmethod
    def from_checkpoint(
        cls, checkpoint_dir: str | Path, config: AlgorithmConfig | None = None
    ) -> Algorithm:
        """An Algorithm restored from a checkpoint folder.

        The environment is found again from the saved configuration when it was a registered
        id or an importable class/function (``module:name``); otherwise pass ``config`` (the
        same environment and settings) explicitly. With a server attached, and the folder the
        run folder it served from, the server continues that run: clients find the same
        weights versions, and what it logged after the checkpoint is trained on. A run folder
        of ``rlserve serve`` (or of an Algorithm without an environment) resumes that run.
        """
        from rlserve.algorithm.saved_config import load_config

        folder = Path(checkpoint_dir)
        if not (folder / STATE_FILE).exists() and (folder / "experience").is_dir():
            # A run folder of a network-only Algorithm (rlserve serve): resume it.
            from rlserve.algorithm.network import NetworkAlgorithm, run_folder_config

            return NetworkAlgorithm((config or run_folder_config(folder)).copy(), resume=folder)
        chosen = (config or load_config(folder)).copy()
        served = chosen.serving_settings is not None and (folder / "experience").is_dir()
        algo = cls(chosen, resume=folder if served else None)
        algo.restore(folder)
        return algo

    def _write_run_files(self, folder: Path) -> None:
        from rlserve.algorithm.saved_config import save_config

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
        self.run = RunFolder(Path(folder))
        if self._metrics is not None:
            self._metrics.close()
        self._metrics = MetricsWriter(self.run.path)
        if progress is not None:
            self._progress = ProgressLine(progress)

    # -- serving -----------------------------------------------------------------------------

    def _attach_server(self, resume: bool = False) -> None:
        from rlserve.algorithm.serving import AttachedServer, ServingSettings

        if self.run is None:
            self.run = RunFolder.create(self.config.run_dir or "runs", self.config.run_name)
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
        )
        self.server.start()
        for pid, learner in self.learners.items():
            self.server.publish(pid, learner.weights())

    @property
    def address(self) -> str | None:
        """The attached server's address (``host:port``), or None without one."""
        return None if self.server is None else str(self.server.address)

    def stop(self) -> None:
        """Close the environments, the attached server and the metrics files."""
        if self.server is not None:
            self.server.stop()
            self.server = None
        if self.runners is not None:
            self.runners.stop()
            self.runners = None
        self.source.close()
        if self._eval is not None:
            self._eval[0].source.close()
            self._eval = None
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None
        self._progress.finish()

    def __enter__(self) -> Algorithm:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _policy_table(specs: dict[str, PolicySpec], mapping: PolicyMapping | None) -> PolicyTable:
    """The collector's view of the policies (the form a server's ``welcome`` gives a client)."""
    welcome = {
        "policies": {
            pid: {
                "observation_space": describe(s.observation_space),
                "action_space": describe(s.action_space),
            }
            for pid, s in specs.items()
        },
        "mapping": None if mapping is None else mapping.to_wire(),
        "multi_agent": True,
    }
    return PolicyTable(welcome)


def _same(a: Path, b: Path) -> bool:
    return a.resolve() == b.resolve()


def _num_envs(source: EnvSource) -> int:
    return int(getattr(source, "num_envs", 1))


def _cast_box(space: gym.Space[Any], observations: Any) -> Any:
    """Box observations in the space's float dtype (RLlib accepts float64 for float32)."""
    if isinstance(space, gym.spaces.Box):
        array = np.asarray(observations)
        if array.dtype != space.dtype and array.dtype.kind == "f":
            return array.astype(space.dtype)
        return array
    return observations
