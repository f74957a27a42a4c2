"""The learning suite of issue 22: rlserve's defaults against SB3's and rl-zoo3's, per task.

Run: ``.venv/bin/python bench/suite.py`` (needs the ``bench`` extra: ``pip install -e
'.[bench]'``; ``PYTHONPATH=src`` from a worktree). For each (algorithm, task) of the issue
with its env-step budget, 3 seeds, three contenders:

- ``rlserve``: ``PPOConfig().environment(task)`` (DQN, SAC alike), hosted, every setting its
  default, ``train()`` until the budget;
- ``sb3``: Stable-Baselines3 with its defaults (``MlpPolicy``, one env);
- ``zoo``: SB3 with rl-zoo3's tuned hyperparameters for the task, read from the installed
  rl_zoo3 package (its own budget replaced by the issue's; where it has no entry the run says
  so and is skipped).

Each run is a child process with one torch thread (``--jobs N``: N at once). It records the
mean return of the last 100 training episodes that ended by the budget, the env steps at which
the last-100 mean first reached the task's gymnasium ``reward_threshold`` (where the spec has
one), the wall seconds from building the model to the budget, and the learning curve (every
training episode's return at the env step it ended). Each finished run is appended as a JSON
line to ``--results`` (default ``suite-results.jsonl``); ``--resume FILE`` appends to FILE and
skips the runs it already holds. At the end: a table of medians per (algorithm, task,
contender), and every run.

Options: ``--quick`` (one seed, a subset), ``--only ppo:CartPole-v1 ...``, ``--seeds N``,
``--first-seed K`` (seeds K..K+N-1), ``--contenders rlserve,sb3,zoo``, ``--budget-scale 0.01``
(developers: tiny budgets), ``--plot FILE.png`` (the curves), ``--plot-only RESULTS...`` (tables and
plot from results files, merged; no training), ``--dry-run`` (the plan, and with ``--resume`` an
estimate of its time).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _suite_results import append, estimate_seconds, finished, load, plot, run_id, tables
from _suite_tasks import CONTENDERS, QUICK, RunKey, all_pairs, parse_pairs, plan, threshold


def child(spec: str, out: str) -> int:
    """Run one run here (its :class:`RunKey` as JSON) and write its record to ``out``."""
    from _suite_contenders import run

    key = RunKey(**json.loads(spec))
    record = run(key, threshold(key.task))
    Path(out).write_text(json.dumps(record))
    return 0


class Job:
    """One run's child process, its log and its result file."""

    def __init__(self, key: RunKey, folder: Path) -> None:
        self.key = key
        stem = f"{key.algo}-{key.task}-{key.contender}-{key.seed}"
        self.result = folder / f"{stem}.json"
        self.log = folder / f"{stem}.log"
        self.started = time.monotonic()
        environment = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        # The child runs in the scratch folder (MuJoCo writes MUJOCO_LOG.TXT where it runs):
        # a relative PYTHONPATH (``PYTHONPATH=src``) must still point where it did.
        paths = environment.get("PYTHONPATH", "").split(os.pathsep)
        environment["PYTHONPATH"] = os.pathsep.join(str(Path(p).resolve()) for p in paths if p)
        command = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--child",
            json.dumps(key.as_dict()),
            str(self.result),
        ]
        with self.log.open("w") as log:
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=environment, cwd=folder
            )

    def record(self) -> dict[str, Any]:
        """The run's results line: its key, its record (or its error), and when it ended."""
        base: dict[str, Any] = {
            **self.key.as_dict(),
            "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "process_seconds": round(time.monotonic() - self.started, 2),
        }
        if self.process.returncode == 0 and self.result.exists():
            return {**base, **json.loads(self.result.read_text())}
        tail = self.log.read_text().strip().splitlines()[-3:] if self.log.exists() else []
        return {**base, "error": f"exit {self.process.returncode}: " + " | ".join(tail)}


def clock(seconds: float) -> str:
    """``h:mm:ss``."""
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def execute(runs: list[RunKey], results: Path, jobs: int) -> None:
    """Run ``runs``, ``jobs`` at a time, appending each record to ``results`` as it ends."""
    records = load(results)
    queue = list(runs)
    running: list[Job] = []
    started = time.monotonic()

    def say(text: str) -> None:
        print(f"[{clock(time.monotonic() - started)}] {text}", flush=True)

    with tempfile.TemporaryDirectory(prefix="rlserve-suite-") as folder:
        try:
            while queue or running:
                while queue and len(running) < jobs:
                    running.append(Job(queue.pop(0), Path(folder)))
                    say(f"start {running[-1].key.name} (budget {running[-1].key.budget:,})")
                time.sleep(0.5)
                for job in [j for j in running if j.process.poll() is not None]:
                    running.remove(job)
                    record = job.record()
                    append(results, record)
                    records.append(record)
                    done = len(runs) - len(queue) - len(running)
                    say(f"{done}/{len(runs)} {summary(job, record)}")
                    left = estimate_seconds(queue + [j.key for j in running], records)
                    if left is not None and (queue or running):
                        print(f"    about {clock(left / jobs)} left (estimate)", flush=True)
        finally:
            for job in running:  # interrupted: no child outlives the suite
                job.process.terminate()
                job.process.wait()


def summary(job: Job, record: dict[str, Any]) -> str:
    """A finished run in one line."""
    name = job.key.name
    if "error" in record:
        return f"FAILED {name}: {record['error']} (its last log lines)"
    if "skipped" in record:
        return f"skipped {name}: {record['skipped']}"
    mean = record["final_mean"]
    reached = record.get("steps_to_threshold")
    return (
        f"done {name}: final mean {'-' if mean is None else f'{mean:.1f}'}"
        f"{'' if reached is None else f', threshold at {reached:,}'}, "
        f"{record['seconds']:.1f} s, {record['steps_per_s']:,.0f} steps/s"
    )


def parse() -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one seed, a subset (dev loop)")
    parser.add_argument("--only", nargs="+", metavar="ALGO:TASK", help="only these pairs")
    parser.add_argument("--seeds", type=int, help="seeds per run (default 3; --quick: 1)")
    parser.add_argument(
        "--first-seed", type=int, default=0, help="seeds from this one on (default 0)"
    )
    parser.add_argument("--contenders", default=",".join(CONTENDERS), help="rlserve,sb3,zoo")
    parser.add_argument("--budget-scale", type=float, default=1.0, help="x the issue's budgets")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once (processes)")
    parser.add_argument("--results", type=Path, default=Path("suite-results.jsonl"))
    parser.add_argument("--resume", type=Path, help="append to FILE, skip its finished runs")
    parser.add_argument("--plot", type=Path, help="write the curves to FILE.png at the end")
    parser.add_argument(
        "--plot-only", type=Path, nargs="+", metavar="RESULTS", help="no training; files merged"
    )
    parser.add_argument("--dry-run", action="store_true", help="print the plan, train nothing")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    return parser.parse_args()


def main() -> int:
    """Plan, run, report (or, with ``--child``, one run)."""
    args = parse()
    if args.child:
        return child(*args.child)
    if args.plot_only:
        missing = [str(path) for path in args.plot_only if not path.is_file()]
        if missing:
            raise SystemExit(f"--plot-only: no such results file: {', '.join(missing)}")
        # A run found in several files counts once: a finished record before a failed one,
        # else the last file's.
        merged: dict[tuple[Any, ...], dict[str, Any]] = {}
        for record in (r for path in args.plot_only for r in load(path)):
            kept = merged.get(run_id(record))
            if kept is None or "error" in kept or "error" not in record:
                merged[run_id(record)] = record
        records = list(merged.values())
        print(tables(records))
        if args.plot:
            plot(records, args.plot)
            print(f"plot: {args.plot}")
        return 0
    contenders = [c.strip() for c in args.contenders.split(",") if c.strip()]
    unknown = sorted(set(contenders) - set(CONTENDERS))
    if unknown or not contenders:
        raise SystemExit(f"--contenders {args.contenders}: choose from {','.join(CONTENDERS)}")
    if args.budget_scale <= 0 or args.jobs < 1 or args.first_seed < 0:
        raise SystemExit("--budget-scale must be > 0, --jobs >= 1 and --first-seed >= 0")
    pairs = parse_pairs(args.only) if args.only else list(QUICK) if args.quick else all_pairs()
    seeds = args.seeds if args.seeds is not None else 1 if args.quick else 3
    results = args.resume or args.results
    runs = plan(pairs, contenders, seeds, args.budget_scale, args.first_seed)
    held = finished(load(results)) if args.resume else set()
    pending = [key for key in runs if run_id(key.as_dict()) not in held]
    print(f"{len(pending)} runs to do ({len(runs) - len(pending)} already in {results})")
    if args.dry_run:
        for key in pending:
            print(f"  {key.name} (budget {key.budget:,})")
        left = estimate_seconds(pending, load(results))
        if left is not None:
            print(f"estimate from {results}'s steps/s: {clock(left / args.jobs)}")
        return 0
    execute(pending, results, args.jobs)
    mine = {run_id(key.as_dict()) for key in runs}
    records = [r for r in load(results) if run_id(r) in mine]
    print(tables(records))
    if args.plot:
        plot(records, args.plot)
        print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
