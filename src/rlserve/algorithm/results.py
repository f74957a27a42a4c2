"""An Algorithm's iteration results: the result dict, TensorBoard and the progress line.

The keys of the result dict are documented in :data:`~rlserve.algorithm.algorithm.RESULT_KEYS`;
the evaluation's dict shares its episode statistics (:func:`episode_stats`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from rlserve.protocol.messages import DEFAULT_POLICY_ID
from rlserve.run.metrics import MetricsWriter, ProgressLine


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
    """
    learners = {
        pid: {k.removeprefix("learner/"): v for k, v in metrics.items()}
        for pid, metrics in learner_metrics.items()
    }
    return {
        "training_iteration": iteration,
        "env_runners": runners,
        "learners": learners,
        "network": {"num_env_steps": network_steps},
        "num_env_steps_sampled_lifetime": lifetime_steps,
        "time_this_iter_s": elapsed,
        "time_total_s": total_s,
        "episode_return_mean": runners["episode_return_mean"],
        "episode_reward_mean": runners["episode_return_mean"],
        "timesteps_total": lifetime_steps,
    }


def report(
    result: dict[str, Any],
    metrics: MetricsWriter | None,
    progress: ProgressLine,
    steps: int,
    iteration: int,
    episodes: int,
) -> None:
    """Write an iteration's ``result`` to TensorBoard (when ``metrics``) and the progress line.

    Args:
        result: The result dict of :meth:`~rlserve.algorithm.algorithm.Algorithm.train`.
        metrics: The run's TensorBoard writer (None: no run folder).
        progress: The progress line.
        steps: Env steps sampled since the start (TensorBoard's step).
        iteration: Iterations done.
        episodes: Episodes finished since the start.
    """
    runners = result["env_runners"]
    if metrics is not None:
        flat = {f"episodes/{k}": float(v) for k, v in runners.items()}
        for pid, values in result["learners"].items():
            prefix = "learner" if pid == DEFAULT_POLICY_ID else f"policies/{pid}/learner"
            flat.update({f"{prefix}/{k}": float(v) for k, v in values.items()})
        flat["time/iteration_seconds"] = result["time_this_iter_s"]
        metrics.write(flat, steps)
    mean = runners["episode_return_mean"]
    shown = "n/a" if mean != mean else f"{mean:.1f}"
    rate = runners["num_env_steps_sampled"] / max(result["time_this_iter_s"], 1e-9)
    progress.show(
        f"iter {iteration}  steps {steps:,}  "
        f"return(100) {shown}  episodes {episodes:,}  {rate:,.0f} steps/s"
    )
