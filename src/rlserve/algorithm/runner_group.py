"""Env-runner processes (``num_env_runners=N``): sampling in parallel, restarted when they fail.

Each of the N runners is a forked process (:mod:`rlserve.algorithm.runner_process`) with its own
environments, numpy policy copies and :class:`~rlserve.env.runner.EnvRunner`, seeded apart from
the others. :meth:`RunnerGroup.sample` is one synchronous round: every runner gets the weights
whose version changed since it last acted, samples its share of the steps, cuts its episodes and
sends back its fragments and episode summaries; the round returns them merged in runner order,
so a round depends only on the seeds and the weights, not on timing.

A runner that raises, exits, is killed, or does not step within its hang timeout
(``step_timeout_s``) is killed if need be and started again with a new seed; its round's
experience is lost, its episodes in flight count in :attr:`RunnerGroup.episodes_failed`, and the
others' experience is used as usual (RLlib's ``restart_failed_env_runners``). When one runner
fails ``max_restarts + 1`` times in a row without a successful round, :meth:`sample` raises
``RuntimeError`` naming the environment. Starting, watching, killing and restarting the
processes is the :class:`~rlserve.processes.supervisor.ProcessSupervisor`'s; this module owns
the rounds, the runners' seeds and weights versions, and their lost episodes.

With ``env_runners(backend="ray")`` (or by default once ``ray.init`` was called) the runners are
Ray actors anywhere in the cluster instead, each holding ``num_cpus_per_env_runner`` CPUs and
``custom_resources_per_env_runner``, supervised by :class:`~rlserve.cluster.RaySupervisor` with
the same rounds, restarts and counts; each new weights version is put in Ray's object store
once and read by every runner that needs it (copied once per node). Both backends run the same
runner body, :class:`~rlserve.algorithm.runner_process.RunnerWorker`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import multiprocessing as mp
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from multiprocessing.util import Finalize
from typing import Any

import numpy as np

from rlserve.algorithm.config import AlgorithmConfig
from rlserve.algorithm.runner_process import RunnerSetup, RunnerWorker, run_runner
from rlserve.algorithm.sources import make_source
from rlserve.cluster import RaySupervisor, Stamp, use_ray
from rlserve.env.base import EnvSource
from rlserve.errors import ConfigError, DecodeError
from rlserve.experience.agent_values import PolicyTable
from rlserve.experience.episode_records import summary_from_wire
from rlserve.policy.weights import WeightsPackage
from rlserve.processes.restarts import Failure
from rlserve.processes.supervisor import KEEP_WAITING, Judge, ProcessSupervisor
from rlserve.processes.wire import CODEC
from rlserve.protocol.fragment import Fragment
from rlserve.training.sampler import SampleRound

__all__ = ["RunnerGroup", "local_source"]

logger = logging.getLogger("rlserve.algorithm")

START_TIMEOUT_S = 60.0
"""Seconds a runner may take to make its environments."""

REMOTE_RESTART_ALLOWANCE_S = 60.0
"""Extra hang allowance with ``remote_worker_envs``: a hung sub-process copy is first restarted
inside its runner (a step timeout, then up to this long to start again)."""

_CLOSE_WAIT_S = 5.0
"""How long :meth:`RunnerGroup.stop` waits for runners to exit by themselves."""


def local_source(config: AlgorithmConfig, seed: int) -> EnvSource:
    """The one in-process copy the Algorithm keeps (for its spaces) when runners sample.

    Raises:
        ConfigError: ``config.env`` is an ``EnvSource`` instance, which cannot be copied into
            runner processes.
    """
    if isinstance(config.env, EnvSource):
        raise ConfigError(
            f"num_env_runners={config.num_env_runners} cannot copy an EnvSource instance "
            f"({type(config.env).__name__}) into runner processes: pass its class or a "
            "function that makes it, or sample in this process with num_env_runners=0"
        )
    return make_source(config, seed=seed, evaluation=True)


@dataclass
class _Runner:
    """What the parent knows of one runner besides its process, which the supervisor holds."""

    index: int
    stamp: Any
    versions: dict[str, int] = field(default_factory=dict)
    """The weights version of each policy it acts with."""
    starts: int = 0
    reported_failed: int = 0
    """``episodes_failed`` its current process reported last."""
    in_flight: int = 0
    """Episodes open in it at its last answer (lost if it fails)."""


class RunnerGroup:
    """``config.num_env_runners`` env runners (processes or Ray actors) sampling in parallel.

    Runner ``k`` (1..N) is the supervisor's child ``k - 1``.

    Args:
        config: The Algorithm's settings (``num_env_runners`` >= 1).
        table: The policies and the agent -> policy mapping.
        packages: Each policy's current weights.
        seed: The base seed; runner ``k``'s ``n``-th start is seeded from ``(seed, k, n)``.
        episodes_failed: Failed episodes counted before (a restored checkpoint's).
        max_restarts: Restarts in a row of one runner, without a successful round, after which
            :meth:`sample` gives up.

    Attributes:
        episodes_failed: Episodes lost, lifetime: in the runners' failed sub-environments and
            in flight in failed runners.

    Raises:
        ConfigError: The environment cannot be made in a runner; Ray is asked for but not
            installed or not initialised; no Ray node has the resources a runner asks for.
        RuntimeError: A runner could not be started.
    """

    def __init__(
        self,
        config: AlgorithmConfig,
        table: PolicyTable,
        packages: dict[str, WeightsPackage],
        seed: int,
        episodes_failed: int = 0,
        max_restarts: int = 3,
    ) -> None:
        if config.num_env_runners < 1:
            raise ConfigError(
                f"a RunnerGroup needs num_env_runners >= 1, not {config.num_env_runners}"
            )
        ctx = mp.get_context("fork")
        self._config = config
        self._table = table
        self._packages = dict(packages)
        self._seed = seed
        self.episodes_failed = episodes_failed
        self._round = 0
        self.hang_timeout_s = config.step_timeout_s
        if config.remote_worker_envs:
            self.hang_timeout_s = 2 * config.step_timeout_s + REMOTE_RESTART_ALLOWANCE_S
        env = config.env
        env_name = env if isinstance(env, str) else getattr(env, "__qualname__", repr(env))
        if use_ray(config.env_runner_backend):
            self._runners = [_Runner(k, Stamp()) for k in range(1, config.num_env_runners + 1)]
            self._supervisor: ProcessSupervisor | RaySupervisor = RaySupervisor(
                [f"env {env_name} in env runner {r.index}" for r in self._runners],
                RunnerWorker,
                what="runner actor",
                logger=logger,
                restart_note="the runner",
                success="sample",
                stamps=[r.stamp for r in self._runners],
                num_cpus=config.num_cpus_per_env_runner,
                resources=config.custom_resources_per_env_runner,
                max_restarts=max_restarts,
                close_wait_s=_CLOSE_WAIT_S,
            )
        else:
            self._runners = [
                _Runner(k, ctx.RawValue("d", 0.0)) for k in range(1, config.num_env_runners + 1)
            ]
            self._supervisor = ProcessSupervisor(
                [f"rlserve-env-runner-{r.index}" for r in self._runners],
                [f"env {env_name} in env runner {r.index}" for r in self._runners],
                run_runner,
                what="runner process",
                wire=CODEC,
                close_message={"type": "close"},
                logger=logger,
                restart_note="the runner",
                success="sample",
                max_restarts=max_restarts,
                close_wait_s=_CLOSE_WAIT_S,
                context=ctx,
                # Not a daemon: a runner with remote_worker_envs starts processes of its own,
                # which a daemon may not. The finaliser (and each runner's parent watch) reaps
                # them instead.
                daemon=False,
            )
        self._finalizer = Finalize(self, self._supervisor.stop, exitpriority=10)
        try:
            for runner in self._runners:
                self._start(runner)
            for slot, runner in enumerate(self._runners):
                answer = self._supervisor.gather([slot], START_TIMEOUT_S, self._judge("ready"))
                if isinstance(answer[slot], Failure):
                    raise RuntimeError(
                        f"env {env_name} could not be made in env runner {runner.index}: "
                        f"{answer[slot].reason}\n{answer[slot].details}"
                    )
                runner.in_flight = int(answer[slot]["in_flight"])
        except BaseException:
            self.stop()
            raise

    @property
    def restarts(self) -> int:
        """Runner processes restarted after a failure."""
        return self._supervisor.restarts

    @property
    def pids(self) -> list[int | None]:
        """The runners' process ids (on their node), in runner order (None: not running)."""
        return self._supervisor.pids

    @property
    def nodes(self) -> list[str | None]:
        """The address of the Ray node each runner runs on (None: a process of this machine)."""
        if isinstance(self._supervisor, RaySupervisor):
            return self._supervisor.nodes
        return [None] * len(self._runners)

    @property
    def actors(self) -> list[Any]:
        """The runners' Ray actor handles, in runner order (empty: processes)."""
        if isinstance(self._supervisor, RaySupervisor):
            return self._supervisor.actors
        return []

    @property
    def num_healthy(self) -> int:
        """Runner processes alive now."""
        return self._supervisor.num_alive

    # -- a round -----------------------------------------------------------------------------

    def sample(self, steps: int, packages: Mapping[str, WeightsPackage]) -> SampleRound:
        """One round: every runner samples ``ceil(steps / N)`` steps with ``packages``.

        Returns:
            The healthy runners' fragments, summaries and step count, in runner order.

        Raises:
            RuntimeError: A runner keeps failing (see the module doc).
            ConfigError: The environment cannot be made in a restarted runner.
        """
        self._packages = dict(packages)
        self._round += 1
        share = -(-steps // len(self._runners))
        # Runners that need the same weights get one message, encoded once.
        needs: dict[tuple[str, ...], list[int]] = {}
        for slot, runner in enumerate(self._runners):
            changed = tuple(
                pid for pid, p in packages.items() if runner.versions.get(pid) != p.version
            )
            needs.setdefault(changed, []).append(slot)
        failures: dict[int, Failure] = {}
        for changed, slots in needs.items():
            weights = {pid: packages[pid].to_wire() for pid in changed}
            message = {"type": "sample", "round": self._round, "steps": share, "weights": weights}
            for slot in slots:
                self._runners[slot].stamp.value = time.monotonic()
            failures.update(self._supervisor.send_all(message, slots))
            for slot in slots:
                if slot not in failures:
                    self._runners[slot].versions.update(
                        {pid: packages[pid].version for pid in changed}
                    )
        sent = [slot for slot in range(len(self._runners)) if slot not in failures]
        answers = self._supervisor.gather(sent, None, self._judge("sampled"), self._stalled)
        answers.update(failures)
        taken = SampleRound()
        for slot, runner in enumerate(self._runners):
            answer = answers[slot]
            if isinstance(answer, Failure):
                self._fail(slot, answer, "sample")
                continue
            try:
                fragments = [Fragment.from_wire(raw) for raw in answer["fragments"]]
                summaries = [
                    dataclasses.replace(summary_from_wire(raw), source=f"env-runner-{slot}")
                    for raw in answer["summaries"]
                ]
            except DecodeError as exc:
                self._fail(slot, Failure(f"sent a malformed answer: {exc}"), "sample")
                continue
            self._supervisor.succeeded(slot)
            taken.fragments += fragments
            taken.summaries += summaries
            taken.env_steps += int(answer["env_steps"])
            reported = int(answer["episodes_failed"])
            self.episodes_failed += reported - runner.reported_failed
            runner.reported_failed = reported
            runner.in_flight = int(answer["in_flight"])
        return taken

    # -- what the supervisor does not know ---------------------------------------------------

    def _start(self, runner: _Runner) -> None:
        """Start ``runner``'s process with a setup of its own (a new seed each start)."""
        seed = int(
            np.random.SeedSequence([self._seed, runner.index, runner.starts]).generate_state(1)[0]
        )
        runner.starts += 1
        setup = RunnerSetup(
            self._config, self._table, self._packages, runner.index, seed, runner.stamp
        )
        self._supervisor.start(runner.index - 1, setup)
        runner.versions = {pid: p.version for pid, p in self._packages.items()}
        runner.reported_failed = 0

    def _judge(self, kind: str) -> Judge:
        """How a runner's message is read when its ``kind`` answer is awaited."""

        def judge(slot: int, message: dict[str, Any]) -> Any:
            if kind == "sampled" and message.get("round", self._round) != self._round:
                return KEEP_WAITING  # the answer to a round the caller abandoned (Ctrl-C)
            if message.get("type") == kind:
                return message
            if message.get("type") == "config_error":
                raise ConfigError(f"in env runner {slot + 1}: {message.get('reason')}")
            if message.get("type") == "error":
                return Failure(f"env raised {message.get('reason')}", str(message.get("traceback")))
            return Failure(f"runner process answered {message.get('type')!r}, not {kind!r}")

        return judge

    def _stalled(self, slot: int, now: float) -> str | None:
        """Why runner ``slot`` counts as hung: its step clock is older than the hang timeout."""
        if now - self._runners[slot].stamp.value > self.hang_timeout_s:
            return f"did not step within {self.hang_timeout_s:g} s"
        return None

    def _fail(self, slot: int, failure: Failure, during: str) -> None:
        """Count a failure and its lost episodes, then restart the runner until it is ready.

        Raises:
            RuntimeError: The runner is given up (the supervisor's restart policy).
        """
        runner = self._runners[slot]
        self.episodes_failed += runner.in_flight
        runner.in_flight = 0
        self._supervisor.fail(slot, failure, during)

        def bring_up() -> Any:
            self._start(runner)
            return self._supervisor.gather([slot], START_TIMEOUT_S, self._judge("ready"))[slot]

        ready = self._supervisor.restart(slot, bring_up)
        runner.in_flight = int(ready["in_flight"])

    def stop(self) -> None:
        """Ask every runner to exit, kill those that do not, and reap them all."""
        self._finalizer()

    def __del__(self) -> None:
        if sys.is_finalizing():
            return
        with contextlib.suppress(Exception):
            self.stop()
