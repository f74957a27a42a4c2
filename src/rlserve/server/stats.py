"""The server's counters, and their views: a metrics map, Prometheus text, a progress line.

A server with several policies also keeps each policy's metrics under ``policies/<id>/``
(its learner's, its weights version, its mean episode return); the names without a prefix stay
totals. A server with the one policy ``default`` keeps exactly the names it always had.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from rlserve.experience.episode_records import EpisodeSummary
from rlserve.protocol.episode_requests import DEFAULT_POLICY_ID
from rlserve.server.throttled_log import SERVER_LOG

logger = logging.getLogger("rlserve.server")

RETURN_WINDOW = 100
"""Episodes over which ``episodes/return_mean`` and ``episodes/length_mean`` are averaged."""

COUNTERS = frozenset(
    {
        "episodes/started",
        "episodes/completed",
        "episodes/timed_out",
        "episodes/empty",
        "samples/env_steps",
        "samples/steps_reported",
        "samples/steps_logged",
        "samples/steps_sent_to_learner",
        "samples/steps_dropped_queue_full",
        "samples/steps_lost_storage",
        "samples/replies_held",
        "samples/held_seconds",
        "samples/holds_timed_out",
        "server/errors",
        "server/storage_errors",
        "learner/restarts",
        "learner/updates",
        "learner/steps_trained",
        "learner/steps_consumed",
        "learner/steps_dropped_stale",
        "learner/steps_dropped_cap",
        "learner/steps_logged",
        "learner/steps_skipped_frozen",
        "learner/fragments_excluded_invalid",
        "learner/steps_excluded_invalid",
        "learner/minibatches_skipped_nonfinite",
        "learner/updates_skipped_nonfinite",
        "learner/gradient_steps",
        "learner/gradient_steps_skipped_nonfinite",
        "learner/env_steps_ingested",
    }
)
"""The metrics that only grow (Prometheus counters, ``_total``); every other one is a gauge.

They continue after a resume (their restored values), and a restarted learner reports its
checkpoint's counts, which a Prometheus ``rate()`` reads as a counter reset.
"""

LEARNER_INITIAL: dict[str, float] = {
    "learner/policy_loss": float("nan"),
    "learner/value_loss": float("nan"),
    "learner/entropy": float("nan"),
    "learner/approx_kl": float("nan"),
    "learner/clip_frac": float("nan"),
    "learner/bc_loss": float("nan"),
    "learner/behaviour_kl": float("nan"),
    "learner/importance_weight_mean": float("nan"),
    "learner/lag_0": float("nan"),
    "learner/lag_1": float("nan"),
    "learner/lag_2": float("nan"),
    "learner/lag_3plus": float("nan"),
    "learner/explained_variance": float("nan"),
    "learner/update_seconds": float("nan"),
    "learner/batch_steps": 0.0,
    "learner/weights_version": 0.0,
    "learner/updates": 0.0,
    "learner/steps_trained": 0.0,
    "learner/steps_consumed": 0.0,
    "learner/steps_dropped_stale": 0.0,
    "learner/steps_dropped_cap": 0.0,
    "learner/steps_logged": 0.0,
    "learner/fragments_excluded_invalid": 0.0,
    "learner/steps_excluded_invalid": 0.0,
    "learner/minibatches_skipped_nonfinite": 0.0,
    "learner/updates_skipped_nonfinite": 0.0,
    "learner/steps_untrained_at_checkpoint": 0.0,
}
"""The learner's metrics before its first update, so dashboards find every key from the start.

Statistics of an update (losses, KL...) are NaN until there is one (``null`` in
``GET /v1/metrics``, ``NaN`` in Prometheus, not written to TensorBoard); counters start at 0 and
the learner replaces them with its restored values (``--resume``) as soon as it is ready. These
are the names of every server (the table of docs/metrics.md: PPO's and the ones every learner
reports); :func:`learner_initial` adds the names of the other algorithms a server trains.
"""


def learner_initial(algorithms: Iterable[str | None], base: dict[str, float]) -> dict[str, float]:
    """``base`` with the metric names each of ``algorithms`` declares in the registry.

    Statistics of an update start NaN, counters 0 (see :data:`LEARNER_INITIAL`).

    Raises:
        ConfigError: An algorithm is not registered.
    """
    from rlserve.learners.registry import algorithm

    initial = dict(base)
    for name in algorithms:
        entry = algorithm(name)
        for metric in entry.update_metrics:
            initial.setdefault(f"learner/{metric}", float("nan"))
        for metric in entry.counter_metrics:
            initial.setdefault(f"learner/{metric}", 0.0)
    return initial


POLICY_LEARNER_INITIAL: dict[str, float] = {
    **LEARNER_INITIAL,
    "learner/steps_skipped_frozen": 0.0,
}
"""Each policy's learner metrics (``policies/<id>/learner/...``) before its first update."""

LATEST_UPDATE_KEYS = frozenset(("learner/update_seconds", "learner/batch_steps"))
"""Statistics of one update that every learner reports: with several policies their total is the
newest update's (and so are those of every algorithm's ``update_metrics``, from the registry).
The other keys are counters, summed over the policies, but for ``learner/weights_version`` (the
highest of any policy) and ``learner/steps_consumed`` (the log steps the learner process read,
all policies together)."""

PROCESS_KEYS = frozenset({"learner/steps_consumed", "learner/steps_skipped_frozen"})
"""Per-policy learner keys a single-policy server does not take from a policy's messages: the
total ``learner/steps_consumed`` is the learner process's count, and skipped frozen steps have no
total."""

TIMED_OUT_FIX = (
    "call end_episode(episode_id, observation) when an episode ends (also after an exception "
    "in your loop), or raise --idle-timeout if your simulator pauses that long between calls"
)
"""What a user does about episodes closed for silence (the server's warning says it)."""


class ServerStats:
    """Counters the server updates as it works; read by metrics writers and the HTTP endpoints.

    Episode metrics come from the server's own bookkeeping of external episodes, so they are
    right whoever steps the environment.
    """

    def __init__(self, policy_ids: tuple[str, ...] = (DEFAULT_POLICY_ID,)) -> None:
        self.started = time.monotonic()
        self.env_steps = 0
        self.actions_served = 0
        self.inference_batches = 0
        self.episodes_started = 0
        self.episodes_completed = 0
        self.episodes_timed_out = 0
        self.episodes_empty = 0
        self.clients = 0
        self.episodes_active = 0
        self.weights_version = -1
        self.fragments_queued = 0
        self.steps_queued = 0
        self.steps_dropped_queue_full = 0
        self.steps_sent_to_learner = 0
        self.steps_reported = 0
        self.steps_logged = 0
        self.steps_lost_storage = 0
        self.learner_restarts = 0
        self.storage_errors = 0
        self.degraded: dict[str, str] = {}
        """What is not working now, by part (``/v1/health`` shows it); empty when healthy."""
        self.errors: Counter[str] = Counter()
        self.metric_sources: list[Callable[[], dict[str, float]]] = []
        self.episode_listeners: list[Callable[[EpisodeSummary], None]] = []
        """Told of every ended episode (idle-closed and empty ones too), on the server's loop:
        each must return at once (the served Algorithm's callbacks queue it)."""
        """Other parts' metrics, added to every snapshot (e.g. the learner pace's)."""
        self.returns: deque[float] = deque(maxlen=RETURN_WINDOW)
        self.lengths: deque[int] = deque(maxlen=RETURN_WINDOW)
        self._rate_mark = (time.monotonic(), 0)
        self.actions_per_s = 0.0
        self.configure_policies(policy_ids)

    def configure_policies(
        self,
        policy_ids: tuple[str, ...] | list[str],
        algorithms: dict[str, str | None] | None = None,
    ) -> None:
        """Say which policies the server hosts (before it starts); resets their metrics.

        Args:
            policy_ids: The policies, in order.
            algorithms: Each policy's algorithm (None, or a policy left out: PPO): the
                learner metric names it declares are listed from the start.
        """
        from rlserve.learners.registry import ALGORITHMS

        self.policy_ids = tuple(policy_ids)
        self.several = self.policy_ids != (DEFAULT_POLICY_ID,)
        """Whether per-policy metrics (``policies/<id>/...``) are kept."""
        algos = {pid: (algorithms or {}).get(pid) for pid in self.policy_ids}
        self.learner = learner_initial(algos.values(), LEARNER_INITIAL)
        self._latest = LATEST_UPDATE_KEYS | {
            f"learner/{name}" for e in ALGORITHMS.values() for name in e.update_metrics
        }
        self._summed = [
            key
            for key in self.learner
            if key not in self._latest
            and key not in ("learner/weights_version", "learner/steps_consumed")
        ]
        self.policy_versions: dict[str, int] = {pid: -1 for pid in self.policy_ids}
        self.policy_learner: dict[str, dict[str, float]] = {
            pid: learner_initial([algos[pid]], POLICY_LEARNER_INITIAL) for pid in self.policy_ids
        }
        self.policy_returns: dict[str, deque[float]] = {
            pid: deque(maxlen=RETURN_WINDOW) for pid in self.policy_ids
        }

    def update_learner(self, policy_id: str, metrics: dict[str, float]) -> None:
        """Take a policy's learner metrics (and update the totals)."""
        if not self.several:
            # The process's own count of log steps read comes with 'ready' and 'consumed'.
            self.learner.update({k: v for k, v in metrics.items() if k not in PROCESS_KEYS})
            return
        mine = self.policy_learner.get(policy_id)
        if mine is None:
            return
        mine.update(metrics)
        self.learner.update(
            {k: v for k, v in metrics.items() if k in self._latest and k in self.learner}
        )
        for key in self._summed:
            self.learner[key] = sum(p.get(key, 0.0) for p in self.policy_learner.values())
        self.learner["learner/weights_version"] = max(
            p["learner/weights_version"] for p in self.policy_learner.values()
        )

    def set_policy_version(self, policy_id: str, version: int) -> None:
        """Record the version the server serves for a policy; the total is the highest."""
        self.policy_versions[policy_id] = max(self.policy_versions.get(policy_id, -1), version)
        self.weights_version = max(self.policy_versions.values())

    def count_actions(self, steps: int, batch: int) -> None:
        """Count ``steps`` recorded actions; ``batch`` > 0 when they came from one forward pass."""
        self.env_steps += steps
        if batch:
            self.actions_served += steps
            self.inference_batches += 1

    def count_reported(self, steps: int) -> None:
        """Count env steps reported by local-inference clients."""
        self.env_steps += steps
        self.steps_reported += steps

    def count_unreported(self, steps: int) -> None:
        """Count the env steps of a local client's ``training_enabled=False`` episodes.

        They travel only as their summaries' lengths (no fragment), so they are env steps but
        not ``steps_reported``.
        """
        self.env_steps += steps

    def storage_failed(self, what: str, exc: BaseException) -> None:
        """Record that writing ``what`` failed; logged at most once a minute per part."""
        self.storage_errors += 1
        message = (
            f"writing the {what} failed ({exc}); serving goes on and the write is retried. "
            "Free disk space, check the run folder's permissions, or raise the open-file limit "
            "(ulimit -n)"
        )
        self.degraded[what] = message
        SERVER_LOG.warn(
            f"storage:{what}", f"{message} ({self.storage_errors} storage errors so far)"
        )

    def storage_ok(self, what: str) -> None:
        """Record that ``what`` was written again after a failure."""
        if self.degraded.pop(what, None) is not None:
            logger.warning("rlserve: writing the %s works again", what)

    def count_error(self, code: str) -> None:
        """Count an error reply by its code."""
        self.errors[code] += 1

    def record_episode(self, summary: EpisodeSummary, tell: bool = True) -> None:
        """Count an ended episode; its return enters the window unless it is empty or timed out.

        ``tell`` False: a timed-out episode is not warned of here (the caller records a batch
        of them, then calls :meth:`tell_timed_out` once, so the line counts them all).
        """
        for listener in self.episode_listeners:
            listener(summary)
        if summary.reason == "idle_timeout":
            self.episodes_timed_out += 1
            if tell:
                self.tell_timed_out()
            return
        if summary.length == 0:
            self.episodes_empty += 1
            return
        self.episodes_completed += 1
        self.returns.append(summary.episode_return)
        self.lengths.append(summary.length)
        if summary.policy_returns is not None:
            for policy_id, value in summary.policy_returns.items():
                if policy_id in self.policy_returns:
                    self.policy_returns[policy_id].append(value)
        elif summary.policy_id in self.policy_returns:
            self.policy_returns[summary.policy_id].append(summary.episode_return)

    def tell_timed_out(self) -> None:
        """Warn (at most once per interval) of the episodes ``--idle-timeout`` closed so far."""
        SERVER_LOG.warn(
            "episodes:idle_timeout",
            f"{self.episodes_timed_out} episode(s) so far were closed after --idle-timeout "
            f"seconds without a call, never ended by end_episode; {TIMED_OUT_FIX}",
        )

    def record_reported_episode(self, summary: EpisodeSummary) -> None:
        """Count an episode a local-inference client reports as ended.

        Such a client starts its episodes without telling the server, so the episode is
        counted in ``episodes/started`` when its summary arrives, as well as where it ended.
        """
        self.episodes_started += 1
        self.record_episode(summary)

    @property
    def return_mean(self) -> float:
        """Mean return of the last :data:`RETURN_WINDOW` completed episodes (NaN if none)."""
        return float(np.mean(self.returns)) if self.returns else float("nan")

    def tick(self) -> None:
        """Update rates; call at the metrics interval."""
        now = time.monotonic()
        mark_time, mark_steps = self._rate_mark
        if now > mark_time:
            self.actions_per_s = (self.env_steps - mark_steps) / (now - mark_time)
        self._rate_mark = (now, self.env_steps)

    def snapshot(self) -> dict[str, float]:
        """All metrics under slash names, as served by ``GET /v1/metrics``."""
        metrics: dict[str, float] = {
            "episodes/return_mean": self.return_mean,
            "episodes/return_min": float(min(self.returns)) if self.returns else float("nan"),
            "episodes/return_max": float(max(self.returns)) if self.returns else float("nan"),
            "episodes/length_mean": float(np.mean(self.lengths)) if self.lengths else float("nan"),
            "episodes/completed": self.episodes_completed,
            "episodes/started": self.episodes_started,
            "episodes/timed_out": self.episodes_timed_out,
            "episodes/empty": self.episodes_empty,
            "samples/env_steps": self.env_steps,
            "samples/env_steps_per_second": self.actions_per_s,
            "server/mean_inference_batch": (
                self.actions_served / self.inference_batches if self.inference_batches else 0.0
            ),
            "server/clients": self.clients,
            "server/episodes_active": self.episodes_active,
            "server/weights_version": self.weights_version,
            "server/uptime_seconds": time.monotonic() - self.started,
            "samples/steps_queued": self.steps_queued,
            "samples/steps_dropped_queue_full": self.steps_dropped_queue_full,
            "samples/steps_sent_to_learner": self.steps_sent_to_learner,
            "samples/steps_reported": self.steps_reported,
            "samples/steps_logged": self.steps_logged,
            "samples/steps_lost_storage": self.steps_lost_storage,
            "learner/restarts": self.learner_restarts,
            "server/storage_errors": self.storage_errors,
            "server/degraded": float(bool(self.degraded)),
            "server/errors": sum(self.errors.values()),
        }
        for source in self.metric_sources:
            metrics.update(source())
        metrics.update(self.learner)
        if self.several:
            for pid in self.policy_ids:
                prefix = f"policies/{pid}/"
                returns = self.policy_returns[pid]
                metrics[prefix + "weights_version"] = self.policy_versions[pid]
                metrics[prefix + "episodes/return_mean"] = (
                    float(np.mean(returns)) if returns else float("nan")
                )
                for key, value in self.policy_learner[pid].items():
                    metrics[prefix + key] = value
        return metrics

    def progress_line(self) -> str:
        """One line for the terminal."""
        ret = self.return_mean
        ret_text = "   -  " if ret != ret else f"{ret:6.1f}"
        line = (
            f"steps {self.env_steps:>9,d} | {self.actions_per_s:7,.0f} steps/s | "
            f"return(100) {ret_text} | episodes {self.episodes_completed:>6,d} | "
            f"clients {self.clients} | weights v{max(self.weights_version, 0)} | "
            f"{time.monotonic() - self.started:6.1f}s"
        )
        if not self.several:
            return line
        parts = []
        for pid in self.policy_ids:
            returns = self.policy_returns[pid]
            mean = f"{np.mean(returns):.1f}" if returns else "-"
            parts.append(f"{pid} v{max(self.policy_versions[pid], 0)} {mean}")
        return f"{line} | {', '.join(parts)}"

    def state(self) -> dict[str, Any]:
        """Counters the run folder keeps so that a resumed run continues them."""
        return {
            "env_steps": self.env_steps,
            "steps_reported": self.steps_reported,
            "steps_logged": self.steps_logged,
            "weights_version": self.weights_version,
            "learner_restarts": self.learner_restarts,
            "episodes_started": self.episodes_started,
            "episodes_completed": self.episodes_completed,
            "episodes_timed_out": self.episodes_timed_out,
            "returns": list(self.returns),
            "lengths": list(self.lengths),
            **(
                {
                    "policy_versions": dict(self.policy_versions),
                    "policy_returns": {k: list(v) for k, v in self.policy_returns.items()},
                }
                if self.several
                else {}
            ),
        }

    def restore(self, state: dict[str, Any]) -> None:
        """Continue the counters of :meth:`state`."""
        self.env_steps = int(state.get("env_steps", 0))
        self.steps_reported = int(state.get("steps_reported", 0))
        self.steps_logged = int(state.get("steps_logged", 0))
        self.weights_version = max(self.weights_version, int(state.get("weights_version", -1)))
        self.learner_restarts = int(state.get("learner_restarts", 0))
        self.episodes_started = int(state.get("episodes_started", 0))
        self.episodes_completed = int(state.get("episodes_completed", 0))
        self.episodes_timed_out = int(state.get("episodes_timed_out", 0))
        self.returns.extend(float(r) for r in state.get("returns", []))
        self.lengths.extend(int(n) for n in state.get("lengths", []))
        for pid, version in (state.get("policy_versions") or {}).items():
            if pid in self.policy_versions:
                self.set_policy_version(pid, int(version))
        for pid, values in (state.get("policy_returns") or {}).items():
            if pid in self.policy_returns:
                self.policy_returns[pid].extend(float(r) for r in values)
        if not self.several:
            self.policy_versions[DEFAULT_POLICY_ID] = self.weights_version
        self._rate_mark = (time.monotonic(), self.env_steps)
