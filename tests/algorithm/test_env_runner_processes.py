"""The Algorithm with env-runner processes (``num_env_runners`` >= 1): learning, seeding,
restarts after a crash, a kill or a hang, checkpoints, other kinds of env, and clean exits."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from algorithm_toys import GuessSign, Mimic, strip_times

from rlserve import PPOConfig
from rlserve.algorithm.algorithm import Algorithm
from rlserve.env.vector import InProcessVectorSource
from rlserve.errors import ConfigError

ROOT = Path(__file__).parents[2]

SMALL = {
    "train_batch_size": 256,
    "minibatch_size": 64,
    "num_epochs": 2,
    "min_env_steps_per_iteration": 256,
    "model": {"fcnet_hiddens": [32]},
}
QUICK_PPO = {"lr": 1e-3, "gamma": 0.98, "gae_lambda": 0.8}
"""The earlier hosted defaults' fast settings, pinned by the tests that must learn a toy task in a
few thousand steps (PPO's defaults are chosen for longer, harder tasks)."""


def _config(env: Any = "CartPole-v1", runners: int = 2, num_envs: int = 2, **training: Any) -> Any:
    return (
        PPOConfig()
        .environment(env)
        .env_runners(num_env_runners=runners, num_envs_per_env_runner=num_envs)
        .training(**{**SMALL, **training})
        .resources(device="cpu")
        .debugging(seed=5)
    )


def _descendants(pid: int) -> set[int]:
    """Live (not zombie) processes below ``pid``, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if state != "Z":
            children.setdefault(int(ppid), []).append(int(entry.name))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


# -- learning and seeding ----------------------------------------------------------------------


class SimpleCorridor(gym.Env[Any, Any]):
    """examples/simple_corridor.py's env; it also notes which runner and copy made it."""

    def __init__(self, config: Any) -> None:
        self.end_pos = config["corridor_length"]
        self.cur_pos = 0.0
        self.action_space = gym.spaces.Discrete(2)
        self.observation_space = gym.spaces.Box(0.0, self.end_pos, shape=(1,))
        if "notes" in config:
            note = f"{config.worker_index}-{config.vector_index}-{os.getpid()}"
            (Path(config["notes"]) / note).touch()

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        self.cur_pos = 0.0
        return np.array([self.cur_pos]), {}

    def step(self, action: Any) -> Any:
        if action == 0 and self.cur_pos > 0.0:
            self.cur_pos -= 1.0
        elif action == 1:
            self.cur_pos += 1.0
        if self.cur_pos >= self.end_pos:
            return np.array([0.0]), 1.0, True, True, {}
        return np.array([self.cur_pos]), -0.1, False, False, {}


@pytest.mark.timeout(90)
def test_two_runners_solve_the_simple_corridor_and_are_numbered(tmp_path: Path) -> None:
    config = (
        PPOConfig()
        .environment(SimpleCorridor, env_config={"corridor_length": 5, "notes": str(tmp_path)})
        .env_runners(num_env_runners=2, num_envs_per_env_runner=2)
        .training(
            min_env_steps_per_iteration=1000, train_batch_size=512, minibatch_size=128, **QUICK_PPO
        )
        .resources(device="cpu")
        .debugging(seed=1)
    )
    with config.build() as algo:
        results = [algo.train() for _ in range(5)]
        pids = algo.runners.pids if algo.runners else []
        greedy = algo.evaluate(3)["evaluation"]["env_runners"]
        assert algo.compute_single_action(np.array([0.0], np.float32)) == 1  # right
    best = max(r["env_runners"]["episode_return_mean"] for r in results)
    assert best >= 0.55  # the optimum is 0.6: five steps right
    assert greedy["episode_return_mean"] >= 0.55
    last = results[-1]["env_runners"]
    assert last["num_healthy_env_runners"] == 2
    assert last["num_env_runner_restarts"] == 0 and last["episodes_failed"] == 0
    assert last["num_env_steps_sampled"] >= 1000
    # Each runner made its two copies (worker_index 1 and 2, vector_index 0 and 1) in its own
    # process; the Algorithm's process keeps one copy (worker_index 0) for its spaces.
    notes = [name.split("-") for name in os.listdir(tmp_path)]
    made = {(int(w), int(v), int(p)) for w, v, p in notes}
    assert {(w, v) for w, v, p in made if p != os.getpid()} == {(1, 0), (1, 1), (2, 0), (2, 1)}
    assert {(w, v) for w, v, p in made if p == os.getpid()} == {(0, 0)}
    assert {p for w, v, p in made if w == 1} == {pids[0]}
    assert {p for w, v, p in made if w == 2} == {pids[1]}


# -- failures ----------------------------------------------------------------------------------


class FailsOnce(gym.Wrapper[Any, Any, Any, Any]):
    """CartPole whose copies in runner 1 fail once (the first one to reach step 30 wins)."""

    def __init__(self, config: Any) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self.marker = Path(config["marker"])
        self.mode = config["mode"]
        self.mine = config.worker_index == 1
        self.steps = 0

    def step(self, action: Any) -> Any:
        self.steps += 1
        if self.mine and self.steps == 30 and not self.marker.exists():
            self.marker.touch()
            if self.mode == "hang":
                time.sleep(3600)
            elif self.mode == "exit":
                os._exit(3)
            raise ValueError("boom")
        return self.env.step(action)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("mode", ["raise", "exit", "hang"])
def test_a_failing_runner_is_restarted_and_training_goes_on(tmp_path: Path, mode: str) -> None:
    marker = tmp_path / "failed"
    config = (
        _config(FailsOnce)
        .environment(env_config={"marker": str(marker), "mode": mode})
        .env_runners(sample_timeout_s=2.0)
    )
    with config.build() as algo:
        assert algo.runners is not None
        before = algo.runners.pids
        results = [algo.train() for _ in range(3)]
        after = algo.runners.pids
    assert marker.exists()
    last = results[-1]["env_runners"]
    assert last["num_env_runner_restarts"] == 1
    assert last["episodes_failed"] == 2  # the failed runner's two copies' episodes
    assert last["num_healthy_env_runners"] == 2
    assert before[0] != after[0] and before[1] == after[1]
    assert results[-1]["learners"]["default"]["updates"] >= 2


class SlowCartPole(gym.Wrapper[Any, Any, Any, Any]):
    """CartPole that sleeps 1 ms per step, so a round lasts long enough to be interrupted."""

    def __init__(self, config: Any) -> None:
        super().__init__(gym.make("CartPole-v1"))

    def step(self, action: Any) -> Any:
        time.sleep(0.001)
        return self.env.step(action)


@pytest.mark.timeout(60)
def test_a_runner_killed_with_sigkill_mid_training_is_restarted() -> None:
    with _config(SlowCartPole).build() as algo:
        assert algo.runners is not None
        first = algo.train()
        victim = algo.runners.pids[1]
        assert victim is not None
        # Killed while the next train() samples (or, on a slow machine, between its rounds).
        killer = threading.Timer(0.03, os.kill, (victim, signal.SIGKILL))
        killer.start()
        results = [algo.train() for _ in range(2)]
        killer.join()
        assert algo.runners.pids[1] != victim
    assert first["env_runners"]["episodes_failed"] == 0
    last = results[-1]["env_runners"]
    assert last["episodes_failed"] == 2 and last["num_env_runner_restarts"] == 1
    assert last["num_healthy_env_runners"] == 2
    assert results[-1]["training_iteration"] == 3


@pytest.mark.timeout(60)
def test_the_answer_to_an_abandoned_round_is_not_taken_for_the_next() -> None:
    with _config().build() as algo:
        group = algo.runners
        assert group is not None
        algo.train()
        # A round whose caller went away (an exception, Ctrl-C) before reading the answers.
        group._round += 1
        stale = {"type": "sample", "round": group._round, "steps": 10, "weights": {}}
        assert not group._supervisor.send_all(stale, range(len(group.pids)))
        results = [algo.train() for _ in range(2)]
    for result in results:
        # Each runner's share is 128 steps of 2 copies: exactly 256, never the stale 10s.
        assert result["env_runners"]["num_env_steps_sampled"] == 256
        assert result["env_runners"]["num_env_runner_restarts"] == 0


class AlwaysFails(gym.Wrapper[Any, Any, Any, Any]):
    """CartPole that raises at its third step in runner 1, every time."""

    def __init__(self, config: Any) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self.mine = config.worker_index == 1
        self.steps = 0

    def step(self, action: Any) -> Any:
        self.steps += 1
        if self.mine and self.steps == 3:
            raise ValueError("broken for good")
        return self.env.step(action)


@pytest.mark.timeout(60)
def test_a_runner_that_keeps_failing_stops_training_naming_the_env() -> None:
    with (
        _config(AlwaysFails).build() as algo,
        pytest.raises(RuntimeError, match=r"AlwaysFails.*runner 1 failed 4 times.*broken for good"),
    ):
        for _ in range(10):  # runner 2 goes on, so an iteration may end before the 4th failure
            algo.train()


# -- checkpoints -------------------------------------------------------------------------------


def _weights(algo: Algorithm) -> dict[str, bytes]:
    return {k: v.tobytes() for k, v in algo.learners["default"].weights().arrays.items()}


@pytest.mark.timeout(120)
def test_two_restores_with_runners_continue_identically(tmp_path: Path) -> None:
    config = _config()
    with config.build() as algo:
        algo.train()
        algo.train()
        path = algo.save(tmp_path / "ckpt")
        saved = _weights(algo)
    restored_a = Algorithm.from_checkpoint(path)
    restored_b = config.build()
    restored_b.restore(path)
    runs = []
    try:
        for restored in (restored_a, restored_b):
            assert restored.config.num_env_runners == 2 and restored.iteration == 2
            assert _weights(restored) == saved
            results = [strip_times(restored.train()) for _ in range(2)]
            runs.append((results, _weights(restored)))
    finally:
        restored_a.stop()
        restored_b.stop()
    (results_a, weights_a), (results_b, weights_b) = runs
    assert [r["training_iteration"] for r in results_a] == [3, 4]
    assert results_a == results_b
    assert weights_a == weights_b and weights_a != saved


# -- other kinds of environment ----------------------------------------------------------------


@pytest.mark.timeout(60)
def test_multi_agent_env_in_runners_trains_a_learner_per_policy() -> None:
    config = (
        _config(Mimic)
        .multi_agent(
            policies={"p1": {}, "p2": {}},
            policy_mapping_fn=lambda agent_id, episode, **kw: "p1" if agent_id == "a" else "p2",
        )
        .training(min_env_steps_per_iteration=1024, **QUICK_PPO)
    )
    with config.build() as algo:
        results = [algo.train() for _ in range(3)]
    last = results[-1]
    for pid in ("p1", "p2"):
        assert last["learners"][pid]["updates"] >= 1
    assert last["env_runners"]["num_episodes"] > 0
    assert last["env_runners"]["episode_return_mean"] > 8.5  # random play: ~8


class MimicRaises(Mimic):
    """Mimic whose copy in sub-process 2 raises at the 5th step of every episode."""

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.bad = config.worker_index == 2

    def step(self, action_dict: dict[str, Any]) -> Any:
        if self.bad and self.t == 4:
            raise ValueError("boom")
        return super().step(action_dict)


def _two_policies(config: Any) -> Any:
    return config.env_runners(remote_worker_envs=True, sample_timeout_s=20.0).multi_agent(
        policies={"p1": {}, "p2": {}},
        policy_mapping_fn=lambda agent_id, episode, **kw: "p1" if agent_id == "a" else "p2",
    )


@pytest.mark.timeout(90)
def test_multi_agent_sub_process_copies_in_runners_learn_both_policies() -> None:
    config = _two_policies(_config(Mimic)).training(min_env_steps_per_iteration=1024, **QUICK_PPO)
    with config.build() as algo:
        results = [algo.train() for _ in range(3)]
    last = results[-1]
    for pid in ("p1", "p2"):
        assert last["learners"][pid]["updates"] >= 1
    assert last["env_runners"]["episodes_failed"] == 0
    assert last["env_runners"]["episode_return_mean"] > 8.5  # random play: ~8


@pytest.mark.timeout(60)
def test_multi_agent_sub_process_copies_that_crash_are_restarted_and_counted() -> None:
    config = _two_policies(_config(MimicRaises)).training(min_env_steps_per_iteration=512)
    with config.build() as algo:
        result = algo.train()
    # Each runner's second copy fails every episode at its 5th step (64 steps each: a dozen
    # times): restarted, counted, and the first copies' episodes go on to their end.
    assert result["env_runners"]["episodes_failed"] >= 8
    assert result["env_runners"]["episode_len_mean"] > 0
    assert result["env_runners"]["num_env_steps_sampled"] >= 512
    assert result["env_runners"]["num_healthy_env_runners"] == 2


@pytest.mark.timeout(60)
def test_external_env_runs_its_loop_inside_each_runner() -> None:
    config = _config(GuessSign(), num_envs=1).training(lr=3e-3)
    with config.build() as algo:
        results = [algo.train() for _ in range(10)]
    last = results[-1]["env_runners"]
    assert last["episode_len_mean"] == 1 and last["num_healthy_env_runners"] == 2
    assert last["episode_return_mean"] >= 0.9


@pytest.mark.timeout(30)
def test_what_runners_cannot_host_is_refused_with_the_fix() -> None:
    with pytest.raises(ConfigError, match="num_env_runners=0"):
        _config(InProcessVectorSource("CartPole-v1")).build()
    with pytest.raises(ConfigError, match=">= 0"):
        PPOConfig().env_runners(num_env_runners=-1)


# -- clean exits -------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_stop_leaves_no_process_behind_even_with_sub_process_envs() -> None:
    config = _config().env_runners(remote_worker_envs=True)
    before = _descendants(os.getpid())
    algo = config.build()
    algo.train()
    below = _descendants(os.getpid()) - before
    # Two runners, each with two env sub-processes.
    assert len(below) == 6
    algo.stop()
    assert not any(_alive(pid) for pid in below)
    assert _descendants(os.getpid()) - before == set()


SCRIPT = """
import sys, time
from rlserve import PPOConfig
algo = (
    PPOConfig().environment("CartPole-v1").env_runners(num_env_runners=2)
    .training(train_batch_size=64, minibatch_size=32, num_epochs=1,
              min_env_steps_per_iteration=64)
    .resources(device="cpu").build()
)
algo.train()
print(" ".join(str(pid) for pid in algo.runners.pids), flush=True)
time.sleep(600)
"""


@pytest.mark.timeout(90)
def test_runners_exit_when_the_algorithm_process_dies() -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 2 and all(_alive(p) for p in pids)
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 30
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids)


def _socket_inodes(pid: int) -> set[str]:
    """The socket inodes process ``pid`` holds open (``socket:[N]`` links in /proc)."""
    found = set()
    folder = Path(f"/proc/{pid}/fd")
    for entry in folder.iterdir():
        try:
            target = os.readlink(entry)
        except OSError:
            continue
        if target.startswith("socket:"):
            found.add(target)
    return found


@pytest.mark.timeout(120)
def test_a_runner_restarted_while_serving_holds_none_of_the_servers_sockets() -> None:
    config = _config().serving(host="127.0.0.1", port=0)
    with config.build() as algo:
        assert algo.runners is not None and algo.address is not None
        algo.train()
        victim = algo.runners.pids[0]
        assert victim is not None
        os.kill(victim, signal.SIGKILL)
        algo.train()  # the runner is restarted, forked from a process that serves
        restarted = algo.runners.pids[0]
        assert restarted is not None and restarted != victim
        shared = _socket_inodes(restarted) & _socket_inodes(os.getpid())
        assert not shared
