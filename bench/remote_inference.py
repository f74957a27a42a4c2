"""Remote-inference benchmark: env steps/s, get_action latency, memory and start-up time.

Every figure comes from real ``rlserve serve`` processes and real client processes that talk to
them through :class:`rlserve.PolicyClient`, exactly as a user's simulator would:

* 1, 8 and 64 client processes, each stepping its own gymnasium ``CartPole-v1`` with the loop
  ``start_episode`` / ``get_action`` / ``env.step`` / ``log_returns`` / ``end_episode``, with the
  learner idle (episodes started with ``training_enabled=False``: no sample reaches it) and with
  the learner training (``training_enabled=True``; PPO updates continuously, which is checked
  from ``learner/updates`` in ``GET /v1/metrics`` over every measurement window);
* one client process stepping 16 CartPoles with one batched ``get_action`` per step of the vector;
* the resident memory of the server process plus its learner process after warm-up, and the time
  from launching ``rlserve serve`` to its listening line and to the first action served.

Each scenario gets a fresh server. Clients are started with multiprocessing ``spawn``, connect,
then run a warm-up period followed by ``--repeats`` back-to-back measurement windows of fixed
length; they report step counts and ``get_action`` latencies (``time.perf_counter`` around the
call) per window through a ``multiprocessing`` queue. The table shows the median over windows.

Run ``python bench/remote_inference.py`` (about 8 minutes on 2 idle cores), or ``--quick`` for a
shorter check (1 and 8 clients, 2 s windows).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

LISTENING = re.compile(
    r"rlserve listening on (?:tls://)?(\S+):(\d+) \(binary\) and https?://(\S+):(\d+)"
)

TARGETS = (
    # (label, scenario key, metric, comparison, threshold)
    ("1 client, learner idle: env steps/s", "idle-1", "steps_per_s", ">=", 2_500.0),
    ("8 clients, learner idle: env steps/s", "idle-8", "steps_per_s", ">=", 8_000.0),
    ("8 clients, learner training: p99 get_action", "train-8", "p99_ms", "<", 5.0),
    ("16-env vector client, learner idle: env steps/s", "vec16-idle", "steps_per_s", ">=", 15e3),
    ("16-env vector client, training: env steps/s", "vec16-train", "steps_per_s", ">=", 15e3),
)


# -- client processes ---------------------------------------------------------------------------


def _window_of(now: float, bounds: list[float]) -> int:
    """Index of the measurement window holding ``now``: -1 before the first."""
    if now < bounds[0]:
        return -1
    for i in range(1, len(bounds)):
        if now < bounds[i]:
            return i - 1
    return len(bounds) - 1


def client_process(
    address: str,
    index: int,
    num_envs: int,
    training: bool,
    ready: Any,
    go: Any,
    bounds_shared: Any,
    stop_at: Any,
    results: Any,
) -> None:
    import gymnasium as gym

    from rlserve import PolicyClient

    envs = [gym.make("CartPole-v1") for _ in range(num_envs)]
    client = PolicyClient(address, inference_mode="remote", client_name=f"bench-{index}")
    observations = [env.reset(seed=1000 * index + i)[0] for i, env in enumerate(envs)]
    ready.put(index)
    go.wait()
    bounds = list(bounds_shared)
    windows = len(bounds) - 1
    steps = [0] * windows
    latencies: list[list[float]] = [[] for _ in range(windows)]
    loop = _single_env_loop if num_envs == 1 else _vector_loop
    loop(client, envs, observations, training, bounds, stop_at, steps, latencies)
    client.close()
    results.put(
        {
            "index": index,
            "steps": steps,
            "latencies": [np.asarray(lat, dtype=np.float64) for lat in latencies],
        }
    )


def _single_env_loop(
    client: Any,
    envs: list[Any],
    observations: list[Any],
    training: bool,
    bounds: list[float],
    stop_at: Any,
    steps: list[int],
    latencies: list[list[float]],
) -> None:
    """The user's loop of ``rlserve.cli.demo.cartpole_client``, timed."""
    env, obs = envs[0], observations[0]
    windows = len(steps)
    now = time.monotonic()
    while now < stop_at.value:
        episode_id = client.start_episode(training_enabled=training)
        done = False
        while not done:
            started = time.perf_counter()
            action = client.get_action(episode_id, obs)
            elapsed = time.perf_counter() - started
            obs, reward, terminated, truncated, _ = env.step(action)
            client.log_returns(episode_id, float(reward))
            done = terminated or truncated
            if done:
                client.end_episode(episode_id, obs, truncated=truncated and not terminated)
            now = time.monotonic()
            window = _window_of(now, bounds)
            if 0 <= window < windows:
                steps[window] += 1
                latencies[window].append(elapsed)
            if now >= stop_at.value:
                break
        if done:
            obs, _ = env.reset()


def _vector_loop(
    client: Any,
    envs: list[Any],
    observations: list[Any],
    training: bool,
    bounds: list[float],
    stop_at: Any,
    steps: list[int],
    latencies: list[list[float]],
) -> None:
    """Step every env once per batched ``get_action``; finished episodes restart at once."""
    windows = len(steps)
    ids = [client.start_episode(training_enabled=training) for _ in envs]
    now = time.monotonic()
    while now < stop_at.value:
        started = time.perf_counter()
        actions = client.get_action(ids, np.stack(observations))
        elapsed = time.perf_counter() - started
        for i, env in enumerate(envs):
            obs, reward, terminated, truncated, _ = env.step(int(actions[i]))
            client.log_returns(ids[i], float(reward))
            if terminated or truncated:
                client.end_episode(ids[i], obs, truncated=truncated and not terminated)
                obs, _ = env.reset()
                ids[i] = client.start_episode(training_enabled=training)
            observations[i] = obs
        now = time.monotonic()
        window = _window_of(now, bounds)
        if 0 <= window < windows:
            steps[window] += len(envs)
            latencies[window].append(elapsed)


# -- the server ---------------------------------------------------------------------------------


def _rss_kib(pid: int) -> int:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    match = re.search(r"^VmRSS:\s+(\d+) kB", text, re.MULTILINE)
    return int(match.group(1)) if match else 0


def _children(pid: int) -> list[tuple[int, str]]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: the ppid follows the last ')'.
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append((int(entry.name), cmdline))
    return found


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _machine_cpu_s() -> tuple[float, float]:
    """(busy, interrupt) CPU seconds of the whole machine since boot, every core."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / CLOCK_TICKS, (fields[5] + fields[6]) / CLOCK_TICKS


def _process_cpu_s(pids: list[int]) -> float:
    """CPU seconds (user + system) used so far by the live processes in ``pids``."""
    total = 0
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / CLOCK_TICKS


def _kernel_threads() -> list[int]:
    """Pids of kernel threads (kthreadd and its children): kernel work, much of it ours."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            if entry.name == "2" or ppid == 2:
                found.append(int(entry.name))
    return found


class CpuMeter:
    """Average cores used by groups of our processes, by the kernel, and by everything else.

    ``kernel`` is interrupt and softirq time plus kernel threads (much of it is the loopback
    network stack working for us); ``other`` is every remaining process on the machine.
    """

    def __init__(self, groups: dict[str, list[int]]):
        self.groups = groups
        self._kthreads = _kernel_threads()
        self._mark = self._read()

    def _read(self) -> dict[str, float]:
        busy, interrupts = _machine_cpu_s()
        sample = {name: _process_cpu_s(pids) for name, pids in self.groups.items()}
        sample.update(
            time=time.monotonic(),
            busy=busy,
            kernel=interrupts + _process_cpu_s(self._kthreads),
        )
        return sample

    def lap(self) -> dict[str, float]:
        """Cores per group, ``kernel`` and ``other``, averaged since the previous lap."""
        now, then = self._read(), self._mark
        self._mark = now
        elapsed = max(now["time"] - then["time"], 1e-9)
        cores = {k: (now[k] - then[k]) / elapsed for k in now if k not in ("time", "busy")}
        busy = (now["busy"] - then["busy"]) / elapsed
        cores["other"] = max(busy - sum(cores.values()), 0.0)
        return cores


def wait_for_quiet(max_load: float, timeout: float) -> float:
    """Wait until other processes use under ``max_load`` cores for 2 s; return the last load."""
    deadline = time.monotonic() + timeout
    meter = CpuMeter({"bench": [os.getpid()]})
    while True:
        time.sleep(2.0)
        other = meter.lap()["other"]
        if other < max_load or time.monotonic() > deadline:
            return other


class Server:
    """One ``rlserve serve`` process, its ports, and its start-up times."""

    def __init__(self, run_dir: Path, name: str):
        executable = Path(sys.executable).with_name("rlserve")
        command = (
            [str(executable)] if executable.exists() else [sys.executable, "-m", "rlserve.cli"]
        )
        command += [
            "serve",
            "--spaces-from",
            "CartPole-v1",
            "--port",
            "0",
            "--http-port",
            "0",
            "--run-dir",
            str(run_dir),
            "--name",
            name,
            "--no-progress",
        ]
        self.lines: list[str] = []
        launched = time.monotonic()
        self.process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
        )
        assert self.process.stdout is not None
        match = None
        for line in self.process.stdout:
            self.lines.append(line.rstrip())
            match = LISTENING.search(line)
            if match:
                break
        if match is None:
            raise RuntimeError("rlserve serve exited before listening:\n" + "\n".join(self.lines))
        self.listening_s = time.monotonic() - launched
        self.address = f"{match.group(1)}:{match.group(2)}"
        self.metrics_url = f"http://{match.group(3)}:{match.group(4)}/v1/metrics"
        self._drain = threading.Thread(target=self._read_rest, daemon=True)
        self._drain.start()
        self.first_action_s = self._first_action(launched)

    def _read_rest(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip())

    def _first_action(self, launched: float) -> float:
        from rlserve import PolicyClient

        with PolicyClient(
            self.address, inference_mode="remote", client_name="bench-probe"
        ) as client:
            episode = client.start_episode(training_enabled=False)
            client.get_action(episode, np.zeros(4, dtype=np.float32))
            elapsed = time.monotonic() - launched
            client.end_episode(episode, np.zeros(4, dtype=np.float32))
        return elapsed

    def metrics(self) -> dict[str, Any]:
        """``GET /v1/metrics``."""
        with urllib.request.urlopen(self.metrics_url, timeout=10) as response:
            return dict(json.load(response))

    def memory_mib(self) -> dict[str, float]:
        """RSS of the server, its learner child, and any other child (resource tracker)."""
        server = _rss_kib(self.process.pid)
        learner = other = 0
        for pid, cmdline in _children(self.process.pid):
            if "multiprocessing.resource_tracker" in cmdline:
                other += _rss_kib(pid)
            else:
                learner += _rss_kib(pid)
        return {
            "server_mib": server / 1024,
            "learner_mib": learner / 1024,
            "total_mib": (server + learner) / 1024,
            "other_children_mib": other / 1024,
        }

    def stop(self) -> None:
        """SIGTERM, and wait for the clean shutdown (final checkpoint)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._drain.join(timeout=5)


# -- one scenario -------------------------------------------------------------------------------


@dataclass
class Scenario:
    """What runs against one fresh server."""

    key: str
    label: str
    clients: int
    envs_per_client: int
    training: bool


@dataclass
class Result:
    """Per-window measurements of one scenario, and its server's start-up and memory."""

    scenario: Scenario
    steps_per_s: list[float] = field(default_factory=list)
    p50_ms: list[float] = field(default_factory=list)
    p99_ms: list[float] = field(default_factory=list)
    learner_updates: list[float] = field(default_factory=list)
    steps_trained: list[float] = field(default_factory=list)
    update_seconds: list[float] = field(default_factory=list)
    server_steps_per_s: list[float] = field(default_factory=list)
    mean_batch: list[float] = field(default_factory=list)
    bench_cores: list[float] = field(default_factory=list)
    server_cores: list[float] = field(default_factory=list)
    learner_cores: list[float] = field(default_factory=list)
    clients_cores: list[float] = field(default_factory=list)
    kernel_cores: list[float] = field(default_factory=list)
    other_cores: list[float] = field(default_factory=list)
    load_before: float = 0.0
    windows_run: int = 0
    windows_kept: int = 0
    memory: dict[str, float] = field(default_factory=dict)
    listening_s: float = 0.0
    first_action_s: float = 0.0
    client_start_s: float = 0.0

    def median(self, name: str) -> float:
        """Median over windows of the list field ``name``."""
        values = getattr(self, name)
        return float(statistics.median(values)) if values else float("nan")

    def per_step(self, name: str) -> float:
        """Median over windows of CPU microseconds per env step of the cores field ``name``."""
        values = [
            cores / steps * 1e6
            for cores, steps in zip(getattr(self, name), self.steps_per_s, strict=True)
            if steps
        ]
        return float(statistics.median(values)) if values else float("nan")


def run_scenario(scenario: Scenario, args: argparse.Namespace, run_dir: Path, ctx: Any) -> Result:
    result = Result(scenario)
    server = Server(run_dir, f"bench-{scenario.key}-{os.getpid()}")
    result.listening_s, result.first_action_s = server.listening_s, server.first_action_s
    ready, results, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    windows = args.repeats * (1 + args.extra_windows)
    bounds_shared = ctx.Array("d", windows + 1, lock=False)
    stop_at = ctx.Value("d", 0.0, lock=False)
    processes = [
        ctx.Process(
            target=client_process,
            args=(
                server.address,
                i,
                scenario.envs_per_client,
                scenario.training,
                ready,
                go,
                bounds_shared,
                stop_at,
                results,
            ),
            daemon=True,
        )
        for i in range(scenario.clients)
    ]
    window_stats: list[dict[str, float]] = []
    try:
        spawned = time.monotonic()
        for process in processes:
            process.start()
        for _ in processes:
            ready.get(timeout=300)
        result.client_start_s = time.monotonic() - spawned
        start = time.monotonic() + args.warmup
        bounds = [start + r * args.window for r in range(windows + 1)]
        bounds_shared[:] = bounds
        stop_at.value = bounds[-1]
        go.set()
        _sleep_until(start)
        result.memory = server.memory_mib()
        meter = CpuMeter(
            {
                "bench": [os.getpid()],
                "server": [server.process.pid],
                "learner": [pid for pid, _ in _children(server.process.pid)],
                "clients": [p.pid for p in processes if p.pid is not None],
            }
        )
        before = server.metrics()
        for r in range(windows):
            _sleep_until(bounds[r + 1])
            cores = meter.lap()
            after = server.metrics()
            window_stats.append(_server_window(before, after, args.window))
            window_stats[-1].update({f"{k}_cores": v for k, v in cores.items()})
            before = after
            clean = sum(w["other_cores"] <= args.max_other_load for w in window_stats)
            hopeless = r + 1 >= args.repeats and windows - r - 1 < args.repeats - clean
            if clean >= args.repeats or hopeless:
                # Enough clean windows (or too few left to get them): stop the clients now.
                stop_at.value = bounds[r + 1]
                break
        reports = [results.get(timeout=120) for _ in processes]
        for process in processes:
            process.join(timeout=30)
    finally:
        for process in processes:
            if process.is_alive():
                process.terminate()
        server.stop()
    # Keep the windows other processes left alone; if there are too few, keep them all.
    kept = [r for r, w in enumerate(window_stats) if w["other_cores"] <= args.max_other_load]
    if len(kept) < args.repeats:
        kept = list(range(len(window_stats)))
    result.windows_run, result.windows_kept = len(window_stats), len(kept)
    for r in kept:
        steps = sum(report["steps"][r] for report in reports)
        lat = np.concatenate([report["latencies"][r] for report in reports]) * 1e3
        result.steps_per_s.append(steps / args.window)
        result.p50_ms.append(float(np.percentile(lat, 50)) if lat.size else float("nan"))
        result.p99_ms.append(float(np.percentile(lat, 99)) if lat.size else float("nan"))
        for name, value in window_stats[r].items():
            getattr(result, name).append(value)
    return result


def _server_window(
    before: dict[str, Any], after: dict[str, Any], window: float
) -> dict[str, float]:
    def value(metrics: dict[str, Any], key: str) -> float:
        raw = metrics.get(key)
        return 0.0 if raw is None else float(raw)

    # actions_served == env_steps here (no log_action), so batches = env_steps / mean batch.
    def batches(metrics: dict[str, Any]) -> float:
        mean = value(metrics, "server/mean_inference_batch")
        return value(metrics, "samples/env_steps") / mean if mean else 0.0

    served = value(after, "samples/env_steps") - value(before, "samples/env_steps")
    count = batches(after) - batches(before)
    return {
        "learner_updates": value(after, "learner/updates") - value(before, "learner/updates"),
        "steps_trained": value(after, "learner/steps_trained")
        - value(before, "learner/steps_trained"),
        "update_seconds": value(after, "learner/update_seconds"),
        "server_steps_per_s": served / window,
        "mean_batch": served / count if count > 0 else float("nan"),
    }


def _sleep_until(deadline: float) -> None:
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(left, 0.5))


# -- report -------------------------------------------------------------------------------------


def _table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    line = "| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |"
    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    body = [
        "| "
        + " | ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        + " |"
        for r in rows
    ]
    return "\n".join([line, rule, *body])


def _learner_text(res: Result) -> str:
    return "training" if res.scenario.training else "idle"


def report(results: dict[str, Result], args: argparse.Namespace) -> str:
    speed_rows = []
    cpu_rows = []
    for res in results.values():
        sc = res.scenario
        speed_rows.append(
            [
                sc.label,
                str(sc.clients),
                str(sc.envs_per_client),
                _learner_text(res),
                f"{res.median('steps_per_s'):,.0f}",
                f"{res.median('p50_ms'):.2f}",
                f"{res.median('p99_ms'):.2f}",
                f"{res.median('mean_batch'):.1f}",
                f"{res.median('learner_updates') / args.window:.1f}",
                f"{res.median('steps_trained') / args.window:,.0f}",
                f"{res.median('update_seconds'):.2f}" if sc.training else "-",
                f"{res.windows_kept}/{res.windows_run}",
            ]
        )
        cpu_rows.append(
            [
                sc.label,
                _learner_text(res),
                *(
                    f"{res.median(f'{group}_cores'):.2f}"
                    for group in ("server", "learner", "clients", "kernel", "other")
                ),
                f"{res.per_step('server_cores'):.0f}",
                f"{res.per_step('clients_cores'):.0f}",
                f"{res.memory.get('server_mib', float('nan')):.0f}",
                f"{res.memory.get('learner_mib', float('nan')):.0f}",
                f"{res.memory.get('total_mib', float('nan')):.0f}",
            ]
        )
    out = [
        f"Medians over {args.repeats} measurement windows of {args.window:g} s (after"
        f" {args.warmup:g} s warm-up); one fresh server per scenario. Latency percentiles pool"
        " every get_action of every client in a window. Windows in which other processes used"
        f" more than {args.max_other_load:g} cores are replaced by extra ones (kept/run).",
        "",
        _table(
            [
                "scenario",
                "client procs",
                "envs/client",
                "learner",
                "env steps/s",
                "get_action p50 ms",
                "p99 ms",
                "mean server batch",
                "learner updates/s",
                "learner steps trained/s",
                "s per update",
                "windows kept/run",
            ],
            speed_rows,
        ),
        "",
        "CPU: average cores busy during the windows (2 cores = fully busy); kernel = interrupts,"
        " softirqs and kernel threads (mostly the loopback network stack); other = every process"
        " outside the benchmark. RSS: VmRSS after warm-up.",
        "",
        _table(
            [
                "scenario",
                "learner",
                "server cores",
                "learner cores",
                "clients cores",
                "kernel cores",
                "other cores",
                "server CPU us/step",
                "clients CPU us/step",
                "server MiB",
                "learner MiB",
                "server+learner MiB",
            ],
            cpu_rows,
        ),
        "",
    ]
    listening = [r.listening_s for r in results.values()]
    first = [r.first_action_s for r in results.values()]
    servers = [r.memory.get("server_mib", float("nan")) for r in results.values()]
    learners = [r.memory.get("learner_mib", float("nan")) for r in results.values()]
    out += [
        _table(
            [f"server start-up (median of {len(listening)} starts)", "seconds"],
            [
                ["launch -> listening line", f"{statistics.median(listening):.2f}"],
                ["launch -> first action served", f"{statistics.median(first):.2f}"],
            ],
        ),
        "",
        f"Memory after warm-up (median over scenarios): server {statistics.median(servers):.0f}"
        f" MiB + learner {statistics.median(learners):.0f} MiB"
        f" = {statistics.median(servers) + statistics.median(learners):.0f} MiB (VmRSS).",
        "",
    ]
    target_rows = []
    for label, key, metric, op, threshold in TARGETS:
        if key not in results:
            continue
        value = results[key].median(metric)
        ok = value >= threshold if op == ">=" else value < threshold
        unit = " ms" if metric.endswith("_ms") else ""
        shown = f"{value:.2f}{unit}" if unit else f"{value:,.0f}"
        target_rows.append([label, f"{op} {threshold:,g}{unit}", shown, "PASS" if ok else "FAIL"])
    out.append(_table(["target", "wanted", "measured", ""], target_rows))
    for res in results.values():
        name = f"{res.scenario.label}, learner {_learner_text(res)}"
        stalled = sum(updates <= 0 for updates in res.learner_updates)
        if res.scenario.training and stalled:
            out.append(
                f"NOTE: {name}: learner/updates did not grow in {stalled} of"
                f" {len(res.learner_updates)} windows: an update took"
                f" {res.median('update_seconds'):.1f} s and the window is {args.window:g} s"
            )
        if not res.scenario.training and max(res.learner_updates, default=0) > 0:
            out.append(f"WARNING: {name}: the learner updated although no episode trains")
        if max(res.other_cores, default=0) > args.max_other_load:
            out.append(
                f"WARNING: {name}: processes outside the benchmark used up to"
                f" {max(res.other_cores):.2f} cores during a window"
            )
    return "\n".join(out)


# -- main ---------------------------------------------------------------------------------------


def scenarios(client_counts: list[int]) -> list[Scenario]:
    chosen = []
    for training in (False, True):
        tag = "train" if training else "idle"
        for n in client_counts:
            label = f"{n} client{'s' if n > 1 else ''}"
            chosen.append(Scenario(f"{tag}-{n}", label, n, 1, training))
        chosen.append(Scenario(f"vec16-{tag}", "1 client, 16-env vector", 1, 16, training))
    return chosen


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="measurement windows per scenario")
    parser.add_argument("--window", type=float, help="seconds per window (5; --quick: 2)")
    parser.add_argument("--warmup", type=float, help="seconds of warm-up (5; --quick: 2)")
    parser.add_argument("--quick", action="store_true", help="short windows, fewer scenarios")
    parser.add_argument(
        "--clients", type=int, nargs="+", help="client process counts (1 8 64; --quick: 1 8)"
    )
    parser.add_argument("--only", nargs="+", help="run only these scenario keys, e.g. train-8")
    parser.add_argument("--json", type=Path, help="also write every measurement to this file")
    parser.add_argument("--run-dir", type=Path, help="keep the servers' run folders here")
    parser.add_argument(
        "--max-other-load",
        type=float,
        default=0.15,
        help="before each scenario wait until other processes use fewer cores than this",
    )
    parser.add_argument(
        "--extra-windows",
        type=int,
        default=2,
        help="up to repeats x this many more windows replace ones where other processes were busy",
    )
    parser.add_argument(
        "--wait-quiet", type=float, default=300.0, help="longest wait for a quiet machine (s)"
    )
    args = parser.parse_args()
    args.window = args.window or (2.0 if args.quick else 5.0)
    args.warmup = args.warmup or (2.0 if args.quick else 5.0)
    args.clients = args.clients or ([1, 8] if args.quick else [1, 8, 64])
    chosen = scenarios(args.clients)
    if args.only:
        chosen = [s for s in chosen if s.key in args.only]

    ctx = mp.get_context("spawn")
    run_dir = args.run_dir or Path(tempfile.mkdtemp(prefix="rlserve-bench-"))
    results: dict[str, Result] = {}
    try:
        for scenario in chosen:
            load = wait_for_quiet(args.max_other_load, args.wait_quiet)
            print(
                f"running {scenario.key} (other processes use {load:.2f} cores) ...",
                file=sys.stderr,
                flush=True,
            )
            res = run_scenario(scenario, args, run_dir, ctx)
            res.load_before = load
            results[scenario.key] = res
            print(
                f"  {res.median('steps_per_s'):,.0f} env steps/s, p50 {res.median('p50_ms'):.2f}"
                f" ms, p99 {res.median('p99_ms'):.2f} ms, updates/window {res.learner_updates}",
                file=sys.stderr,
                flush=True,
            )
    finally:
        if args.run_dir is None:
            shutil.rmtree(run_dir, ignore_errors=True)
    print(report(results, args))
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "args": {k: str(v) for k, v in vars(args).items()},
                    "results": [asdict(r) for r in results.values()],
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
