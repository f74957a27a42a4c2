"""Where PPO's learner spends its CPU per env step: gradient maths against everything else.

A hosted ``PPOConfig().environment("CartPole-v1")`` Algorithm (the same learner, driver and
batch code as the learner process of ``rlserve serve``) trains for ``--steps`` env steps under
``cProfile`` with a CPU-time clock. The learner's work is split by the functions it runs:

* **gradient maths**: the network's forward passes on each minibatch (``log_prob_entropy``,
  ``value``), backward (autograd), and Adam's step, inside ``PPOLearner.update``;
* **the rest of the update**: minibatch slicing, losses and metrics in Python, clipping, the
  normalisation statistics;
* **batch assembly**: ``PPOLearner.ingest`` and ``_build_batch`` (fragment checks, importance
  weights, GAE, tensors);
* **publishing**: ``PPOLearner.weights`` (the numpy weights package).

The profiler inflates Python-heavy parts more than torch's C++ kernels, so the split is an upper
bound for the Python share; the unprofiled CPU per env step of the whole ``train()`` (sampling
included) and of the learner's own calls (``update``, ``ingest``, ``weights``) are printed too.
Run ``python bench/profile_learner.py`` (about a minute on 2 cores).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any


def _algorithm(run_dir: Path, seed: int) -> object:
    from rlserve import PPOConfig

    return (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_envs_per_env_runner=8)
        .debugging(seed=seed)
        .reporting(run_dir=str(run_dir), progress=False)
        .build()
    )


def _train(algo: object, steps: int) -> int:
    done = 0
    while done < steps:
        result = algo.train()  # type: ignore[attr-defined]
        done = int(result["num_env_steps_sampled_lifetime"])
    return done


def _time_learner(algo: object) -> list[float]:
    """Count the CPU seconds of every learner's ``update``, ``ingest`` and ``weights`` calls.

    Returns:
        A one-item list the total accumulates in.
    """
    spent = [0.0]
    for learner in algo.learners.values():  # type: ignore[attr-defined]
        for name in ("update", "ingest", "weights"):
            method = getattr(learner, name)

            def timed(*args: object, _method: Any = method, **kwargs: object) -> Any:
                started = time.process_time()
                try:
                    return _method(*args, **kwargs)
                finally:
                    spent[0] += time.process_time() - started

            setattr(learner, name, timed)
    return spent


def _cumulative(stats: pstats.Stats, where: str, name: str) -> float:
    """Cumulative seconds of the functions called ``name`` in files ending with ``where``."""
    total = 0.0
    for (filename, _, function), (_, _, _, cumtime, _) in stats.stats.items():  # type: ignore[attr-defined]
        if function == name and filename.replace("\\", "/").endswith(where):
            total += cumtime
    return total


def _within(stats: pstats.Stats, caller_name: str, where: str, name: str) -> float:
    """Seconds ``name`` (in ``where``) spent when called, directly, from ``caller_name``."""
    total = 0.0
    for (filename, _, function), entry in stats.stats.items():  # type: ignore[attr-defined]
        if function != name or not filename.replace("\\", "/").endswith(where):
            continue
        for (_, _, caller), (_, _, _, cumtime) in entry[4].items():
            if caller == caller_name:
                total += cumtime
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40_960, help="env steps to train")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f} (1 min; 2 cores here)")
    with TemporaryDirectory(prefix="rlserve-learner-profile-") as tmp:
        algo = _algorithm(Path(tmp) / "plain", args.seed)
        _train(algo, 4096)  # warm-up
        learner_cpu = _time_learner(algo)
        cpu, wall = time.process_time(), time.perf_counter()
        steps = _train(algo, 4096 + args.steps) - 4096
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        algo.stop()  # type: ignore[attr-defined]
        print(
            f"train(), no profiler: {cpu / steps * 1e6:.0f} µs CPU per env step (sampling, "
            f"learning, bookkeeping; {steps:,} steps in {wall:.1f} s); the learner's calls: "
            f"{learner_cpu[0] / steps * 1e6:.0f} µs"
        )

        algo = _algorithm(Path(tmp) / "profiled", args.seed)
        _train(algo, 4096)
        profile = cProfile.Profile(time.process_time)
        profile.enable()
        steps = _train(algo, 4096 + args.steps) - 4096
        profile.disable()
        algo.stop()  # type: ignore[attr-defined]
    stats = pstats.Stats(profile)
    total = sum(entry[2] for entry in stats.stats.values())  # type: ignore[attr-defined]
    update = _cumulative(stats, "learners/ppo.py", "update")
    forward = _within(stats, "_minibatch", "learners/models.py", "log_prob_entropy")
    forward += _within(stats, "_minibatch", "learners/models.py", "value")
    backward = _cumulative(stats, "torch/_tensor.py", "backward")
    optimiser = _cumulative(stats, "torch/optim/adam.py", "step")
    gradient = forward + backward + optimiser
    ingest = _cumulative(stats, "learners/ppo.py", "ingest")
    batch = _cumulative(stats, "learners/ppo.py", "_build_batch")
    weights = _cumulative(stats, "learners/ppo.py", "weights")
    rows = [
        ("gradient maths: forward passes", forward),
        ("gradient maths: backward", backward),
        ("gradient maths: optimiser step", optimiser),
        ("the rest of the update: losses, clipping, metrics, slicing", update - gradient - batch),
        ("batch assembly (_build_batch: checks, importance weights, GAE)", batch),
        ("ingest (fragments in)", ingest),
        ("publishing (weights package)", weights),
    ]
    print(f"\nunder cProfile (CPU clock), {steps:,} env steps; µs per env step, inflated:\n")
    print("| part of the learner's work | µs per env step | share of the learner |")
    print("|---|---|---|")
    learner = update + ingest + weights
    for label, seconds in rows:
        print(f"| {label} | {seconds / steps * 1e6:.1f} | {seconds / learner:.0%} |")
    print(
        f"| **the learner, all** | **{learner / steps * 1e6:.1f}** | 100% |\n\n"
        f"The whole profiled train(): {total / steps * 1e6:.0f} µs per env step; the learner "
        f"is {learner / total:.0%} of it."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
