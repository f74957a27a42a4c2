"""C++ client benchmark (issue 25): the native client against the Python one, in the same run.

Run ``python bench/cpp_client.py`` (about 4 minutes a round on 2 cores; ``--rounds 2`` pools
two). It builds the C++ program it drives (``clients/cpp/bench/bench_client.cpp``, the CMake
target ``rlserve_bench_client``) in ``clients/cpp/build`` first, which amounts to::

    cmake -S clients/cpp -B clients/cpp/build -DCMAKE_BUILD_TYPE=Release
    cmake --build clients/cpp/build --target rlserve_bench_client -j2

Every scenario gets a fresh ``rlserve serve --spaces-from CartPole-v1`` with the CartPole demo's
PPO settings (as ``bench/remote_inference.py`` starts it). Per scenario, after a warm-up, every
client process counts its env steps in the same ``--repeats`` windows; the figure is the median
over windows. Each client steps its own CartPole-v1 with the loop ``start_episode`` /
``get_action`` / env step / ``log_returns`` / ``end_episode``: the Python clients Gymnasium's,
the C++ clients the C++ port of its physics (``clients/cpp/examples/cartpole.hpp``), as an
engine steps its own simulation.

* remote inference, 1 and 8 client processes, learner idle (``training_enabled=False``) and
  training: ``rlserve::Client`` against :class:`rlserve.PolicyClient`, and the bare loopback
  limit of the same client count (``bench/_loopback_limit.py``, run as
  ``bench/remote_inference.py`` runs it; the Python scenarios and the limit are its own code);
* local inference, one client, training: ``rlserve::LocalClient`` against the Python client's
  ``inference_mode="local"``;
* the action per step of the served policy (forward pass and sampling), one observation at a
  time: ``rlserve::Policy::compute_action`` against ``NumpyPolicy.compute_actions``, and the
  forward passes alone.

Windows are kept whatever the other processes on the machine do (the machine is shared): the
load average at the start and end, and the cores other processes used, are printed with it.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import remote_inference as ri
from _proc_cpu import CpuMeter, load_average
from _remote_results import Result, Scenario

REPO = Path(__file__).resolve().parent.parent
CPP_SOURCE = REPO / "clients" / "cpp"
TARGET = "rlserve_bench_client"
MERGED = (
    *("steps_per_s", "p50_ms", "p99_ms", "learner_updates"),
    *("server_cores", "learner_cores", "clients_cores", "other_cores"),
)
"""The per-window fields of a :class:`Result` that ``--rounds`` pools."""


def build_program(build_dir: Path) -> Path:
    """Configure ``build_dir`` (Release) when it is not, build the bench program; its path."""
    # Configured every time (cheap, the cache kept): a target added since is then known.
    configure = ["cmake", "-S", str(CPP_SOURCE), "-B", str(build_dir)]
    if not (build_dir / "CMakeCache.txt").exists():
        python_bin = Path(sys.executable).parent
        configure += ["-DCMAKE_BUILD_TYPE=Release", f"-DRLSERVE_PYTHON_BIN={python_bin}"]
    print(" ".join(configure), file=sys.stderr, flush=True)
    subprocess.run(configure, check=True, stdout=subprocess.DEVNULL)
    cache = (build_dir / "CMakeCache.txt").read_text()
    if "CMAKE_BUILD_TYPE:STRING=Release" not in cache or "RLSERVE_SANITIZE:BOOL=ON" in cache:
        print(
            f"warning: {build_dir} is not a plain Release build: the C++ figures are slower "
            "than they should be (pass --build-dir with a fresh folder)",
            file=sys.stderr,
        )
    build = ["cmake", "--build", str(build_dir), "--target", TARGET, "-j2"]
    print(" ".join(build), file=sys.stderr, flush=True)
    subprocess.run(build, check=True, stdout=subprocess.DEVNULL)
    return build_dir / "bench_client"


# -- client processes ---------------------------------------------------------------------------


class CppWorker:
    """One ``bench_client remote|local`` process (see its header for the stdin/stdout lines)."""

    def __init__(self, program: Path, mode: str, address: str, index: int, training: bool):
        command = [str(program), mode, address, str(index), "train" if training else "idle"]
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.pid = self.process.pid

    def wait_ready(self) -> None:
        """Wait for its ``ready`` line (it has connected)."""
        assert self.process.stdout is not None
        line = self.process.stdout.readline().strip()
        if line != "ready":
            raise RuntimeError(f"bench_client did not start (it said {line!r}; see its stderr)")

    def go(self, start: float, window: float, windows: int) -> None:
        """Hand it the windows: ``windows`` of ``window`` seconds from monotonic ``start``."""
        assert self.process.stdin is not None
        self.process.stdin.write(f"go {start!r} {window!r} {windows}\n")
        self.process.stdin.flush()

    def report(self) -> dict[str, list[float]]:
        """Its per-window ``steps``, ``p50_ms`` and ``p99_ms`` once the last window closed."""
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        self.process.wait(timeout=60)
        if not line:
            raise RuntimeError(f"bench_client exited with {self.process.returncode}, no figures")
        return dict(json.loads(line))

    def stop(self) -> None:
        """Kill it if it still runs."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def python_local_process(
    address: str, index: int, training: bool, ready: Any, go: Any, bounds: Any, out: Any
) -> None:
    """A Python local-inference client running ``remote_inference``'s timed loop."""
    import gymnasium as gym

    from rlserve import PolicyClient

    env = gym.make("CartPole-v1")
    client = PolicyClient(address, inference_mode="local", client_name=f"bench-local-{index}")
    obs = env.reset(seed=1000 * index)[0]
    ready.put(index)
    go.wait()
    edges = list(bounds)
    steps = [0] * (len(edges) - 1)
    latencies: list[list[float]] = [[] for _ in steps]
    stop_at = argparse.Namespace(value=edges[-1])
    ri._single_env_loop(client, [env], [obs], training, edges, stop_at, steps, latencies)
    if client.local is not None:
        client.local.close(timeout=5)
    out.put(
        {
            "steps": steps,
            "p50_ms": [float(np.percentile(lat, 50)) * 1e3 if lat else 0.0 for lat in latencies],
            "p99_ms": [float(np.percentile(lat, 99)) * 1e3 if lat else 0.0 for lat in latencies],
        }
    )


class PythonLocalWorker:
    """:func:`python_local_process` in a spawned process, driven like a :class:`CppWorker`."""

    def __init__(self, ctx: Any, address: str, index: int, training: bool, windows: int):
        self.ready, self.out, self.event = ctx.Queue(), ctx.Queue(), ctx.Event()
        self.bounds = ctx.Array("d", windows + 1, lock=False)
        self.process = ctx.Process(
            target=python_local_process,
            args=(address, index, training, self.ready, self.event, self.bounds, self.out),
            daemon=True,
        )
        self.process.start()
        self.pid = self.process.pid

    def wait_ready(self) -> None:
        """Wait until it has connected."""
        self.ready.get(timeout=300)

    def go(self, start: float, window: float, windows: int) -> None:
        """Hand it the windows, as :meth:`CppWorker.go`."""
        self.bounds[:] = [start + k * window for k in range(windows + 1)]
        self.event.set()

    def report(self) -> dict[str, list[float]]:
        """Its per-window figures, as :meth:`CppWorker.report`."""
        figures = dict(self.out.get(timeout=120))
        self.process.join(timeout=30)
        return figures

    def stop(self) -> None:
        """Terminate it if it still runs."""
        if self.process.is_alive():
            self.process.terminate()


# -- scenarios ----------------------------------------------------------------------------------


def run_workers(
    scenario: Scenario, make_worker: Any, args: argparse.Namespace, run_dir: Path
) -> Result:
    """A fresh server and ``scenario.clients`` workers (``make_worker(address, index)``)."""
    result = Result(scenario)
    extra = ["--config", str(ri.demo_ppo_config(run_dir))]
    server = ri.Server(run_dir, f"bench-{scenario.key}-{os.getpid()}", extra)
    result.listening_s, result.first_action_s = server.listening_s, server.first_action_s
    workers: list[Any] = []
    try:
        workers = [make_worker(server.address, i) for i in range(scenario.clients)]
        for worker in workers:
            worker.wait_ready()
        start = time.monotonic() + args.warmup
        for worker in workers:
            worker.go(start, args.window, args.repeats)
        ri._sleep_until(start)
        meter = CpuMeter(
            {
                "bench": [os.getpid()],
                "server": [server.process.pid],
                "learner": server.learner_pids(),
                "clients": [w.pid for w in workers],
            }
        )
        before = server.metrics()
        for r in range(args.repeats):
            ri._sleep_until(start + (r + 1) * args.window)
            cores = meter.lap()
            after = server.metrics()
            stats = ri._server_window(before, after, args.window)
            before = after
            result.learner_updates.append(stats["learner_updates"])
            for name in ("server", "learner", "clients", "other"):
                getattr(result, f"{name}_cores").append(cores[name])
        reports = [worker.report() for worker in workers]
    finally:
        for worker in workers:
            worker.stop()
        server.stop()
    result.windows_run = result.windows_kept = args.repeats
    for r in range(args.repeats):
        result.steps_per_s.append(sum(rep["steps"][r] for rep in reports) / args.window)
        result.p50_ms.append(statistics.median(rep["p50_ms"][r] for rep in reports))
        result.p99_ms.append(max(rep["p99_ms"][r] for rep in reports))
    return result


def forward_figures(program: Path, run_dir: Path, passes: int) -> dict[str, float]:
    """Microseconds per step of the served CartPole policy: C++ and numpy, same weights."""
    from rlserve.client.connection import Connection, Timeouts
    from rlserve.policy import ModelSpec, NumpyPolicy
    from rlserve.protocol.replies import WeightsReply

    server = ri.Server(
        run_dir, f"bench-forward-{os.getpid()}", ["--config", str(ri.demo_ppo_config(run_dir))]
    )
    try:
        cpp = json.loads(
            subprocess.run(
                [str(program), "forward", server.address, str(passes)],
                check=True,
                capture_output=True,
                text=True,
                timeout=600,
            ).stdout
        )
        conn = Connection(server.address, None, "bench-forward", "local", Timeouts(request=60))
        conn.open()
        reply = WeightsReply.from_wire(
            conn.request({"type": "get_weights", "policy_id": "default"})
        )
        conn.close()
    finally:
        server.stop()
    assert reply.model is not None and reply.arrays is not None
    arrays = {str(k): np.asarray(v) for k, v in reply.arrays.items()}
    policy = NumpyPolicy(ModelSpec.from_wire(reply.model), arrays, reply.version, seed=11)
    rng = np.random.default_rng(7)
    observations = rng.uniform(-0.2, 0.2, (1024, 1, 4)).astype(np.float32)
    python: dict[str, list[float]] = {"compute_actions": [], "forward": []}
    count = max(passes // 20, 1000)
    for _ in range(5):
        started = time.perf_counter()
        for i in range(count):
            policy.compute_actions(observations[i & 1023], True)
        python["compute_actions"].append((time.perf_counter() - started) * 1e6 / count)
        started = time.perf_counter()
        for i in range(count):
            policy.forward(observations[i & 1023])
        python["forward"].append((time.perf_counter() - started) * 1e6 / count)
    return {
        "cpp_action_us": float(cpp["compute_action_us"]),
        "cpp_forward_us": float(cpp["forward_us"]),
        "python_action_us": statistics.median(python["compute_actions"]),
        "python_forward_us": statistics.median(python["forward"]),
    }


# -- the report ---------------------------------------------------------------------------------


def report(results: dict[str, Result], forward: dict[str, float] | None, loads: list[Any]) -> str:
    """The tables: remote, local and forward figures, their ratios, and the targets."""

    def median(key: str, name: str) -> float:
        return results[key].median(name) if key in results else float("nan")

    def rate(key: str) -> float:
        return median(key, "steps_per_s")

    lines = [
        "load average at the start {:.2f} {:.2f} {:.2f}, at the end {:.2f} {:.2f} {:.2f}".format(
            *loads[0], *loads[1]
        )
    ]
    lines.append("\nremote inference, env steps/s (median of windows)")
    lines.append(
        f"{'scenario':<22}{'limit':>9}{'Python':>9}{'C++':>9}{'C++/limit':>11}"
        f"{'Py/limit':>10}{'C++/Py':>8}{'Py p50 ms':>11}{'C++ p50 ms':>12}"
        f"{'updates/win':>13}{'other cores':>13}"
    )
    counts = sorted(
        {r.scenario.clients for r in results.values() if r.scenario.key.startswith("cpp-")}
    )
    for n in counts:
        for tag in ("idle", "train"):
            cpp, py, limit = rate(f"cpp-{tag}-{n}"), rate(f"{tag}-{n}"), rate(f"limit-{n}")
            lines.append(
                f"{f'{n} client(s), {tag}':<22}{limit:>9,.0f}{py:>9,.0f}{cpp:>9,.0f}"
                f"{cpp / limit:>11.2f}{py / limit:>10.2f}{cpp / py:>8.2f}"
                f"{median(f'{tag}-{n}', 'p50_ms'):>11.3f}"
                f"{median(f'cpp-{tag}-{n}', 'p50_ms'):>12.3f}"
                f"{median(f'cpp-{tag}-{n}', 'learner_updates'):>13.1f}"
                f"{median(f'cpp-{tag}-{n}', 'other_cores'):>13.2f}"
            )
    lines.append("\nCPU µs per env step (median of windows): the clients', the serving process'")
    lines.append(
        f"{'scenario':<22}{'Py client':>11}{'C++ client':>12}"
        f"{'server (Py)':>13}{'server (C++)':>14}"
    )
    for n in counts:
        for tag in ("idle", "train"):
            py_res, cpp_res = results.get(f"{tag}-{n}"), results.get(f"cpp-{tag}-{n}")
            cells = [
                r.per_step(name) if r else float("nan")
                for name, r in (
                    ("clients_cores", py_res),
                    ("clients_cores", cpp_res),
                    ("server_cores", py_res),
                    ("server_cores", cpp_res),
                )
            ]
            lines.append(
                f"{f'{n} client(s), {tag}':<22}{cells[0]:>11.1f}{cells[1]:>12.1f}"
                f"{cells[2]:>13.1f}{cells[3]:>14.1f}"
            )
    lines.append("\nlocal inference, 1 client, training: env steps/s")
    cpp_local, py_local = rate("cpp-local"), rate("py-local")
    local_us = [
        results[k].per_step("clients_cores") if k in results else float("nan")
        for k in ("py-local", "cpp-local")
    ]
    lines.append(
        f"  Python {py_local:,.0f}   C++ {cpp_local:,.0f}   C++/Python {cpp_local / py_local:.1f}x"
    )
    lines.append(
        f"  client CPU µs per step (env step, action, recording, shipping): Python"
        f" {local_us[0]:.1f}   C++ {local_us[1]:.2f}"
    )
    if forward:
        lines.append("\nthe served CartPole policy, µs per step (one observation)")
        lines.append(
            f"  action (forward + sampling): numpy {forward['python_action_us']:.2f}   "
            f"C++ {forward['cpp_action_us']:.3f}   "
            f"{forward['python_action_us'] / forward['cpp_action_us']:.0f}x"
        )
        lines.append(
            f"  forward pass alone:          numpy {forward['python_forward_us']:.2f}   "
            f"C++ {forward['cpp_forward_us']:.3f}   "
            f"{forward['python_forward_us'] / forward['cpp_forward_us']:.0f}x"
        )
    lines.append("\ntargets")
    share = rate("cpp-idle-1") / rate("limit-1")
    lines.append(
        f"  C++ remote, 1 client, learner idle: {share:.2f} of the limit (>= 0.7): "
        f"{'PASS' if share >= 0.7 else 'FAIL'}"
    )
    local_ratio = cpp_local / py_local
    lines.append(
        f"  C++ local: {local_ratio:.1f}x the Python local client (>= 3x): "
        f"{'PASS' if local_ratio >= 3 else 'FAIL'}"
    )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="measurement windows per scenario")
    parser.add_argument("--rounds", type=int, default=1, help="runs of every scenario, in turn")
    parser.add_argument("--window", type=float, default=3.0, help="seconds per window")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of warm-up")
    parser.add_argument(
        "--clients", type=int, nargs="+", default=[1, 8], help="remote client counts"
    )
    parser.add_argument("--passes", type=int, default=200_000, help="C++ forward passes per run")
    parser.add_argument(
        "--only", nargs="+", help="run only these scenario keys (cpp-idle-1, local, forward, ...)"
    )
    parser.add_argument("--build-dir", type=Path, default=CPP_SOURCE / "build")
    parser.add_argument("--json", type=Path, help="also write every measurement to this file")
    args = parser.parse_args()
    # What remote_inference.run_scenario reads: every window kept, none added.
    args.extra_windows, args.max_other_load, args.learner_niceness = 0, float("inf"), 0
    program = build_program(args.build_dir.resolve())
    ctx = mp.get_context("spawn")

    def remote_cpp(n: int, training: bool) -> Any:
        return lambda address, i: CppWorker(program, "remote", address, i, training)

    plan: list[tuple[Scenario, Any]] = []
    for n in args.clients:
        plan.append(
            (Scenario(f"limit-{n}", f"{n} clients, echo limit", n, 1, False, limit=True), None)
        )
        for training in (False, True):
            tag = "train" if training else "idle"
            plan.append((Scenario(f"{tag}-{n}", f"{n} Python clients", n, 1, training), None))
            plan.append(
                (
                    Scenario(f"cpp-{tag}-{n}", f"{n} C++ clients", n, 1, training),
                    remote_cpp(n, training),
                )
            )
    plan.append(
        (
            Scenario("py-local", "Python local", 1, 1, True),
            lambda address, i: PythonLocalWorker(ctx, address, i, True, args.repeats),
        )
    )
    plan.append(
        (
            Scenario("cpp-local", "C++ local", 1, 1, True),
            lambda address, i: CppWorker(program, "local", address, i, True),
        )
    )
    if args.only:
        plan = [
            (s, m)
            for s, m in plan
            if s.key in args.only or ("local" in args.only and "local" in s.key)
        ]

    results: dict[str, Result] = {}
    loads = [load_average()]
    with tempfile.TemporaryDirectory(prefix="rlserve-cpp-bench-") as tmp:
        run_dir = Path(tmp)
        for round_ in range(args.rounds):
            for scenario, make_worker in plan:
                print(
                    f"running {scenario.key} (round {round_ + 1}) ...", file=sys.stderr, flush=True
                )
                round_dir = run_dir / f"round-{round_ + 1}"  # run names repeat per round
                if make_worker is None:
                    res = ri.run_scenario(scenario, args, round_dir, ctx)
                else:
                    res = run_workers(scenario, make_worker, args, round_dir)
                if scenario.key in results:
                    for name in MERGED:
                        getattr(results[scenario.key], name).extend(getattr(res, name))
                else:
                    results[scenario.key] = res
                print(
                    f"  {res.median('steps_per_s'):,.0f} env steps/s, windows"
                    f" {[round(s) for s in res.steps_per_s]}",
                    file=sys.stderr,
                    flush=True,
                )
        forward = None
        if not args.only or "forward" in args.only:
            print("running forward ...", file=sys.stderr, flush=True)
            forward = forward_figures(program, run_dir, args.passes)
    loads.append(load_average())
    print(report(results, forward, loads))
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "load_average": loads,
                    "forward": forward,
                    "results": {
                        k: {
                            "steps_per_s": r.steps_per_s,
                            "p50_ms": r.p50_ms,
                            "p99_ms": r.p99_ms,
                            "learner_updates": r.learner_updates,
                            "other_cores": r.other_cores,
                        }
                        for k, r in results.items()
                    },
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
