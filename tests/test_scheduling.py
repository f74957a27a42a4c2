"""How ``make test`` spreads the modules over xdist's workers (``tests/xdist_units.py``)."""

from __future__ import annotations

from pathlib import Path

from xdist_units import RAY_GROUPS, RUN_FIRST, run_order, scheduling_unit

ROOT = Path(__file__).parents[1]


def test_every_module_named_to_run_first_exists() -> None:
    missing = [name for name in RUN_FIRST if not (ROOT / name).is_file()]
    assert not missing, f"renamed or removed: update RUN_FIRST in tests/conftest.py: {missing}"


def test_the_ray_modules_go_to_two_units_and_every_other_module_is_its_own() -> None:
    cluster = ROOT / "tests" / "cluster"
    assert scheduling_unit(cluster / "test_ray_learner.py") == "ray-learner"
    assert scheduling_unit(cluster / "test_ray_envs.py") == "ray-other"
    # In tests/cluster but without the Ray test cluster: scheduled like any module.
    without_ray = cluster / "test_without_ray.py"
    assert scheduling_unit(without_ray) == without_ray.as_posix()
    http = ROOT / "tests" / "e2e" / "test_http.py"
    assert scheduling_unit(http) == http.as_posix()
    units = {scheduling_unit(path) for path in cluster.glob("test_*.py")}
    assert set(RAY_GROUPS) <= units


def test_the_ray_units_go_first_then_the_longest_modules_then_the_rest() -> None:
    order = [
        run_order(ROOT / "tests" / "cluster" / "test_ray_envs.py", ROOT),
        run_order(ROOT / "tests" / "cluster" / "test_ray_learner.py", ROOT),
        run_order(ROOT / RUN_FIRST[0], ROOT),
        run_order(ROOT / RUN_FIRST[-1], ROOT),
        run_order(ROOT / "tests" / "e2e" / "test_http.py", ROOT),
    ]
    assert order == sorted(order)
    assert len(set(order)) == len(order)
