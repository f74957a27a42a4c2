"""The learning suite's runs: which algorithm on which task, with what budget (issue 22).

A run is one (algorithm, task, contender, seed); its budget is the issue's env-step count for
the (algorithm, task), times the developer's ``--budget-scale``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

BUDGETS: dict[str, dict[str, int]] = {
    "ppo": {
        "CartPole-v1": 100_000,
        "Acrobot-v1": 200_000,
        "MountainCarContinuous-v0": 200_000,
        "Pendulum-v1": 300_000,
        "Hopper-v5": 300_000,
        "HalfCheetah-v5": 300_000,
    },
    "dqn": {
        "CartPole-v1": 100_000,
        "Acrobot-v1": 100_000,
        "MountainCar-v0": 150_000,
    },
    "sac": {
        "Pendulum-v1": 20_000,
        "MountainCarContinuous-v0": 50_000,
        "Hopper-v5": 200_000,
        "HalfCheetah-v5": 200_000,
    },
}
"""Env steps per run, by algorithm and task: the issue's list."""

QUICK = (
    ("ppo", "CartPole-v1"),
    ("ppo", "Pendulum-v1"),
    ("dqn", "CartPole-v1"),
    ("sac", "Pendulum-v1"),
)
"""``--quick``'s subset (run with one seed): one short task per algorithm, and PPO's Box case."""

CONTENDERS = ("rlserve", "sb3", "zoo")
"""rlserve with its defaults; SB3 with its defaults; SB3 with rl-zoo3's tuned settings."""

WINDOW = 100
"""Episodes in the final mean and in the threshold's moving mean."""


@dataclass(frozen=True)
class RunKey:
    """One run of the suite: its identity in the results file."""

    algo: str
    task: str
    contender: str
    seed: int
    budget: int
    """Env steps to train (the issue's budget times the scale)."""

    @property
    def name(self) -> str:
        """``algo:task contender seed N`` for progress lines."""
        return f"{self.algo}:{self.task} {self.contender} seed {self.seed}"

    def as_dict(self) -> dict[str, object]:
        """The fields, for the child process's command line and the results file."""
        return asdict(self)


def parse_pairs(specs: list[str]) -> list[tuple[str, str]]:
    """``ppo:CartPole-v1`` specs as (algorithm, task) pairs of the suite.

    Raises:
        SystemExit: A spec is not ``algo:task``, or names a pair the suite does not have.
    """
    pairs = []
    for spec in specs:
        algo, _, task = spec.partition(":")
        if task not in BUDGETS.get(algo.lower(), {}):
            choices = " ".join(f"{a}:{t}" for a, tasks in BUDGETS.items() for t in tasks)
            raise SystemExit(f"--only {spec}: not a pair of the suite; choose from {choices}")
        pairs.append((algo.lower(), task))
    return pairs


def all_pairs() -> list[tuple[str, str]]:
    """Every (algorithm, task) of the suite, in the issue's order."""
    return [(algo, task) for algo, tasks in BUDGETS.items() for task in tasks]


def plan(
    pairs: list[tuple[str, str]],
    contenders: list[str],
    seeds: int,
    scale: float,
    first_seed: int = 0,
) -> list[RunKey]:
    """The runs, seed-major: every pair and contender gets one seed before any gets the next.

    So an interrupted suite already holds one seed of everything. The seeds are
    ``first_seed .. first_seed + seeds - 1``.
    """
    return [
        RunKey(algo, task, contender, seed, max(1, round(BUDGETS[algo][task] * scale)))
        for seed in range(first_seed, first_seed + seeds)
        for algo, task in pairs
        for contender in contenders
    ]


def threshold(task: str) -> float | None:
    """The task's ``reward_threshold`` in its gymnasium spec (None where it defines none)."""
    import gymnasium as gym

    value = gym.spec(task).reward_threshold
    return None if value is None else float(value)
