"""Image throughput: env steps/s on 84x84x4 uint8 frames against the bare forward speeds.

A synthetic image source (:class:`ImageSource`: Atari-sized ``Box(0, 255, (84, 84, 4), uint8)``
frames drawn from a seeded generator, ``Discrete(6)`` actions; no ale-py) is served by a real
``rlserve serve --spaces-file`` with PPO's automatic Nature encoder, the learner idle (episodes
started with ``training_enabled=False``). In one run:

* remote inference: 1 and 8 client processes (:class:`rlserve.PolicyClient`, ``remote``), each
  stepping its own source; local inference: 1 client computing actions with its numpy policy
  (its conv encoder in onnxruntime when installed; ``RLSERVE_CONV_BACKEND=numpy`` forces numpy);
* the bare forward of the same actor (the server's final checkpoint): torch (one thread),
  :meth:`rlserve.policy.NumpyPolicy.compute_actions` at batch 1 and 8 with its numpy conv and
  with its onnxruntime conv (``numpy+ort``), and onnxruntime (one thread) on the
  ``rlserve export`` ONNX file when ``onnxruntime`` is importable;
* one PPO update, timed around ``PPOLearner.update()`` (batch assembly with GAE and one epoch
  of minibatches), on CPU and on ``cuda`` when torch sees one.

Every figure is the median of ``--repeats`` short windows. Run
``python bench/image_throughput.py`` (about 90 s on 2 cores), ``--quick`` for a shorter one.
``--blas-threads 1`` runs every process (this one, the server, the clients) with one BLAS and
OpenMP thread: OpenBLAS's default pool of one thread per core makes the numpy conv forward (the
server's remote inference and the local client's) tens of times slower on a busy machine
(``docs/benchmarks.md``, "Image observations: throughput"), so run both and compare.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import multiprocessing as mp
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from _launch import ListeningProcess
from _proc_cpu import CpuMeter, children, load_average
from remote_inference import _sleep_until, _window_of

SHAPE = (84, 84, 4)
"""The frames' shape: Atari's 84x84 grayscale, 4 stacked, channels last."""
ACTIONS = 6
"""Pong's action count."""
FRAME_BYTES = int(np.prod(SHAPE))
"""uint8 bytes of one frame on the wire."""
BLAS_THREADS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
"""The variables ``--blas-threads`` sets."""
LISTENING = re.compile(r"rlserve listening on (\S+):(\d+) \(binary\).*; run folder (?P<run>.+)$")


class ImageSource(gym.Env[np.ndarray, np.int64]):
    """Atari-sized uint8 frames from a seeded generator; episodes of ``length`` steps.

    A pool of frames is drawn once and cycled, so the source costs a copy per step, not the
    generator's time: the figures are rlserve's, not the simulator's.
    """

    def __init__(self, seed: int = 0, length: int = 200, pool: int = 32):
        self.observation_space = gym.spaces.Box(0, 255, SHAPE, np.uint8)
        self.action_space = gym.spaces.Discrete(ACTIONS)
        rng = np.random.default_rng(seed)
        self._frames = rng.integers(0, 256, (pool, *SHAPE), dtype=np.uint8)
        self._length, self._t = length, 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Start an episode at the pool's next frame."""
        super().reset(seed=seed)
        self._t = 0
        return self._frames[0].copy(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Next frame; reward 1 for action 0; truncated after ``length`` steps."""
        self._t += 1
        frame = self._frames[self._t % len(self._frames)].copy()
        return frame, float(int(action) == 0), False, self._t >= self._length, {}


# -- the served scenarios -----------------------------------------------------------------------


def client_process(
    address: str, index: int, mode: str, ready: Any, go: Any, bounds_shared: Any, results: Any
) -> None:
    """One client: step its source with ``mode`` inference, count steps per window."""
    from rlserve import PolicyClient

    env = ImageSource(seed=index)
    client = PolicyClient(address, inference_mode=mode, client_name=f"bench-img-{index}")
    obs, _ = env.reset()
    # One action before reporting ready: the first waits for the server's first weights (a CUDA
    # learner starts seconds later than a CPU one), which is start-up, not throughput.
    warm_up = client.start_episode(training_enabled=False)
    client.get_action(warm_up, obs)
    client.end_episode(warm_up, obs, truncated=True)
    ready.put(index)
    go.wait()
    bounds = list(bounds_shared)
    steps = [0] * (len(bounds) - 1)
    now = time.monotonic()
    while now < bounds[-1]:
        episode_id = client.start_episode(training_enabled=False)
        done = False
        while not done and now < bounds[-1]:
            action = client.get_action(episode_id, obs)
            obs, reward, terminated, truncated, _ = env.step(action)
            client.log_returns(episode_id, reward)
            done = terminated or truncated
            now = time.monotonic()
            window = _window_of(now, bounds)
            if 0 <= window < len(steps):
                steps[window] += 1
        client.end_episode(episode_id, obs, truncated=True)
        obs, _ = env.reset()
    client.close()
    results.put(steps)


def serve(run_dir: Path, name: str) -> tuple[ListeningProcess, str, Path]:
    """``rlserve serve`` over the source's spaces: the process, its address and run folder."""
    from rlserve.protocol.spaces import describe

    source = ImageSource()
    spaces = run_dir / "image-spaces.json"
    spaces.write_text(
        json.dumps(
            {
                "observation_space": describe(source.observation_space),
                "action_space": describe(source.action_space),
            }
        )
    )
    rlserve = Path(sys.executable).with_name("rlserve")
    command = [str(rlserve)] if rlserve.exists() else [sys.executable, "-m", "rlserve.cli"]
    command += ["serve", "--spaces-file", str(spaces), "--port", "0", "--http-port", "0"]
    command += ["--run-dir", str(run_dir), "--name", name, "--no-progress"]
    server = ListeningProcess(command, LISTENING, "rlserve serve")
    match = server.match
    return server, f"{match.group(1)}:{match.group(2)}", Path(match.group("run").strip())


def run_scenario(
    address: str, server_pid: int, clients: int, mode: str, args: argparse.Namespace, ctx: Any
) -> dict[str, Any]:
    """``clients`` processes for ``args.repeats`` windows: median steps/s and cores used."""
    ready, results, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    bounds_shared = ctx.Array("d", args.repeats + 1, lock=False)
    processes = [
        ctx.Process(
            target=client_process,
            args=(address, i, mode, ready, go, bounds_shared, results),
            daemon=True,
        )
        for i in range(clients)
    ]
    try:
        for process in processes:
            process.start()
        for _ in processes:
            ready.get(timeout=300)
        start = time.monotonic() + args.warmup
        bounds = [start + r * args.window for r in range(args.repeats + 1)]
        bounds_shared[:] = bounds
        go.set()
        _sleep_until(start)
        meter = CpuMeter(
            {
                "server": [server_pid],
                "learner": [pid for pid, _ in children(server_pid)],
                "clients": [p.pid for p in processes if p.pid is not None],
            }
        )
        _sleep_until(bounds[-1])
        cores = meter.lap()
        reports = [results.get(timeout=120) for _ in processes]
        for process in processes:
            process.join(timeout=30)
    finally:
        for process in processes:
            if process.is_alive():
                process.terminate()
    rates = [sum(r[w] for r in reports) / args.window for w in range(args.repeats)]
    return {"steps_per_s": statistics.median(rates), "windows": rates, "cores": cores}


# -- the bare forward passes --------------------------------------------------------------------


def calls_per_s(call: Callable[[], object], windows: int, window: float) -> float:
    """Median calls per second of ``call`` over ``windows`` windows of ``window`` seconds."""
    call()  # warm-up (allocations, lazy initialisation)
    rates = []
    for _ in range(windows):
        count, started = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - started) < window:
            call()
            count += 1
        rates.append(count / elapsed)
    return statistics.median(rates)


def forward_speeds(run_folder: Path, args: argparse.Namespace) -> dict[str, float]:
    """Observations/s of the served actor's forward, per runtime and batch size."""
    import torch

    from rlserve.algorithm.export import export_onnx, load_model
    from rlserve.errors import ConfigError
    from rlserve.learners.models import ActorCritic
    from rlserve.policy import NumpyPolicy
    from rlserve.policy.conv_onnx import BACKEND_ENV

    torch.set_num_threads(1)
    model, _, _ = load_model(run_folder)
    assert isinstance(model, ActorCritic) and model.image is not None
    policies = {}
    chosen = os.environ.get(BACKEND_ENV)
    for name, backend in (("numpy", "numpy"), ("numpy+ort", "onnxruntime")):
        os.environ[BACKEND_ENV] = backend
        with contextlib.suppress(ConfigError):  # onnx or onnxruntime not installed
            policies[name] = NumpyPolicy(model.spec(), model.actor_arrays(), 0)
    if chosen is None:
        del os.environ[BACKEND_ENV]
    else:
        os.environ[BACKEND_ENV] = chosen
    session = None
    try:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = 1
        onnx_path = export_onnx(run_folder, run_folder / "bench-policy.onnx")
        session = ort.InferenceSession(str(onnx_path), options, ["CPUExecutionProvider"])
    except ImportError:
        pass
    rng = np.random.default_rng(0)
    speeds: dict[str, float] = {}
    for batch in (1, 8):
        obs = rng.integers(0, 256, (batch, FRAME_BYTES)).astype(np.float32)
        tensor = torch.from_numpy(obs)

        def torch_forward(x: torch.Tensor = tensor) -> object:
            with torch.no_grad():
                return model.params(x)

        def onnx_forward(o: np.ndarray = obs) -> object:
            assert session is not None
            return session.run(None, {"obs": o})

        runs: dict[str, Callable[[], object]] = {"torch": torch_forward}
        for name, policy in policies.items():
            runs[name] = functools.partial(policy.compute_actions, obs)
        if session is not None:
            runs["onnxruntime"] = onnx_forward
        for name, call in runs.items():
            speeds[f"{name}-{batch}"] = batch * calls_per_s(call, args.repeats, args.window / 4)
    return speeds


# -- one learner update -------------------------------------------------------------------------


def update_seconds(device: str, args: argparse.Namespace) -> list[float]:
    """Wall seconds of ``PPOLearner.update()`` on ``args.batch`` frames, ``args.repeats`` times."""
    from rlserve.learners.ppo import PPOLearner
    from rlserve.learners.ppo_config import PPOSettings
    from rlserve.protocol.fragment import Fragment

    source = ImageSource()
    settings = PPOSettings(
        device=device, train_batch_size=args.batch, minibatch_size=64, num_epochs=1
    )
    learner = PPOLearner(source.observation_space, source.action_space, settings)
    rng = np.random.default_rng(0)
    steps = 128
    frames = rng.integers(0, 256, (steps + 1, FRAME_BYTES)).astype(np.float32)
    times = []
    for repeat in range(args.repeats + 1):
        fragments = [
            Fragment(
                episode_id=f"e{repeat}-{i}",
                agent_id="agent0",
                policy_id="default",
                obs=frames,
                actions=rng.integers(0, ACTIONS, steps).astype(np.int64),
                rewards=rng.uniform(0, 1, steps).astype(np.float32),
                behaviour_logp=np.full(steps, -np.log(ACTIONS), np.float32),
                policy_chosen=np.ones(steps, bool),
                weights_version=np.full(steps, learner.version, np.int64),
                terminated=False,
                truncated=True,
            )
            for i in range(-(-args.batch // steps))
        ]
        learner.ingest(fragments)
        started = time.perf_counter()
        learner.update()
        if repeat:  # the first is a warm-up
            times.append(time.perf_counter() - started)
    return times


# -- main ---------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="windows (and updates) per figure")
    parser.add_argument("--window", type=float, help="seconds per window (4; --quick: 2)")
    parser.add_argument("--warmup", type=float, help="seconds of warm-up (3; --quick: 2)")
    parser.add_argument("--batch", type=int, default=512, help="frames per PPO update")
    parser.add_argument("--quick", action="store_true", help="shorter windows")
    parser.add_argument(
        "--blas-threads",
        type=int,
        help="cap the BLAS/OpenMP threads of every process (bench, server, clients); default: "
        "the libraries' own (one per core)",
    )
    args = parser.parse_args()
    if args.blas_threads and os.environ.get("OPENBLAS_NUM_THREADS") != str(args.blas_threads):
        # numpy's BLAS reads these once, when loaded: start again with them set (the server
        # and the client processes inherit them).
        for name in BLAS_THREADS:
            os.environ[name] = str(args.blas_threads)
        os.execv(sys.executable, [sys.executable, *sys.argv])
    args.window = args.window or (2.0 if args.quick else 4.0)
    args.warmup = args.warmup or (2.0 if args.quick else 3.0)
    ctx = mp.get_context("spawn")
    loads = [load_average()]
    served: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="rlserve-img-bench-") as tmp:
        server, address, run_folder = serve(Path(tmp), f"img-{os.getpid()}")
        try:
            for key, clients, mode in (
                ("remote, 1 client", 1, "remote"),
                ("remote, 8 clients", 8, "remote"),
                ("local, 1 client", 1, "local"),
            ):
                print(f"running {key} ...", file=sys.stderr, flush=True)
                served[key] = run_scenario(address, server.process.pid, clients, mode, args, ctx)
        finally:
            server.stop(grace_s=60)
        print("forward passes ...", file=sys.stderr, flush=True)
        forward = forward_speeds(run_folder, args)
    import torch

    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    updates = {}
    for device in devices:
        print(f"PPO update on {device} ...", file=sys.stderr, flush=True)
        updates[device] = update_seconds(device, args)
    loads.append(load_average())

    print(f"image throughput, 84x84x4 uint8 frames ({FRAME_BYTES:,} bytes), Discrete({ACTIONS})")
    threads = {name: os.environ.get(name, "unset") for name in BLAS_THREADS}
    print("threads: " + ", ".join(f"{k}={v}" for k, v in threads.items()))
    print(f"RLSERVE_CONV_BACKEND (local client's conv): {os.environ.get('RLSERVE_CONV_BACKEND')}")
    print("load average at the start: {:.2f} {:.2f} {:.2f}".format(*loads[0]))
    print("load average at the end:   {:.2f} {:.2f} {:.2f}".format(*loads[1]))
    print(f"medians of {args.repeats} windows of {args.window:g} s; learner idle")
    print(f"\n{'served':<28}{'env steps/s':>12}{'MB/s up':>9}  cores: server/learner/clients/other")
    for key, res in served.items():
        c = res["cores"]
        print(
            f"{key:<28}{res['steps_per_s']:>12,.0f}"
            f"{res['steps_per_s'] * FRAME_BYTES / 1e6 if 'remote' in key else 0.0:>9.1f}"
            f"  {c['server']:.2f}/{c['learner']:.2f}/{c['clients']:.2f}/{c['other']:.2f}"
            f"  windows {[round(w) for w in res['windows']]}"
        )
    print(f"\n{'bare forward, one thread':<28}{'obs/s b=1':>12}{'obs/s b=8':>12}")
    for name in ("torch", "numpy", "numpy+ort", "onnxruntime"):
        if f"{name}-1" in forward:
            print(f"{name:<28}{forward[f'{name}-1']:>12,.0f}{forward[f'{name}-8']:>12,.0f}")
    if "onnxruntime-1" not in forward:
        print("onnxruntime: not importable (pip install onnxruntime)")
    print(f"\nPPO update on {args.batch} frames (minibatch 64, 1 epoch), PPOLearner.update()")
    for device, times in updates.items():
        runs = [round(t, 2) for t in times]
        print(f"{device:<28}{statistics.median(times):>10.2f} s  runs {runs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
