"""Scenarios, per-window results and the report of ``bench/remote_inference.py``.

The report's tables: speed (with each rlserve figure's share of the same-run loopback limit of
the same client count), CPU (cores and CPU µs per step of the serving process, the learner and
the clients), start-up, memory, and the targets of issue 21 with the earlier ones below them.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass, field

Target = tuple[str, str, str, str, float]
"""(label, scenario key, metric, comparison, threshold); metrics: see :func:`measure`."""

TARGETS: tuple[Target, ...] = (
    ("1 client, training: serving CPU per remote step", "train-1", "server_us", "<=", 60.0),
    ("8 clients, training: serving CPU per remote step", "train-8", "server_us", "<=", 60.0),
    ("1 client, training: share of the same-run limit", "train-1", "limit_share", ">=", 0.6),
    ("8 clients, training: share of the same-run limit", "train-8", "limit_share", ">=", 0.5),
    ("8 clients, training: p99 get_action", "train-8", "p99_ms", "<", 2.0),
)

EARLIER_TARGETS: tuple[Target, ...] = (
    ("1 client, learner idle: env steps/s", "idle-1", "steps_per_s", ">=", 2_500.0),
    ("8 clients, learner idle: env steps/s", "idle-8", "steps_per_s", ">=", 8_000.0),
    ("8 clients, learner training: p99 get_action", "train-8", "p99_ms", "<", 5.0),
    ("16-env vector client, learner idle: env steps/s", "vec16-idle", "steps_per_s", ">=", 15e3),
    ("16-env vector client, training: env steps/s", "vec16-train", "steps_per_s", ">=", 15e3),
)


_CLIENTS = {
    "policy": "rlserve.PolicyClient",
    "wire": "the bare protocol client of bench/_wire_client.py (--client wire)",
}


@dataclass
class Scenario:
    """What runs against one fresh server (``limit``: the echo server instead of rlserve).

    ``learner_load``: a learner-shaped process runs beside the echo server
    (``bench/_learner_load.py``, ``--limit-load``). ``policy_floor``: the limit's server is the
    policy floor (``bench/_loopback_limit.py --policy``, ``--limit-policy``), not the echo.
    """

    key: str
    label: str
    clients: int
    envs_per_client: int
    training: bool
    limit: bool = False
    learner_load: bool = False
    policy_floor: bool = False


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

    def learner_per_trained_step(self, window: float) -> float:
        """Median over windows of the learner's CPU microseconds per env step it trained."""
        values = [
            cores / (trained / window) * 1e6
            for cores, trained in zip(self.learner_cores, self.steps_trained, strict=True)
            if trained > 0
        ]
        return float(statistics.median(values)) if values else float("nan")


def limit_share(results: dict[str, Result], key: str) -> float | None:
    """Env steps/s of scenario ``key`` over those of the same-run limit of its client count."""
    res = results.get(key)
    if res is None or res.scenario.limit or res.scenario.envs_per_client != 1:
        return None
    limit = results.get(f"limit-{res.scenario.clients}")
    if limit is None:
        return None
    return res.median("steps_per_s") / limit.median("steps_per_s")


def measure(results: dict[str, Result], key: str, metric: str) -> float | None:
    """The figure a target names: a median field, ``server_us`` or ``limit_share``."""
    if key not in results:
        return None
    if metric == "limit_share":
        return limit_share(results, key)
    if metric == "server_us":
        return results[key].per_step("server_cores")
    return results[key].median(metric)


def _shown(metric: str, value: float) -> str:
    if metric.endswith("_ms"):
        return f"{value:.2f} ms"
    if metric.endswith("_us"):
        return f"{value:.0f} µs"
    if metric == "limit_share":
        return f"{value:.2f}"
    return f"{value:,.0f}"


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
    if res.scenario.limit:
        server = "policy floor" if res.scenario.policy_floor else "echo"
        return f"learner load ({server})" if res.scenario.learner_load else f"none ({server})"
    return "training" if res.scenario.training else "idle"


def _target_table(results: dict[str, Result], targets: tuple[Target, ...]) -> str:
    rows = []
    for label, key, metric, op, threshold in targets:
        value = measure(results, key, metric)
        if value is None:
            continue
        ok = {">=": value >= threshold, "<=": value <= threshold, "<": value < threshold}[op]
        rows.append(
            [
                label,
                f"{op} {_shown(metric, threshold)}",
                _shown(metric, value),
                "PASS" if ok else "FAIL",
            ]
        )
    return _table(["target", "wanted", "measured", ""], rows) if rows else "(no scenario ran)"


def _rows(
    results: dict[str, Result], args: argparse.Namespace
) -> tuple[list[list[str]], list[list[str]]]:
    speed_rows, cpu_rows = [], []
    for res in results.values():
        sc = res.scenario
        rlserve = not sc.limit
        share = limit_share(results, sc.key)
        speed_rows.append(
            [
                sc.label,
                str(sc.clients),
                str(sc.envs_per_client),
                _learner_text(res),
                f"{res.median('steps_per_s'):,.0f}",
                "-" if share is None else f"{share:.2f}",
                f"{res.median('p50_ms'):.2f}",
                f"{res.median('p99_ms'):.2f}",
                f"{res.median('mean_batch'):.1f}" if rlserve else "-",
                f"{res.median('learner_updates') / args.window:.1f}" if rlserve else "-",
                f"{res.median('steps_trained') / args.window:,.0f}" if rlserve else "-",
                f"{res.median('update_seconds'):.2f}" if sc.training and rlserve else "-",
                f"{res.windows_kept}/{res.windows_run}",
            ]
        )
        trained = res.learner_per_trained_step(args.window)
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
                f"{trained:.0f}" if sc.training and rlserve else "-",
                f"{res.memory.get('server_mib', float('nan')):.0f}",
                f"{res.memory.get('learner_mib', float('nan')):.0f}" if rlserve else "-",
            ]
        )
    return speed_rows, cpu_rows


def report(
    results: dict[str, Result],
    args: argparse.Namespace,
    loads: tuple[tuple[float, ...], tuple[float, ...]],
) -> str:
    """The benchmark's tables, notes and targets as Markdown-style text.

    Args:
        results: Scenario key -> result, in the order they ran.
        args: The command line (``window``, ``warmup``, ``repeats``, ``max_other_load``).
        loads: The machine's 1/5/15-minute load averages at the start and at the end.
    """
    speed_rows, cpu_rows = _rows(results, args)
    start, end = (", ".join(f"{v:.2f}" for v in load) for load in loads)
    out = [
        f"Load average (1, 5, 15 min): {start} at the start, {end} at the end.",
        "",
        f"Medians over {args.repeats} measurement windows of {args.window:g} s (after"
        f" {args.warmup:g} s warm-up); one fresh server per scenario. Latency percentiles pool"
        " every get_action of every client in a window. Windows in which other processes used"
        f" more than {args.max_other_load:g} cores are replaced by extra ones (kept/run)."
        " limit-N: the same client loop against an echo server, one msgpack round trip per step"
        " (bench/_loopback_limit.py); share = env steps/s over the limit's of the same client"
        f" count, this run. rlserve's clients: {_CLIENTS[args.client]}.",
        "",
        _table(
            [
                "scenario",
                "client procs",
                "envs/client",
                "learner",
                "env steps/s",
                "share of limit",
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
        " outside the benchmark. server/clients CPU us/step: per env step served; learner CPU"
        " us/step trained: learner cores over env steps trained per second. RSS: VmRSS after"
        " warm-up (server = the echo server for limit-N).",
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
                "learner CPU us/step trained",
                "server MiB",
                "learner MiB",
            ],
            cpu_rows,
        ),
        "",
    ]
    served = [r for r in results.values() if not r.scenario.limit]
    if served:
        servers = [r.memory.get("server_mib", float("nan")) for r in served]
        learners = [r.memory.get("learner_mib", float("nan")) for r in served]
        out += [
            _table(
                [f"rlserve start-up (median of {len(served)} starts)", "seconds"],
                [
                    [
                        "launch -> listening line",
                        f"{statistics.median(r.listening_s for r in served):.2f}",
                    ],
                    [
                        "launch -> first action served",
                        f"{statistics.median(r.first_action_s for r in served):.2f}",
                    ],
                ],
            ),
            "",
            f"Memory after warm-up (median over scenarios): server {statistics.median(servers):.0f}"
            f" MiB + learner {statistics.median(learners):.0f} MiB"
            f" = {statistics.median(servers) + statistics.median(learners):.0f} MiB (VmRSS).",
            "",
        ]
    out += [
        "Targets (issue 21):",
        "",
        _target_table(results, TARGETS),
        "",
        "Earlier targets:",
        "",
        _target_table(results, EARLIER_TARGETS),
    ]
    out += _notes(results, args)
    return "\n".join(out)


def _notes(results: dict[str, Result], args: argparse.Namespace) -> list[str]:
    notes = []
    for res in results.values():
        name = f"{res.scenario.label}, learner {_learner_text(res)}"
        stalled = sum(updates <= 0 for updates in res.learner_updates)
        if res.scenario.training and stalled:
            notes.append(
                f"NOTE: {name}: learner/updates did not grow in {stalled} of"
                f" {len(res.learner_updates)} windows: an update took"
                f" {res.median('update_seconds'):.1f} s and the window is {args.window:g} s"
            )
        if not res.scenario.training and max(res.learner_updates, default=0) > 0:
            notes.append(f"WARNING: {name}: the learner updated although no episode trains")
        if max(res.other_cores, default=0) > args.max_other_load:
            notes.append(
                f"WARNING: {name}: processes outside the benchmark used up to"
                f" {max(res.other_cores):.2f} cores during a window"
            )
    return notes
