"""An Algorithm's iteration results: the result dict, the metrics files and the progress line.

The keys of the result dict are documented in :data:`~rlserve.algorithm.algorithm.RESULT_KEYS`;
the evaluation's dict shares its episode statistics (:func:`episode_stats`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from rlserve.protocol.messages import DEFAULT_POLICY_ID
from rlserve.run.metrics import MetricsWriter, ProgressLine

RETURN_WINDOW = 100
"""Episodes in the moving window of ``episode_return_mean``."""


def episode_stats(returns: Sequence[float], lengths: Sequence[int]) -> dict[str, float]:
    """Mean, lowest and highest of ``returns``, mean of ``lengths`` (NaN when no episode)."""
    if not returns:
        nan = float("nan")
        return {
            "episode_return_mean": nan,
            "episode_return_min": nan,
            "episode_return_max": nan,
            "episode_len_mean": nan,
        }
    return {
        "episode_return_mean": float(np.mean(returns)),
        "episode_return_min": float(min(returns)),
        "episode_return_max": float(max(returns)),
        "episode_len_mean": float(np.mean(lengths)),
    }


def iteration_result(
    iteration: int,
    runners: dict[str, Any],
    learner_metrics: dict[str, dict[str, float]],
    network_steps: int,
    lifetime_steps: int,
    elapsed: float,
    total_s: float,
    learner_restarts: int = 0,
) -> dict[str, Any]:
    """The result dict of :meth:`~rlserve.algorithm.algorithm.Algorithm.train`.

    Args:
        iteration: Iterations done.
        runners: The ``env_runners`` part (episode statistics, steps, env-runner health).
        learner_metrics: Each policy's learner metrics of its last update (``learner/`` names).
        network_steps: Steps network clients contributed in this iteration.
        lifetime_steps: Env steps sampled since the start.
        elapsed: Seconds this iteration took.
        total_s: Seconds of ``train()`` since the start.
        learner_restarts: Learner actors replaced since the start.
    """
    learners = {
        pid: {k.removeprefix("learner/"): v for k, v in metrics.items()}
        for pid, metrics in learner_metrics.items()
    }
    return {
        "training_iteration": iteration,
        "env_runners": runners,
        "learners": learners,
        "learner_restarts": learner_restarts,
        "network": {"num_env_steps": network_steps},
        "num_env_steps_sampled_lifetime": lifetime_steps,
        "time_this_iter_s": elapsed,
        "time_total_s": total_s,
        "episode_return_mean": runners["episode_return_mean"],
        "episode_reward_mean": runners["episode_return_mean"],
        "timesteps_total": lifetime_steps,
    }


LEARNER_TOTALS: dict[str, Callable[[list[float]], float]] = {
    "updates": sum,
    "steps_trained": sum,
    "weights_version": max,
}
"""Learner metrics a run with several policies also writes as a total (``learner/<name>``)."""


def stream_metrics(result: dict[str, Any], episodes: int) -> dict[str, float]:
    """An iteration's metrics under the names of docs/metrics.md.

    Where a served run has the same quantity, the name is the served run's
    (``episodes/return_mean``, ``samples/env_steps``...).

    Args:
        result: The result dict of :meth:`~rlserve.algorithm.algorithm.Algorithm.train`.
        episodes: Episodes finished since the start.
    """
    runners = result["env_runners"]
    elapsed = result["time_this_iter_s"]
    flat: dict[str, float] = {
        "episodes/return_mean": runners["episode_return_mean"],
        "episodes/return_min": runners["episode_return_min"],
        "episodes/return_max": runners["episode_return_max"],
        "episodes/length_mean": runners["episode_len_mean"],
        "episodes/completed": episodes,
        "episodes/failed": runners["episodes_failed"],
        "samples/env_steps": runners["num_env_steps_sampled_lifetime"],
        "samples/env_steps_per_second": runners["num_env_steps_sampled"] / max(elapsed, 1e-9),
        "env_runners/healthy": runners["num_healthy_env_runners"],
        "env_runners/restarts": runners["num_env_runner_restarts"],
        "learner/restarts": result.get("learner_restarts", 0),
        "time/iteration": result["training_iteration"],
        "time/iteration_seconds": elapsed,
        "time/total_seconds": result["time_total_s"],
    }
    learners: dict[str, dict[str, float]] = result["learners"]
    if set(learners) == {DEFAULT_POLICY_ID}:
        flat.update({f"learner/{k}": v for k, v in learners[DEFAULT_POLICY_ID].items()})
    else:
        for pid, values in learners.items():
            flat.update({f"policies/{pid}/learner/{k}": v for k, v in values.items()})
        for name, combine in LEARNER_TOTALS.items():
            found = [values[name] for values in learners.values() if name in values]
            if found:
                flat[f"learner/{name}"] = combine(found)
    return {k: float(v) for k, v in flat.items()}


def report(
    result: dict[str, Any],
    metrics: MetricsWriter | None,
    progress: ProgressLine,
    steps: int,
    iteration: int,
    episodes: int,
) -> None:
    """Write an iteration's ``result`` to the metrics files (when ``metrics``) and progress line.

    Args:
        result: The result dict of :meth:`~rlserve.algorithm.algorithm.Algorithm.train`.
        metrics: The run's metrics writer (None: no run folder).
        progress: The progress line.
        steps: Env steps sampled since the start (TensorBoard's step).
        iteration: Iterations done.
        episodes: Episodes finished since the start.
    """
    runners = result["env_runners"]
    if metrics is not None:
        metrics.write(stream_metrics(result, episodes), steps)
    mean = runners["episode_return_mean"]
    shown = "n/a" if mean != mean else f"{mean:.1f}"
    rate = runners["num_env_steps_sampled"] / max(result["time_this_iter_s"], 1e-9)
    progress.show(
        f"iter {iteration}  steps {steps:,}  "
        f"return(100) {shown}  episodes {episodes:,}  {rate:,.0f} steps/s"
    )
