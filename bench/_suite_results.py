"""The learning suite's results file (JSON lines), its tables, its time estimate and its plot."""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from _suite_tasks import WINDOW, RunKey, all_pairs

KEY_FIELDS = ("algo", "task", "contender", "seed", "budget")


def run_id(record: dict[str, Any]) -> tuple[Any, ...]:
    """The fields that name a run (a :class:`RunKey`'s)."""
    return tuple(record[name] for name in KEY_FIELDS)


def load(path: Path) -> list[dict[str, Any]]:
    """The records of a results file, the last one of each run winning (a rerun after an error)."""
    if not path.exists():
        return []
    latest: dict[tuple[Any, ...], dict[str, Any]] = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            # A line cut by a kill while it was written: that run is simply run again.
            print(f"{path}:{number}: not a JSON line, ignored")
            continue
        latest[run_id(record)] = record
    return list(latest.values())


def finished(records: Iterable[dict[str, Any]]) -> set[tuple[Any, ...]]:
    """The runs that need no rerun: those that ended without an error."""
    return {run_id(r) for r in records if "error" not in r}


def append(path: Path, record: dict[str, Any]) -> None:
    """Add one run's record as a line (flushed, so a kill loses at most the run in progress)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as out:
        out.write(json.dumps(record) + "\n")
        out.flush()


def _median(values: Iterable[float | None]) -> float | None:
    present = [float(v) for v in values if v is not None]
    return statistics.median(present) if present else None


def _show(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def tables(records: list[dict[str, Any]]) -> str:
    """Markdown: the medians per (algorithm, task, contender), then every run."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for record in sorted(records, key=lambda r: run_id(r)):
        key = (record["algo"], record["task"], record["budget"], record["contender"])
        groups[key].append(record)
    lines = [
        "| algo | task | budget | contender | runs | final mean (median) | per seed "
        "| reached | steps to threshold | s | steps/s |",
        "|---|---|---:|---|---:|---:|---|---:|---:|---:|---:|",
    ]
    for (algo, task, budget, contender), runs in groups.items():
        done = [r for r in runs if "final_mean" in r]
        note = next((r.get("skipped") or r.get("error") for r in runs if "final_mean" not in r), "")
        if not done:
            lines.append(f"| {algo} | {task} | {budget:,} | {contender} | 0 | {note} |||||")
            continue
        reached = [r for r in done if r.get("steps_to_threshold") is not None]
        has_threshold = done[0].get("threshold") is not None
        lines.append(
            f"| {algo} | {task} | {budget:,} | {contender} | {len(done)} "
            f"| {_show(_median(r['final_mean'] for r in done), '.1f')} "
            f"| {' / '.join(_show(r['final_mean'], '.1f') for r in done)} "
            f"| {f'{len(reached)}/{len(done)}' if has_threshold else '-'} "
            f"| {_show(_median(r['steps_to_threshold'] for r in reached), ',.0f')} "
            f"| {_show(_median(r['seconds'] for r in done), '.1f')} "
            f"| {_show(_median(r['steps_per_s'] for r in done), ',.0f')} |"
        )
    lines += [
        "",
        "| algo | task | contender | seed | final mean | steps to threshold | env steps | s "
        "| steps/s | note |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for record in sorted(records, key=lambda r: run_id(r)):
        note = record.get("error") or record.get("skipped") or ""
        if record.get("zoo_entry") and record["zoo_entry"] != record["task"]:
            note = f"rl-zoo3 entry {record['zoo_entry']}"
        lines.append(
            f"| {record['algo']} | {record['task']} | {record['contender']} | {record['seed']} "
            f"| {_show(record.get('final_mean'), '.1f')} "
            f"| {_show(record.get('steps_to_threshold'), ',.0f')} "
            f"| {_show(record.get('steps'), ',.0f')} | {_show(record.get('seconds'), '.1f')} "
            f"| {_show(record.get('steps_per_s'), ',.0f')} | {note} |"
        )
    return "\n".join(lines)


def estimate_seconds(pending: list[RunKey], records: list[dict[str, Any]]) -> float | None:
    """Seconds the ``pending`` runs should take one at a time, from the recorded steps/s.

    Each run's rate is the median of the same (algorithm, task, contender), else of the same
    (algorithm, contender), else of every run recorded; None when nothing is recorded. Each
    run adds the median start-up (a child process's seconds outside its training).
    """
    rates: dict[tuple[str, ...], list[float]] = defaultdict(list)
    startup = _median(
        r["process_seconds"] - r["seconds"]
        for r in records
        if "process_seconds" in r and "seconds" in r
    )
    for record in records:
        if record.get("steps_per_s"):
            rate = float(record["steps_per_s"])
            rates[record["algo"], record["task"], record["contender"]].append(rate)
            rates[record["algo"], record["contender"]].append(rate)
            rates[()].append(rate)
    if not rates:
        return None
    total = 0.0
    for key in pending:
        for group in ((key.algo, key.task, key.contender), (key.algo, key.contender), ()):
            if rates.get(group):
                total += key.budget / statistics.median(rates[group]) + (startup or 0.0)
                break
    return total


def smoothed(curve: list[list[float]], grid: list[float]) -> list[float | None]:
    """A run's moving mean of returns at each grid step; None before its first episode.

    The window is a tenth of the run's episodes, at most 100.
    """
    window = max(1, min(WINDOW, len(curve) // 10))
    values: list[float | None] = []
    index, recent = 0, []
    for point in grid:
        while index < len(curve) and curve[index][0] <= point:
            recent.append(curve[index][1])
            index += 1
        values.append(statistics.fmean(recent[-window:]) if recent else None)
    return values


def plot(records: list[dict[str, Any]], path: Path) -> None:
    """One panel per (algorithm, task): each contender's median curve over seeds, min-max band."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    panels: dict[tuple[str, str], dict[str, list[dict[str, Any]]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for record in records:
        if record.get("curve"):
            panels[record["algo"], record["task"]][record["contender"]].append(record)
    if not panels:
        raise SystemExit(f"--plot {path}: no run with a learning curve to plot")
    columns = min(4, len(panels))
    rows = -(-len(panels) // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 3.2 * rows), squeeze=False)
    order = {pair: index for index, pair in enumerate(all_pairs())}
    ordered = sorted(panels.items(), key=lambda item: order.get(item[0], len(order)))
    for axis, ((algo, task), contenders) in zip(axes.flat, ordered, strict=False):
        budget = max(r["budget"] for runs in contenders.values() for r in runs)
        grid = list(np.linspace(0, budget, 100))
        for contender, runs in sorted(contenders.items()):
            curves = np.array(
                [[np.nan if v is None else v for v in smoothed(r["curve"], grid)] for r in runs]
            )
            seen = ~np.all(np.isnan(curves), axis=0)
            x = np.array(grid)[seen]
            middle = np.nanmedian(curves[:, seen], axis=0)
            marker = "o" if len(x) < 3 else None
            axis.plot(x, middle, marker=marker, label=f"{contender} ({len(runs)})")
            if len(runs) > 1:
                low = np.nanmin(curves[:, seen], axis=0)
                high = np.nanmax(curves[:, seen], axis=0)
                axis.fill_between(x, low, high, alpha=0.2)
        threshold = next((r.get("threshold") for runs in contenders.values() for r in runs), None)
        if threshold is not None:
            axis.axhline(threshold, color="grey", linestyle=":", linewidth=1)
        axis.set_title(f"{algo.upper()} {task}", fontsize=10)
        axis.set_xlabel("env steps")
        axis.xaxis.set_major_formatter(
            matplotlib.ticker.FuncFormatter(lambda value, _: f"{value / 1000:g}k")
        )
        axis.set_ylabel("return")
        axis.legend(fontsize=7)
    for axis in list(axes.flat)[len(panels) :]:
        axis.set_visible(False)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
