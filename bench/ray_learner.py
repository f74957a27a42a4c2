"""The learner as a Ray actor: start-up time, and what each train() pays for it.

Run: ``PYTHONPATH=src .venv/bin/python bench/ray_learner.py`` (``--quick`` for a short
run). Needs ``pip install 'rlserve[ray]'``.

On a one-node Ray cluster of its own on 127.0.0.2 (:func:`ray_runners.ray_on_loopback`) it
measures, for PPO sampling in this process (``num_env_runners=0``):

* start-up: from ``ray.init(address=...)`` (connecting to the running cluster) to the first
  ``train()`` result, with the learner an actor (``.learners(num_learners=1)``); and the same
  Algorithm's build and first ``train()`` with the learner in process, for comparison;
* the per-``train()`` overhead of the learner actor, for a small MLP (CartPole, ``[64, 64]``)
  and an 84x84x4 CNN (``image_throughput.ImageSource``, the automatic Nature encoder), two
  ways. Transport: the same :class:`~rlserve.cluster.learner.LearnerHost` calls a round makes
  (``ingest`` of one round's fragments, ``update``'s round trip, approximated by ``state``, and
  ``weights`` once per version) timed on an actor and on an instance in this process; the
  overhead is the sum of the differences (medians of ``--rounds``). End to end: the median
  ``train()`` with the learner in an actor and in process, both in this run (on a loaded
  machine the noise of the update's own time hides the transport; the first figure does not).

torch runs with one thread in this process, as Ray gives a one-CPU actor, so both placements
learn at the same speed and the difference is the transport.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np
import torch

from image_throughput import ImageSource
from ray_runners import ray_on_loopback
from rlserve import PPOConfig
from rlserve.cluster.learner import LearnerHost


def image_env(config: Any = None) -> ImageSource:
    """The synthetic 84x84x4 uint8 image env of ``bench/image_throughput.py``."""
    return ImageSource(seed=0, length=200)


CASES: dict[str, tuple[Any, dict[str, Any]]] = {
    "MLP [64, 64], CartPole": (
        "CartPole-v1",
        {"train_batch_size": 512, "minibatch_size": 128, "num_epochs": 2,
         "model": {"fcnet_hiddens": [64, 64]}},
    ),
    "84x84x4 CNN (Nature)": (
        image_env,
        {"train_batch_size": 128, "minibatch_size": 64, "num_epochs": 1},
    ),
}  # fmt: skip


def config(env: Any, settings: dict[str, Any], actor: bool) -> Any:
    """PPO on ``env`` sampling in process; the learner an actor or not."""
    batch = settings["train_batch_size"]
    made = (
        PPOConfig()
        .environment(env)
        .env_runners(num_env_runners=0, num_envs_per_env_runner=4)
        .training(**settings, min_env_steps_per_iteration=batch)
        .resources(device="cpu")
        .debugging(seed=1)
    )
    return made.learners(num_learners=1) if actor else made


def train_seconds(env: Any, settings: dict[str, Any], actor: bool, rounds: int) -> float:
    """Median seconds of one ``train()`` (after a first, untimed one)."""
    with config(env, settings, actor).build() as algo:
        algo.train()
        times = []
        for _ in range(rounds):
            started = time.perf_counter()
            algo.train()
            times.append(time.perf_counter() - started)
    return statistics.median(times)


def weights_bytes(env: Any, settings: dict[str, Any]) -> int:
    """Bytes of the arrays of one weights version."""
    with config(env, settings, False).build() as algo:
        arrays = algo.learners["default"].weights().arrays
        return sum(np.asarray(a).nbytes for a in arrays.values())


def median_ms(call: Any, rounds: int) -> float:
    """Median milliseconds of ``call()`` (after one untimed call)."""
    call()
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e3


def transport_ms(ray: Any, env: Any, settings: dict[str, Any], rounds: int) -> dict[str, float]:
    """Each per-round call's milliseconds on an actor minus in this process, and their sum."""
    with config(env, settings, False).build() as algo:
        algo.train()
        spec, name = algo.specs["default"], algo.algorithms["default"]
        args = (name, spec.observation_space, spec.action_space,
                algo.config.policy_settings(name, spec.config))  # fmt: skip
        packages = {pid: learner.weights() for pid, learner in algo.learners.items()}
        fragments = algo.samplers[0].sample(settings["train_batch_size"], packages).fragments
    local = LearnerHost(*args)
    remote = ray.remote(LearnerHost).options(num_cpus=1).remote(*args)
    try:
        calls = {
            "ingest": (lambda: local.ingest(fragments), lambda: remote.ingest.remote(fragments)),
            "update round trip": (local.state, remote.state.remote),
            "weights": (local.weights, remote.weights.remote),
        }
        out = {
            what: median_ms(lambda r=r: ray.get(r()), rounds) - median_ms(here, rounds)
            for what, (here, r) in calls.items()
        }
    finally:
        ray.kill(remote)
    out["total"] = sum(out.values())
    return out


def first_result_seconds(ray: Any, address: str, actor: bool) -> float:
    """Seconds from ``ray.init`` to the first ``train()`` result of the MLP case."""
    env, settings = CASES["MLP [64, 64], CartPole"]
    ray.shutdown()
    started = time.perf_counter()
    ray.init(address=address, _node_ip_address="127.0.0.2", logging_level="ERROR")
    with config(env, settings, actor).build() as algo:
        algo.train()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="timed train() calls per case")
    parser.add_argument("--quick", action="store_true", help="3 rounds")
    args = parser.parse_args()
    rounds = 3 if args.quick else args.rounds
    torch.set_num_threads(1)
    with ray_on_loopback() as ray:
        address = ray.get_runtime_context().gcs_address
        startup = {
            "learner actor": first_result_seconds(ray, address, True),
            "learner in process": first_result_seconds(ray, address, False),
        }
        print("from ray.init to the first train() result (MLP case, 512 steps):")
        for name, seconds in startup.items():
            print(f"  {name:20s} {seconds:6.2f} s")
        print(f"per-train() transport overhead of the learner actor (median of {rounds}):")
        for name, (env, settings) in CASES.items():
            parts = transport_ms(ray, env, settings, rounds)
            size = weights_bytes(env, settings)
            text = ", ".join(f"{what} {ms:+.2f} ms" for what, ms in parts.items())
            print(f"  {name:24s} {text} (weights {size / 1e6:.2f} MB)")
        print(f"end to end: median train() of {rounds}, learner in process and in an actor:")
        for name, (env, settings) in CASES.items():
            local = train_seconds(env, settings, False, rounds)
            remote = train_seconds(env, settings, True, rounds)
            size = weights_bytes(env, settings)
            print(
                f"  {name:24s} in process {local * 1e3:7.1f} ms, actor {remote * 1e3:7.1f} ms, "
                f"overhead {(remote - local) * 1e3:+7.1f} ms "
                f"({settings['train_batch_size']} steps, weights {size / 1e6:.2f} MB)"
            )


if __name__ == "__main__":
    main()
