from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from toy_envs import FaultyEnv, Float64Env, OldGymApi

from rlserve.env import InProcessVectorSource, ProcessVectorSource
from rlserve.errors import ConfigError


def _alive(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def _wait_gone(pids: list[int], timeout: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


@pytest.mark.timeout(60)
def test_same_trajectories_as_in_process() -> None:
    config = {"max_episode_steps": 12}
    local = InProcessVectorSource("CartPole-v1", config, num_envs=3, seed=21)
    remote = ProcessVectorSource("CartPole-v1", config, num_envs=3, envs_per_process=2, seed=21)
    try:
        np.testing.assert_array_equal(local.reset_all()[0], remote.reset_all()[0])
        rng = np.random.default_rng(1)
        for _ in range(60):
            actions = rng.integers(0, 2, 3)
            a, b = local.step_all(actions), remote.step_all(actions)
            np.testing.assert_array_equal(a.obs, b.obs)
            np.testing.assert_array_equal(a.rewards, b.rewards)
            np.testing.assert_array_equal(a.terminated, b.terminated)
            np.testing.assert_array_equal(a.truncated, b.truncated)
            assert a.final_obs.keys() == b.final_obs.keys()
            for i in a.final_obs:
                np.testing.assert_array_equal(a.final_obs[i], b.final_obs[i])
            assert a.infos == b.infos and not b.failed
    finally:
        local.close()
        remote.close()


@pytest.mark.timeout(30)
def test_float64_env_and_infos_in_sub_processes() -> None:
    source = ProcessVectorSource(Float64Env, {"length": 2}, num_envs=2, seed=0)
    try:
        source.reset_all()
        source.step_all([0, 0])
        batch = source.step_all([1, 1])
        assert batch.obs.dtype == np.float32 and batch.final_obs[1].dtype == np.float32
        assert batch.terminated.all() and not batch.truncated.any()
        assert batch.infos == {0: {"t": 2}, 1: {"t": 2}}
    finally:
        source.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["raise", "exit", "kill", "hang"])
def test_failed_sub_process_is_restarted(mode: str, caplog: pytest.LogCaptureFixture) -> None:
    at, bad, num = 3, 1, 3
    config = {"mode": mode, "at": at, "copy": bad}
    source = ProcessVectorSource(FaultyEnv, config, num_envs=num, seed=5, step_timeout=1.0)
    reference = InProcessVectorSource("CartPole-v1", num_envs=num, seed=5)
    try:
        source.reset_all()
        reference.reset_all()
        rng = np.random.default_rng(2)
        with caplog.at_level(logging.WARNING, logger="rlserve.env"):
            for step in range(1, at + 3):
                actions = rng.integers(0, 2, num)
                batch, expected = source.step_all(actions), reference.step_all(actions)
                for i in range(num):
                    if i == bad:
                        continue  # the other copies are unaffected
                    np.testing.assert_array_equal(batch.obs[i], expected.obs[i])
                if step == at:
                    assert list(batch.failed) == [bad]
                    assert batch.rewards[bad] == 0.0 and not batch.terminated[bad]
                    assert batch.obs[bad].shape == (4,)
                else:
                    assert not batch.failed
        reason = {
            "raise": "ValueError: boom at step",
            "exit": "exited with code 3",
            "kill": "SIGKILL",
            "hang": "did not answer within 1 s",
        }[mode]
        assert source.restarts == 1 and source.episodes_failed == 1
        assert any(reason in r.getMessage() for r in caplog.records)
    finally:
        source.close()
        reference.close()


@pytest.mark.timeout(60)
def test_reset_failing_again_and_again_raises(tmp_path: Path) -> None:
    config = {"mode": "reset_raise", "at": 2, "copy": 0, "marker": str(tmp_path / "m")}
    source = ProcessVectorSource(FaultyEnv, config, num_envs=2, seed=0, max_restarts=3)
    try:
        source.reset_all()
        source.step_all([0, 0])
        with pytest.raises(
            RuntimeError, match=r"(?s)FaultyEnv.*4 times in a row.*reset always fails"
        ):
            source.step_all([0, 0])
        assert source.restarts == 3
    finally:
        source.close()


@pytest.mark.timeout(30)
def test_not_a_gym_env_in_sub_process() -> None:
    with pytest.raises(ConfigError, match=r"made a object, not a gymnasium\.Env"):
        ProcessVectorSource(lambda: object(), num_envs=1)


@pytest.mark.timeout(30)
def test_close_leaves_no_children_and_children_ignore_sigint() -> None:
    before = {p.pid for p in mp.active_children()}
    source = ProcessVectorSource("CartPole-v1", num_envs=4, envs_per_process=2, seed=0)
    pids: list[Any] = [p.pid for p in mp.active_children() if p.pid not in before]
    assert len(pids) == 2
    source.reset_all()
    for pid in pids:
        os.kill(pid, signal.SIGINT)
    assert not source.step_all([0, 1, 0, 1]).failed
    source.close()
    assert _wait_gone(pids, timeout=0.1) == []  # reaped by close: not even zombies
    source.close()  # twice is fine


@pytest.mark.timeout(60)
def test_children_exit_when_the_parent_dies(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import multiprocessing as mp, sys, time
        from rlserve.env import ProcessVectorSource
        source = ProcessVectorSource("CartPole-v1", num_envs=2, seed=0)
        source.reset_all()
        print(*[p.pid for p in mp.active_children()], flush=True)
        time.sleep(3600)
        """
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    parent = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert parent.stdout is not None
        pids = [int(p) for p in parent.stdout.readline().split()]
        assert len(pids) == 2 and all(_alive(p) for p in pids)
    finally:
        parent.kill()
        parent.wait()
    assert _wait_gone(pids) == []


@pytest.mark.timeout(30)
def test_every_copy_of_a_failed_process_is_reported() -> None:
    config = {"mode": "exit", "at": 2, "copy": 1}  # worker_index 2: the second process
    source = ProcessVectorSource(FaultyEnv, config, num_envs=5, envs_per_process=2, seed=0)
    try:
        source.reset_all()
        assert not source.step_all([0] * 5).failed
        batch = source.step_all([0] * 5)
        assert sorted(batch.failed) == [2, 3]
        assert source.episodes_failed == 2 and source.restarts == 1
        assert not source.step_all([1] * 5).failed
    finally:
        source.close()


@pytest.mark.timeout(60)
def test_an_old_gym_step_in_a_sub_process_stops_with_the_fix_not_a_restart_loop() -> None:
    source = ProcessVectorSource(OldGymApi, {"step": 4}, num_envs=2, seed=0)
    try:
        source.reset_all()
        with pytest.raises(ConfigError, match=r"in its sub-process: OldGymApi.step\(\) must"):
            source.step_all([0, 0])
    finally:
        source.close()
