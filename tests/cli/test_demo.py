"""``rlserve demo``: its tasks and algorithms, and a short run through the real server."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest

from rlserve.cli.demo import TASKS, DemoConfig, demo_result, demo_task
from rlserve.errors import ConfigError
from rlserve.learners.ppo_config import PPOSettings

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, as a package
    import tomli as tomllib


def test_each_demo_trains_its_own_algorithms() -> None:
    assert demo_task("cartpole", None)[1] == "ppo"
    assert demo_task("cartpole", "dqn")[1] == "dqn"
    assert demo_task("pendulum", None)[1] == "sac"
    with pytest.raises(ConfigError, match="pass --algo sac"):
        demo_task("pendulum", "dqn")
    with pytest.raises(ConfigError, match="choose one of: cartpole, pendulum"):
        demo_task("mountaincar", None)
    assert TASKS["pendulum"].window == 20


def test_the_cartpole_demo_keeps_its_ppo_schedule() -> None:
    """PPO's defaults are general; the demo's own schedule, tuned on CartPole, overrides them."""
    demo = TASKS["cartpole"].settings["ppo"]
    settings, defaults = PPOSettings(**demo), PPOSettings()
    assert {"train_batch_size", "lr", "gamma", "gae_lambda"} <= demo.keys()
    assert all(getattr(settings, name) != getattr(defaults, name) for name in demo)
    assert settings.normalize_observations is False  # CartPole's values share one scale
    assert TASKS["cartpole"].server["ppo"] == {"max_learner_lag_steps": 4096}


@pytest.mark.e2e
@pytest.mark.timeout(180)
def test_a_dqn_demo_runs_its_budget_through_the_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("rlserve.cli.demo.CURVE_EVERY", 500)
    config = DemoConfig(
        seed=0,
        clients=2,
        algo="dqn",
        max_env_steps=1500,
        run_dir=str(tmp_path),
        progress=False,
        stop_when_solved=False,
        target_return=10_000.0,
    )
    result = demo_result(config, "cartpole")
    assert result.failure is None
    assert result.solved_at_steps is None  # an unreachable target
    assert result.env_steps >= 1500
    assert result.algo == "dqn"
    assert result.checkpoint is not None and result.checkpoint.exists()
    run = result.checkpoint.parents[1]
    tables = tomllib.loads((run / "config.toml").read_text())
    assert tables["algorithm"] == {"name": "dqn"}
    assert "NOT solved (budget)" in result.summary()
    steps = [point[0] for point in result.curve]
    assert len(steps) >= 2 and steps == sorted(steps) and steps[0] >= 500
    assert all(later // 500 > earlier // 500 for earlier, later in itertools.pairwise(steps))
    assert all(0 < mean <= 500 for _, mean in result.curve)


@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_the_dqn_demo_learns_cartpole_through_remote_clients(tmp_path: Path) -> None:
    """The DQN demo through 4 remote clients reaches a last-100 mean of 150 within 40,000 steps.

    Issue 10's target, 475 by 60,000 steps, is bench/learning.py's to measure (20 of 20 seeds by
    55,100 steps, docs/benchmarks.md). The clients' timing makes every run differ, and on a
    loaded CI machine the last points of the target come late. So this test checks that the
    demo's settings learn, with a margin a loaded machine keeps, in a small part of the steps
    the whole target takes: a DQN that does not learn stays near 22, and seed 0's mean passed
    150 at about 16,000 steps (250 at 27,000, 475 at 51,000).
    """
    config = DemoConfig(
        seed=0,
        algo="dqn",
        target_return=150.0,
        max_env_steps=40_000,
        run_dir=str(tmp_path),
        progress=False,
        time_limit=800.0,  # the budget is in env steps; this only bounds a stuck run
    )
    result = demo_result(config, "cartpole")
    assert result.failure is None, result.summary()
    assert result.solved_at_steps is not None, (result.summary(), result.curve)
    assert result.solved_at_steps <= 40_000
