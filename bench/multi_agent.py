"""Multi-agent benchmark: agent-steps/s of one simulator with 256 agents in one episode.

Run: ``python bench/multi_agent.py`` (``--repeats 3`` by default; ``--quick`` for one short run).

One simulator process drives ``--agents`` agents of one policy in ONE episode through
``PolicyClient(address, inference_mode=..., multiagent=True)``, exactly as a user would: every tick
one ``get_action(episode_id, {agent_id: obs})`` (one round trip in remote mode) and one
``log_returns(episode_id, {agent_id: reward})``; after ``--ticks`` ticks ``end_episode`` with every
agent's final observation, and a new episode starts. The simulator is a fake that costs next to
nothing (a ``Box(4,)`` observation per agent moved by the actions with numpy; ``Discrete(3)``
actions; reward 1 for action 1). The server is a real ``rlserve serve`` subprocess on 127.0.0.1
port 0 with PPO settings small enough that it trains all the time: every figure is taken while the
learner trains, which the run checks from ``learner/steps_consumed`` and the weights version in
``GET /v1/metrics`` (printed per run).

Figures, each for a fixed wall time after a warm-up, remote and local inference:

* multi-agent: agent-steps/s (ticks/s x agents);
* the anchor, measured in the same run: the same simulator as ``--agents`` single-agent episodes
  stepped with the batched list-of-ids ``get_action(ids, stacked_obs)`` (the vector client of
  ``bench/remote_inference.py``) and one ``log_returns`` per episode; env-steps/s. The ratio
  multi-agent / anchor says what the multi-agent form costs over the single-agent batched form.

Local mode uses the client's defaults, ``when_full="drop"``: the simulator never waits, and the
steps the learner cannot take (the shipper has one batch in flight, answered once the learner has
it) are dropped and counted; the run prints how many steps per second the server took and how many
the client dropped. ``--block`` runs local mode with ``when_full="block"`` instead, so the
simulator is paced by the learner and nothing is dropped.

Each repeat starts a fresh server and runs the four phases on it (in an order rotated per
repeat); before each phase it waits (up to ``--wait-quiet`` seconds) until other processes use
less than ``--max-other-load`` cores. The table shows medians over repeats, with every run. CPU use
of the simulator, the serving process, the learner and everything else over each window comes
from ``/proc``. ``--profile DIR`` writes a cProfile of the simulator process of each phase, and of
each serving process, there.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from _server import BenchServer, child_pids, start_server

OBS_DIM = 4
ACTIONS = 3
PHASES = ("remote-multi", "local-multi", "remote-anchor", "local-anchor")
TARGETS = {"remote-multi": 50_000.0, "local-multi": 200_000.0}
PPO_FLAGS = [
    "--ppo-train-batch-size",
    "4096",
    "--ppo-minibatch-size",
    "1024",
    "--ppo-num-epochs",
    "1",
    "--max-sample-queue-steps",
    "20000",
]
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


# -- the simulator process ---------------------------------------------------------------------


class FakeSim:
    """``agents`` agents on a line: observations move with the actions; reward 1 for action 1."""

    def __init__(self, agents: int, seed: int = 0):
        self.ids = [f"agent_{i}" for i in range(agents)]
        rng = np.random.default_rng(seed)
        self.obs = rng.uniform(-0.5, 0.5, (agents, OBS_DIM)).astype(np.float32)
        self.rows = list(self.obs)  # views: they follow the in-place updates

    def observations(self) -> dict[str, np.ndarray]:
        """The observation dict of a multi-agent env (one view per agent)."""
        return dict(zip(self.ids, self.rows, strict=True))

    def step(self, actions: np.ndarray) -> np.ndarray:
        """Apply the actions (in agent order); return the rewards in agent order."""
        self.obs += (actions.astype(np.float32) - 1.0)[:, None] * 0.01
        np.clip(self.obs, -1.0, 1.0, out=self.obs)
        return (actions == 1).astype(np.float64)


def _multi_loop(client: Any, sim: FakeSim, ticks: int, until: float) -> int:
    """Tick until ``until``; return the ticks done."""
    done = 0
    ids = sim.ids
    count = len(ids)
    while True:
        episode_id = client.start_episode()
        for _ in range(ticks):
            actions = client.get_action(episode_id, sim.observations())
            rewards = sim.step(np.fromiter(actions.values(), dtype=np.int64, count=count))
            client.log_returns(episode_id, dict(zip(ids, rewards.tolist(), strict=True)))
            done += 1
            if time.monotonic() >= until:
                client.end_episode(episode_id, sim.observations(), truncated=True)
                return done
        client.end_episode(episode_id, sim.observations(), truncated=True)


def _anchor_loop(client: Any, sim: FakeSim, ticks: int, until: float) -> int:
    """The same simulator as single-agent episodes with one batched ``get_action`` per tick."""
    done = 0
    while True:
        episodes = [client.start_episode() for _ in sim.ids]
        for _ in range(ticks):
            actions = client.get_action(episodes, sim.obs)
            rewards = sim.step(np.asarray(actions, dtype=np.int64)).tolist()
            for episode_id, reward in zip(episodes, rewards, strict=True):
                client.log_returns(episode_id, reward)
            done += 1
            if time.monotonic() >= until:
                break
        for i, episode_id in enumerate(episodes):
            client.end_episode(episode_id, sim.obs[i], truncated=True)
        if time.monotonic() >= until:
            return done


def sim_process(
    address: str,
    phase: str,
    agents: int,
    ticks: int,
    warmup: float,
    seconds: float,
    profile: str | None,
    block: bool,
    events: Any,
) -> None:
    from rlserve import PolicyClient
    from rlserve.client.local import LocalConfig

    mode, form = phase.split("-")
    client = PolicyClient(
        address,
        inference_mode=mode,
        multiagent=form == "multi",
        client_name=f"bench-{phase}",
        local=LocalConfig(when_full="block" if block else "drop"),
    )
    sim = FakeSim(agents)
    loop = _multi_loop if form == "multi" else _anchor_loop
    loop(client, sim, ticks, time.monotonic() + warmup)
    profiler = None
    if profile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    dropped = client.local.dropped_steps if client.local is not None else 0
    events.put(("start", time.monotonic()))
    started = time.perf_counter()
    measured = loop(client, sim, ticks, time.monotonic() + seconds)
    elapsed = time.perf_counter() - started
    if client.local is not None:
        dropped = client.local.dropped_steps - dropped
    events.put(("end", measured, elapsed, dropped))
    if profiler is not None:
        profiler.disable()
        assert profile is not None
        profiler.dump_stats(str(Path(profile) / f"sim-{phase}-{os.getpid()}.prof"))
    client.close(timeout=10)
    events.put(("closed",))


# -- measurement ---------------------------------------------------------------------------------


def _cpu_s(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def _machine_busy_s() -> float:
    """CPU seconds the whole machine has been busy since boot (every core)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / CLOCK_TICKS


def wait_for_quiet(max_load: float, timeout: float) -> float:
    """Wait until other processes use under ``max_load`` cores for 1 s; return the last load."""
    deadline = time.monotonic() + timeout
    while True:
        busy, started = _machine_busy_s(), time.monotonic()
        time.sleep(1.0)
        load = (_machine_busy_s() - busy) / (time.monotonic() - started)
        if load < max_load or time.monotonic() > deadline:
            return load


def _snapshot(server: BenchServer, sim_pid: int) -> dict[str, Any]:
    learners = child_pids(server.process.pid)
    return {
        "time": time.monotonic(),
        "busy": _machine_busy_s(),
        "metrics": server.get_json("/v1/metrics"),
        "cpu_sim": _cpu_s(sim_pid),
        "cpu_server": _cpu_s(server.process.pid),
        "cpu_learner": sum(_cpu_s(pid) for pid in learners),
    }


def run_phase(server: BenchServer, phase: str, args: argparse.Namespace) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    events = ctx.Queue()
    process = ctx.Process(
        target=sim_process,
        args=(
            server.address,
            phase,
            args.agents,
            args.ticks,
            args.warmup,
            args.seconds,
            str(args.profile) if args.profile else None,
            args.block,
            events,
        ),
        daemon=True,
    )
    process.start()
    assert process.pid is not None
    try:
        kind, *_ = events.get(timeout=args.warmup + 180)
        assert kind == "start"
        before = _snapshot(server, process.pid)
        kind, ticks, elapsed, dropped = events.get(timeout=args.seconds + 180)
        assert kind == "end"
        after = _snapshot(server, process.pid)
        events.get(timeout=60)
        process.join(30)
    finally:
        if process.is_alive():
            process.terminate()
    wall = after["time"] - before["time"]
    cores = {
        name: (after[f"cpu_{name}"] - before[f"cpu_{name}"]) / wall
        for name in ("sim", "server", "learner")
    }
    other = (after["busy"] - before["busy"]) / wall - sum(cores.values())
    steps_per_s = ticks * args.agents / elapsed

    def grew(name: str) -> float:
        return float(after["metrics"].get(name) or 0) - float(before["metrics"].get(name) or 0)

    return {
        "phase": phase,
        "steps_per_s": steps_per_s,
        "ticks_per_s": ticks / elapsed,
        "consumed": grew("learner/steps_consumed"),
        "env_steps": grew("samples/env_steps"),
        "taken_per_s": grew("samples/env_steps") / wall,
        "dropped": dropped,
        "updates": grew("learner/updates"),
        "version_before": before["metrics"].get("server/weights_version"),
        "version_after": after["metrics"].get("server/weights_version"),
        "cores_sim": cores["sim"],
        "cores_server": cores["server"],
        "cores_learner": cores["learner"],
        "cores_other": max(other, 0.0),
        "us_sim": cores["sim"] / steps_per_s * 1e6,
        "us_server": cores["server"] / steps_per_s * 1e6,
    }


def spaces_file(folder: Path) -> Path:
    path = folder / "spaces.json"
    path.write_text(
        json.dumps(
            {
                "observation_space": {
                    "type": "Box",
                    "shape": [OBS_DIM],
                    "dtype": "float32",
                    "low": -1.0,
                    "high": 1.0,
                },
                "action_space": {"type": "Discrete", "n": ACTIONS},
            }
        )
    )
    return path


def one_repeat(repeat: int, args: argparse.Namespace, folder: Path) -> list[dict[str, Any]]:
    flags = ["--spaces-file", str(spaces_file(folder)), *PPO_FLAGS]
    profile = None
    if args.profile:
        profile = args.profile / f"server-repeat{repeat}-{os.getpid()}.prof"
    server = start_server(flags, folder / f"repeat{repeat}", profile=profile)
    try:
        server.wait_for_weights()
        phases = [p for p in PHASES if p in args.phases]
        shift = repeat % len(phases)
        results = []
        for phase in phases[shift:] + phases[:shift]:
            load = wait_for_quiet(args.max_other_load, args.wait_quiet)
            result = run_phase(server, phase, args)
            result["load_before"] = load
            print(
                f"  repeat {repeat + 1} {phase:<14} {result['steps_per_s']:>10,.0f} steps/s  "
                f"server took {result['taken_per_s']:,.0f}/s, client dropped "
                f"{result['dropped']:,}, learner consumed "
                f"{result['consumed']:,.0f} steps, {result['updates']:.0f} "
                f"updates, weights v{result['version_before']} -> v{result['version_after']}; "
                f"cores: sim {result['cores_sim']:.2f} server {result['cores_server']:.2f} "
                f"learner {result['cores_learner']:.2f} others {result['cores_other']:.2f}",
                file=sys.stderr,
                flush=True,
            )
            results.append(result)
        return results
    finally:
        code = server.stop()
        if code != 0:
            print(f"WARNING: the server exited with {code}:\n{server.log()}", file=sys.stderr)


def report(runs: list[dict[str, Any]], args: argparse.Namespace) -> str:
    by_phase: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        by_phase.setdefault(run["phase"], []).append(run)

    def median(phase: str, key: str) -> float:
        return float(statistics.median(r[key] for r in by_phase[phase]))

    lines = [
        f"multi-agent benchmark: {args.agents} agents of one policy in one episode, "
        f"{args.ticks}-tick episodes, {args.seconds:g} s per run after {args.warmup:g} s "
        f"warm-up, {args.repeats} repeat(s); medians",
        "",
        f"{'figure':<46}{'median':>12}{'target':>10}  {'verdict':<8} runs",
    ]
    for phase in (p for p in PHASES if p in by_phase):
        mode, form = phase.split("-")
        label = (
            f"{mode}, multi-agent, agent-steps/s"
            if form == "multi"
            else f"{mode}, anchor ({args.agents} episodes batched), env-steps/s"
        )
        value = median(phase, "steps_per_s")
        target = TARGETS.get(phase)
        verdict = "" if target is None else ("PASS" if value >= target else "FAIL")
        shown = "" if target is None else f"{target:,.0f}"
        each = " / ".join(f"{r['steps_per_s']:,.0f}" for r in by_phase[phase])
        lines.append(f"{label:<46}{value:>12,.0f}{shown:>10}  {verdict:<8} {each}")
    for mode in ("remote", "local"):
        multi, anchor = f"{mode}-multi", f"{mode}-anchor"
        if multi in by_phase and anchor in by_phase:
            ratios = [
                m["steps_per_s"] / a["steps_per_s"]
                for m, a in zip(by_phase[multi], by_phase[anchor], strict=False)
            ]
            lines.append(
                f"{mode}: multi-agent / anchor = {statistics.median(ratios):.2f} "
                f"(per repeat: {', '.join(f'{r:.2f}' for r in ratios)})"
            )
    lines += [
        "",
        "steps the server took per second (medians; local mode: reported batches, paced by the "
        "learner; the rest is dropped by the client, when_full='drop'):",
        "  "
        + "; ".join(
            f"{phase} {median(phase, 'taken_per_s'):,.0f}" for phase in PHASES if phase in by_phase
        ),
        "",
        "while training (per run: learner steps consumed, updates, weights versions):",
    ]
    for phase in (p for p in PHASES if p in by_phase):
        cells = [
            f"{r['consumed']:,.0f} / {r['updates']:.0f} / v{r['version_before']}->"
            f"v{r['version_after']}"
            for r in by_phase[phase]
        ]
        lines.append(f"  {phase:<14} " + "; ".join(cells))
    stalled = [r for r in runs if r["consumed"] <= 0 or r["updates"] <= 0]
    if stalled:
        lines.append(f"WARNING: the learner did not train during {len(stalled)} run(s)")
    lines += [
        "",
        "CPU (medians): cores busy in the simulator / serving process / learner / other processes"
        " on the machine; CPU microseconds per agent-step in the simulator / serving process",
    ]
    for phase in (p for p in PHASES if p in by_phase):
        lines.append(
            f"  {phase:<14} {median(phase, 'cores_sim'):.2f} / "
            f"{median(phase, 'cores_server'):.2f} / {median(phase, 'cores_learner'):.2f} / "
            f"{median(phase, 'cores_other'):.2f} cores;  {median(phase, 'us_sim'):.2f} / "
            f"{median(phase, 'us_server'):.2f} us per agent-step"
        )
    busy = [r for r in runs if r["cores_other"] > args.max_other_load]
    if busy:
        lines.append(
            f"NOTE: other processes used more than {args.max_other_load:g} cores during "
            f"{len(busy)} of {len(runs)} runs (up to {max(r['cores_other'] for r in busy):.2f})"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="fresh servers, each runs all")
    parser.add_argument("--agents", type=int, default=256)
    parser.add_argument("--ticks", type=int, default=300, help="ticks per episode")
    parser.add_argument("--seconds", type=float, help="measured seconds per run (10; quick 4)")
    parser.add_argument("--warmup", type=float, help="seconds before measuring (3; quick 2)")
    parser.add_argument("--phases", nargs="+", default=list(PHASES), choices=PHASES)
    parser.add_argument("--quick", action="store_true", help="one short repeat")
    parser.add_argument(
        "--block",
        action="store_true",
        help="local mode with LocalConfig(when_full='block'): paced by the learner, drops nothing",
    )
    parser.add_argument(
        "--profile", type=Path, help="write cProfile files of the simulators and servers here"
    )
    parser.add_argument("--json", type=Path, help="also write every run to this file")
    parser.add_argument(
        "--max-other-load",
        type=float,
        default=0.2,
        help="before each run wait until other processes use fewer cores than this",
    )
    parser.add_argument(
        "--wait-quiet", type=float, default=60.0, help="longest wait for a quiet machine (s)"
    )
    args = parser.parse_args()
    if args.quick:
        args.repeats = 1
    args.seconds = args.seconds or (4.0 if args.quick else 10.0)
    args.warmup = args.warmup or (2.0 if args.quick else 3.0)
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="rlserve-mabench-") as tmp:
        for repeat in range(args.repeats):
            runs += one_repeat(repeat, args, Path(tmp))
    print(report(runs, args))
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
