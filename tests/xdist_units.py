"""How ``make test`` spreads the test modules over xdist's workers: the scheduling units and the
order they are handed out in (used by ``tests/conftest.py``; kept apart from it because
``tests/cluster`` has a ``conftest`` module of its own, and ``from conftest import`` may find
either)."""

from __future__ import annotations

import functools
from pathlib import Path

RAY_GROUPS = ("ray-other", "ray-learner")
"""The two xdist scheduling units of the modules that use the Ray test cluster
(``tests/cluster/conftest.py``): the learner actor's modules (``*learner*``) and the others,
about equal in time."""

RUN_FIRST = (
    "tests/algorithm/test_doorkey_learning.py",
    "tests/algorithm/test_memory_learning.py",
    "tests/cli/test_demo.py",
    "tests/e2e/test_action_spaces.py",
    "tests/cli/test_train_cli.py",
    "tests/e2e/test_resilience.py",
    "tests/e2e/test_durability.py",
    "tests/e2e/test_dqn_server.py",
    "tests/cli/test_cli_runs.py",
    "tests/env/test_versus.py",
)
"""Modules of a minute or more on the 2-core VM, after the Ray groups the first to be handed
out: one of them left for the end would run alone while the other workers idle."""


@functools.cache
def scheduling_unit(module: Path) -> str:
    """The xdist scheduling unit of a test module: itself, or one of :data:`RAY_GROUPS`.

    Each worker that runs a Ray module starts a cluster of its own; in two groups at most two
    run at once, and each worker runs its group's modules one after another on one cluster. The
    controller sees node ids, not fixtures, so a Ray module is one whose source names the
    ``ray_cluster`` fixture.
    """
    if module.parent.name == "cluster" and "ray_cluster" in module.read_text(encoding="utf-8"):
        return RAY_GROUPS[1] if "learner" in module.name else RAY_GROUPS[0]
    return module.as_posix()


def run_order(module: Path, root: Path) -> int:
    """Where ``module``'s tests go in the order xdist hands the units out: the Ray units first,
    then :data:`RUN_FIRST` in its order, then the rest (equal: a stable sort keeps them as
    collected)."""
    group = scheduling_unit(module)
    if group in RAY_GROUPS:
        return RAY_GROUPS.index(group)
    name = module.relative_to(root).as_posix()
    return len(RAY_GROUPS) + (RUN_FIRST.index(name) if name in RUN_FIRST else len(RUN_FIRST))
