"""The Algorithm without environments: network clients are its only source (``rlserve serve``).

``PPOConfig().environment(observation_space=..., action_space=...).serving(port=9900).build()``
(RLlib's policy-server example, ``env=None`` with the spaces given) makes a
:class:`NetworkAlgorithm`. It is the ``rlserve serve`` machinery behind the Algorithm API: a
:class:`~rlserve.server.app.PolicyServer` (both carriers, token, TLS, metrics, the durable
experience log, the batch ledger) whose learner is a supervised process reading that log, so
an update never pauses serving, and a kill -9 of either process loses nothing acknowledged.

Training is therefore asynchronous: the learner trains whenever a batch is ready, and
:meth:`NetworkAlgorithm.train` waits until it has trained ``min_env_steps_per_iteration`` more
steps, then reports (the keys of :data:`~rlserve.algorithm.algorithm.RESULT_KEYS`). The run
folder is the checkpoint: :meth:`NetworkAlgorithm.save` has the learner checkpoint every
policy into it, and :meth:`Algorithm.from_checkpoint` on it resumes the run (``rlserve serve
--resume``). ``rlserve serve`` builds this same object from its flags and config file and runs
it on the main thread (:meth:`NetworkAlgorithm.serve_forever`); a script's ``build()`` serves
from a background thread so it can call ``train()``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from rlserve.algorithm.algorithm import Algorithm
from rlserve.algorithm.callbacks import CallbackList, CallbackThread, callback_list
from rlserve.algorithm.config import AlgorithmConfig
from rlserve.algorithm.network_config import (
    mapping_function_table,
    network_policies,
    server_config_of,
)
from rlserve.algorithm.network_ray import front_end_argv, ray_serving_of, save_ray_placement
from rlserve.algorithm.server_thread import ServerThread
from rlserve.config.fields import to_table
from rlserve.errors import ConfigError
from rlserve.experience.episode_records import EpisodeSummary
from rlserve.learners.registry import DEFAULT_ALGORITHM
from rlserve.policy import NumpyPolicy
from rlserve.run.run_folder import IN_USE_NEW, IN_USE_RESUME, RunFolder
from rlserve.server.app import PolicyServer, install_uvloop, serve_forever
from rlserve.server.learner_link import LearnerLink
from rlserve.server.policies import check_same_algorithms, run_folder_form
from rlserve.server.policies_config import check_policies

TRAIN_POLL_S = 0.05
"""Seconds between looks at the learner's progress while :meth:`NetworkAlgorithm.train` waits."""

FIRST_WEIGHTS_TIMEOUT = 120.0
"""Seconds ``compute_single_action`` waits for the learner's first weights after the start."""

MAX_LEARNER_RESTARTS_PER_ITERATION = 3
"""Learner-process deaths within one ``train()`` after which it raises instead of waiting."""

REPORT_POLL_S = 0.5
"""Seconds between looks at the learner's progress for ``rlserve serve``'s periodic results."""

SAVE_TIMEOUT = 120.0
"""Seconds :meth:`NetworkAlgorithm.save` waits for every policy's checkpoint."""

REQUEST_AGAIN_S = 5.0
"""Seconds after which :meth:`NetworkAlgorithm.save` asks again (a restarting learner missed it)."""


class NetworkAlgorithm(Algorithm):
    """An Algorithm whose only source is its network server's clients (see the module doc).

    Args:
        config: Its settings (no environment; spaces and ``serving`` given).
        resume: A run folder of an earlier run to continue (``rlserve serve --resume``).
        background: Serve at once from a background thread (a script's ``build()``); False:
            the caller runs :meth:`serve_forever` on its own thread (``rlserve serve``).
        learner_link: Makes the server's learner link (None: a learner process, or with
            ``serving(ray_address=...)`` a Ray actor and ``replicas`` front-ends, see
            :mod:`rlserve.algorithm.network_ray`; ``rlserve serve --ray`` passes its own).
    """

    def __init__(
        self,
        config: AlgorithmConfig,
        *,
        resume: str | Path | None = None,
        background: bool = True,
        learner_link: Callable[..., Any] | None = None,
    ):
        if config.evaluation_interval:
            raise ConfigError(
                "evaluation(evaluation_interval=...): an Algorithm without an environment has "
                "nothing to evaluate on; drop it (clients evaluate with "
                "start_episode(training_enabled=False)), or build with .environment(env)"
            )
        self._learner_link = learner_link
        self.config = config
        self.iteration = 0
        self.time_total_s = 0.0
        self.specs, self.mapping = network_policies(config)
        self.server_config = server_config_of(config)
        self._replicas: Any = None
        on_ray = None
        if learner_link is None:
            on_ray = ray_serving_of(config, self.server_config, resume)
        if on_ray is not None:  # .serving(ray_address=...): what rlserve serve --ray does
            self.server_config = on_ray.server_config
            self._learner_link = on_ray.learner_link
        algo = config.algo_name
        ppo_table = to_table(config.algo_settings())
        used = {spec.algorithm_of(algo) for spec in self.specs.values()} - {algo}
        others = {name: to_table(config.policy_settings(name)) for name in sorted(used)}
        check_policies(self.specs, ppo_table, algo, others)
        self.frame_stacks = {
            pid: int(config.policy_settings(spec.algorithm_of(algo), spec.config).frame_stack)
            for pid, spec in self.specs.items()
        }
        if resume is not None:
            folder = RunFolder.existing(resume).hold(IN_USE_RESUME)
        else:
            folder = RunFolder.create(self.server_config.run_dir, self.server_config.name)
            folder.hold(IN_USE_NEW)
        self.folder = folder
        """The run folder (the same as :attr:`run`, never None here), locked until :meth:`stop`
        (or :meth:`serve_forever` returns)."""
        self.run = folder
        try:
            self._open(resume, algo, ppo_table, others)
            if background:
                self._serve_in_background()
                if on_ray is not None:
                    save_ray_placement(config, folder.path)
                    self._replicas = on_ray.replicas(front_end_argv(folder.path))
                if self._replicas is not None:
                    self._replicas.start(folder.path)
        except BaseException:
            if self._replicas is not None:
                self._replicas.close()
            thread = getattr(self, "_thread", None)
            if thread is not None:
                thread.stop()
            folder.release()
            raise
        self.callbacks.fire("on_algorithm_init", algorithm=self)

    def _open(
        self,
        resume: str | Path | None,
        algo: str,
        ppo_table: dict[str, Any],
        others: dict[str, dict[str, Any]],
    ) -> None:
        """Write the run's settings into the locked folder; make the server and callbacks."""
        config, folder = self.config, self.folder
        if resume is not None:
            saved, _ = folder.load()
            check_same_algorithms(saved, self.specs, algo)
        tables, spaces = run_folder_form(self.specs, self.mapping, algo)
        own = {algo: ppo_table, **others}
        if algo != DEFAULT_ALGORITHM:
            own["algorithm"] = {"name": algo}
        if config.policy_mapping_fn is not None:
            tables["mapping_function"] = mapping_function_table(config.policy_mapping_fn)
        folder.save({"server": to_table(self.server_config), **own, **tables}, spaces)
        self.policy_server = PolicyServer(
            self.server_config,
            ppo_table,
            self.specs,
            folder,
            mapping=self.mapping,
            resume=resume is not None,
            algo=algo,
            algo_tables=others,
            mapping_fn=config.policy_mapping_fn,
            learner_link=self._learner_link or LearnerLink,
        )
        self.server = None  # no attached in-process server: the policy server is the source
        self._thread: ServerThread | None = None
        self._acting: dict[str, NumpyPolicy] = {}
        self.callbacks: CallbackList = callback_list(config, self.server_config.callbacks)
        """The callbacks (``config.callbacks``, and ``--callbacks`` of ``rlserve serve``)."""
        self._events: CallbackThread | None = None
        if self.callbacks:
            self._listen()

    # -- callbacks ---------------------------------------------------------------------------

    def _listen(self) -> None:
        """Have the server's episode ends and checkpoints reach the callbacks (off its loop)."""
        events = self._events = CallbackThread(self.callbacks)

        def episode_ended(summary: EpisodeSummary) -> None:
            events.post("on_episode_end", algorithm=self, episode=summary)

        def checkpointed(message: dict[str, Any]) -> None:
            events.post(
                "on_checkpoint",
                algorithm=self,
                path=message["path"],
                policy_id=message["policy_id"],
                version=message["version"],
            )

        self.policy_server.stats.episode_listeners.append(episode_ended)
        self.policy_server.checkpoint_listeners.append(checkpointed)

    async def _report_forever(self) -> None:
        """``rlserve serve``'s results: one per ``min_env_steps_per_iteration`` trained steps.

        A fail-fast callback's error stops the server (:meth:`serve_forever` raises it).
        """
        assert self._events is not None
        before, started = await self._snapshot(), time.perf_counter()
        while True:
            await asyncio.sleep(REPORT_POLL_S)
            if self._events.error is not None:
                self.policy_server.request_stop()
                return
            now = await self._snapshot()
            if now["trained"] < before["trained"] + self.config.min_env_steps_per_iteration:
                continue
            self.iteration += 1
            elapsed = time.perf_counter() - started
            self.time_total_s += elapsed
            result = self._network_result(before, now, elapsed)
            self._events.post("on_train_result", algorithm=self, result=result)
            before, started = now, time.perf_counter()

    def _finish_callbacks(self) -> None:
        """Deliver the queued events, then ``on_algorithm_stop`` (once).

        Raises:
            CallbackError: With ``fail_fast``, a callback raised.
        """
        callbacks, self.callbacks = self.callbacks, CallbackList([])
        events, self._events = self._events, None
        try:
            if events is not None:
                events.stop()
        finally:
            callbacks.fire("on_algorithm_stop", algorithm=self)

    # -- serving -----------------------------------------------------------------------------

    def _serve_in_background(self) -> ServerThread:
        if self._thread is None:
            self._thread = ServerThread(self.policy_server)
            self._thread.start()
        if not self._thread.running:
            raise RuntimeError(
                f"the server of {self.folder.path} has stopped; continue the run with "
                "Algorithm.from_checkpoint(run folder)"
            )
        return self._thread

    def serve_forever(self) -> Path | None:
        """Serve on this thread until SIGINT/SIGTERM; return the final checkpoint.

        Raises:
            RuntimeError: It already serves from a background thread.
        """
        if self._thread is not None:
            raise RuntimeError("this Algorithm serves from a background thread already")
        install_uvloop()
        try:
            return asyncio.run(self._serve_and_report())
        finally:
            self.folder.release()
            self._finish_callbacks()

    async def _serve_and_report(self) -> Path | None:
        reports = None
        if self._events is not None:
            reports = asyncio.get_running_loop().create_task(self._report_forever())
        try:
            return await serve_forever(self.policy_server)
        finally:
            if reports is not None:
                reports.cancel()

    @property
    def address(self) -> str | None:
        """``host:port`` of the binary port (it answers HTTP too), once serving."""
        port = self.policy_server.port
        if not port:
            return None
        host = self.server_config.host
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    # -- training ----------------------------------------------------------------------------

    def train(self) -> dict[str, Any]:
        """Wait until the learner trained ``min_env_steps_per_iteration`` more steps; report.

        Clients drive the pace: with none connected this waits.

        Raises:
            RuntimeError: The server stopped.
        """
        thread = self._serve_in_background()
        started = time.perf_counter()
        before = thread.call(self._snapshot, 30.0)
        wanted = before["trained"] + self.config.min_env_steps_per_iteration
        now = before
        while now["trained"] < wanted:
            time.sleep(TRAIN_POLL_S)
            now = self._serve_in_background().call(self._snapshot, 30.0)
            if now["restarts"] - before["restarts"] >= MAX_LEARNER_RESTARTS_PER_ITERATION:
                raise RuntimeError(
                    f"the learner process died {now['restarts'] - before['restarts']} times "
                    f"during this iteration (last: {now['failure']}); serving goes on, the "
                    f"experience is logged; see GET /v1/health on {self.address}"
                )
        self.iteration += 1
        elapsed = time.perf_counter() - started
        self.time_total_s += elapsed
        result = self._network_result(before, now, elapsed)
        if self._events is not None:
            self._events.check()
        self.callbacks.fire("on_train_result", algorithm=self, result=result)
        return result

    async def _snapshot(self) -> dict[str, Any]:
        """The server's counters, read on its own loop (so nothing changes meanwhile)."""
        stats = self.policy_server.stats
        if stats.several:
            learners = {pid: dict(m) for pid, m in stats.policy_learner.items()}
        else:
            learners = {next(iter(self.specs)): dict(stats.learner)}
        return {
            "trained": sum(m.get("learner/steps_trained", 0.0) for m in learners.values()),
            "env_steps": stats.env_steps,
            "episodes": stats.episodes_completed,
            "timed_out": stats.episodes_timed_out,
            "returns": list(stats.returns),
            "lengths": list(stats.lengths),
            "learners": learners,
            "restarts": stats.learner_restarts,
            "failure": ((self.policy_server.learner.failure or "").strip().splitlines() or [""])[
                -1
            ],
        }

    def _network_result(
        self, before: dict[str, Any], now: dict[str, Any], elapsed: float
    ) -> dict[str, Any]:
        returns, lengths = now["returns"], now["lengths"]
        mean = float(np.mean(returns)) if returns else float("nan")
        sampled = now["env_steps"] - before["env_steps"]
        runners = {
            "episode_return_mean": mean,
            "episode_return_min": float(min(returns)) if returns else float("nan"),
            "episode_return_max": float(max(returns)) if returns else float("nan"),
            "episode_len_mean": float(np.mean(lengths)) if lengths else float("nan"),
            "num_episodes": now["episodes"] - before["episodes"],
            "num_env_steps_sampled": sampled,
            "num_env_steps_sampled_lifetime": now["env_steps"],
            "episodes_failed": now["timed_out"],
            "num_healthy_env_runners": 0,  # no environments, so no env runners
            "num_env_runner_restarts": 0,
        }
        learners = {
            pid: {k.removeprefix("learner/"): float(v) for k, v in metrics.items()}
            for pid, metrics in now["learners"].items()
        }
        return {
            "training_iteration": self.iteration,
            "env_runners": runners,
            "learners": learners,
            "learner_restarts": now["restarts"],
            "network": {"num_env_steps": sampled},
            "num_env_steps_sampled_lifetime": now["env_steps"],
            "time_this_iter_s": elapsed,
            "time_total_s": self.time_total_s,
            "episode_return_mean": mean,
            "episode_reward_mean": mean,
            "timesteps_total": now["env_steps"],
        }

    # -- acting ------------------------------------------------------------------------------

    def _acting_policy(self, policy_id: str) -> NumpyPolicy:
        """The policy the server serves now (its newest published weights).

        Right after the start, this waits (up to :data:`FIRST_WEIGHTS_TIMEOUT` seconds) for
        the learner's first weights, as clients' calls do.
        """
        versions = self.policy_server.stats.policy_versions
        deadline = time.monotonic() + FIRST_WEIGHTS_TIMEOUT
        while versions.get(policy_id, -1) < 0 and time.monotonic() < deadline:
            self._serve_in_background()
            time.sleep(TRAIN_POLL_S)
        held = self._acting.get(policy_id)
        if held is not None and held.version == versions.get(policy_id, -1):
            return held
        package = self.policy_server.store.load_weights(policy_id)
        if package is None:
            raise TimeoutError(
                f"the policy '{policy_id}' has no weights after {FIRST_WEIGHTS_TIMEOUT:.0f} s; "
                f"see GET /v1/health on {self.address} (is the learner failing?)"
            )
        held = NumpyPolicy(package.spec, package.arrays, package.version, seed=self.config.seed)
        self._acting[policy_id] = held
        return held

    def evaluate(self, episodes: int | None = None) -> dict[str, Any]:
        """Not available: there is no environment here to run episodes in.

        Raises:
            ConfigError: Always; clients evaluate with ``start_episode(training_enabled=False)``.
        """
        raise ConfigError(
            "an Algorithm without an environment cannot evaluate; let a client run episodes "
            "with start_episode(training_enabled=False) (greedy, not trained on), or build one "
            "with .environment(env) to evaluate in process"
        )

    # -- checkpoints -------------------------------------------------------------------------

    def save(self, checkpoint_dir: str | Path | None = None) -> Path:
        """Have the learner checkpoint every policy into the run folder; return the folder.

        The run folder is the checkpoint (it holds the experience log a resume reads on from).

        Raises:
            ConfigError: ``checkpoint_dir`` is another folder.
            TimeoutError: The learner wrote no checkpoint within :data:`SAVE_TIMEOUT` seconds.
        """
        if (
            checkpoint_dir is not None
            and Path(checkpoint_dir).resolve() != self.folder.path.resolve()
        ):
            raise ConfigError(
                f"a served run's checkpoint is its run folder {self.folder.path} (with the "
                "experience log it resumes from); call save() without a folder and copy that "
                "folder whole to move it"
            )
        thread = self._serve_in_background()
        link = self.policy_server.learner
        counts = getattr(link, "requested_checkpoints", None)
        if counts is None:
            raise RuntimeError("this server's learner does not take checkpoint requests")
        before = dict(counts)
        deadline = time.monotonic() + SAVE_TIMEOUT
        while True:
            thread.call_soon(link.request_checkpoint)
            asked = time.monotonic()
            while time.monotonic() - asked < REQUEST_AGAIN_S:
                if all(counts.get(pid, 0) > before.get(pid, 0) for pid in self.specs):
                    return self.folder.path
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"the learner wrote no checkpoint within {SAVE_TIMEOUT:.0f} s; see "
                        f"GET /v1/health on {self.address} (is the learner failing?)"
                    )
                time.sleep(TRAIN_POLL_S)

    def restore(self, checkpoint_dir: str | Path) -> None:
        """Not available on a running server.

        Raises:
            ConfigError: Always; build from the checkpoint instead.
        """
        raise ConfigError(
            f"a served run cannot load another checkpoint while it runs; build it from the "
            f"checkpoint: Algorithm.from_checkpoint('{checkpoint_dir}') (rlserve serve --resume)"
        )

    def use_run_folder(self, folder: str | Path, progress: bool | None = None) -> None:
        """Not available: the server writes into its own run folder.

        Raises:
            ConfigError: Always.
        """
        raise ConfigError(
            "a served run writes into its own run folder; resume one with "
            "Algorithm.from_checkpoint(folder)"
        )

    def stop(self) -> None:
        """Stop serving: final checkpoints, state and metrics written (idempotent); tell callbacks.

        The run folder is released: another process may resume it.

        Raises:
            CallbackError: With ``fail_fast``, a callback raised.
        """
        if self._replicas is not None:
            # First: the other front-ends hand what they hold to the learner this one owns.
            self._replicas.close()
            self._replicas = None
        if self._thread is not None:
            self._thread.stop()
        self.folder.release()
        self._finish_callbacks()
