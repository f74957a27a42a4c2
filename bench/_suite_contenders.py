"""One run of the learning suite, in this process: rlserve, SB3 or SB3 with rl-zoo3's settings.

Every contender trains on ``gym.make(task)`` until ``budget`` env steps and hands each finished
training episode's return, with the env step at which it ended, to a :class:`Recorder`.

- ``rlserve``: ``<Algo>Config().environment(task).debugging(seed=seed).build()``, ``train()``
  until ``env_steps_sampled >= budget``: every other setting is the default. Episodes come from
  the ``on_episode_end`` callback; the env step of each is its env copy's summed episode
  lengths times the number of copies seen, kept within the iteration it ended in (exact with
  one env copy, the default; within one iteration otherwise).
- ``sb3``: ``<ALGO>("MlpPolicy", make_vec_env(task, n_envs=1))``, SB3's defaults.
- ``zoo``: SB3 with rl-zoo3's entry for the task (:mod:`_suite_zoo`); None when it has none.

SB3's episode returns come from its Monitor wrapper (raw rewards, VecNormalize or not), with
``num_timesteps`` at the step the episode ended.
"""

from __future__ import annotations

import time
from collections import defaultdict, deque
from typing import Any

import numpy as np

from _suite_tasks import WINDOW, RunKey


class Recorder:
    """The episodes of one run: the curve, the final mean, the step a threshold was reached."""

    def __init__(self, budget: int, threshold: float | None) -> None:
        self.budget = budget
        self.threshold = threshold
        self.curve: list[tuple[int, float]] = []
        self._window: deque[float] = deque(maxlen=WINDOW)
        self.reached: int | None = None

    def episode(self, step: int, episode_return: float) -> None:
        """An episode ended at env step ``step`` with ``episode_return``."""
        self.curve.append((int(step), float(episode_return)))
        self._window.append(float(episode_return))
        full = len(self._window) == WINDOW
        goal = self.threshold
        if goal is not None and self.reached is None and full and np.mean(self._window) >= goal:
            self.reached = int(step)

    def result(self, steps: int, seconds: float) -> dict[str, Any]:
        """The run's record: final mean (last 100 episodes ended by the budget) and curve."""
        within = [r for s, r in self.curve if s <= self.budget] or [r for _, r in self.curve]
        last = within[-WINDOW:]
        return {
            "final_mean": float(np.mean(last)) if last else None,
            "final_episodes": len(last),
            "threshold": self.threshold,
            "steps_to_threshold": self.reached,
            "steps": int(steps),
            "seconds": round(seconds, 2),
            "steps_per_s": round(steps / seconds, 1) if seconds > 0 else None,
            "episodes": len(self.curve),
            "curve": [[s, round(r, 2)] for s, r in self.curve],
        }


def run(key: RunKey, threshold: float | None) -> dict[str, Any]:
    """Train ``key``'s contender here and return its record (see :meth:`Recorder.result`)."""
    import torch

    torch.set_num_threads(1)
    recorder = Recorder(key.budget, threshold)
    if key.contender == "rlserve":
        return run_rlserve(key, recorder)
    if key.contender == "sb3":
        return run_sb3(key, recorder, None)
    from _suite_zoo import find_entry

    found = find_entry(key.algo, key.task)
    if found is None:
        return {"skipped": f"rl-zoo3 has no {key.algo} entry for {key.task}"}
    return run_sb3(key, recorder, found)


def run_rlserve(key: RunKey, recorder: Recorder) -> dict[str, Any]:
    """Train rlserve's Algorithm, hosted, with its defaults."""
    from rlserve import DQNConfig, PPOConfig, SACConfig

    classes = {"ppo": PPOConfig, "dqn": DQNConfig, "sac": SACConfig}
    pending: list[tuple[int, float]] = []
    lengths: dict[str, int] = defaultdict(int)

    def on_episode_end(*, episode: Any, **_: Any) -> None:
        if episode.training_enabled:
            lengths[episode.source] += episode.length
            pending.append((lengths[episode.source], episode.episode_return))

    started = time.monotonic()
    config = (
        classes[key.algo]()
        .environment(key.task)
        .debugging(seed=key.seed)
        .callbacks(on_episode_end=on_episode_end, fail_fast=True)
    )
    algo = config.build()
    try:
        before = 0
        while algo.env_steps_sampled < key.budget:
            algo.train()
            now = algo.env_steps_sampled
            copies = max(1, len(lengths))
            for summed, episode_return in pending:
                recorder.episode(min(now, max(before + 1, summed * copies)), episode_return)
            pending.clear()
            before = now
        steps = algo.env_steps_sampled
    finally:
        algo.stop()
    return recorder.result(steps, time.monotonic() - started)


def run_sb3(
    key: RunKey, recorder: Recorder, zoo: tuple[str, dict[str, Any]] | None
) -> dict[str, Any]:
    """SB3 with its defaults (``zoo`` None) or with rl-zoo3's entry ``(name, settings)``."""
    import gymnasium as gym
    from stable_baselines3 import DQN, PPO, SAC
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecFrameStack, VecNormalize

    classes: dict[str, Any] = {"ppo": PPO, "dqn": DQN, "sac": SAC}

    class Episodes(BaseCallback):
        def _on_step(self) -> bool:
            for info in self.locals.get("infos", []):
                if "episode" in info:
                    recorder.episode(self.num_timesteps, float(info["episode"]["r"]))
            return True

    started = time.monotonic()
    extra: dict[str, Any] = {}
    if zoo is None:
        env = make_vec_env(key.task, n_envs=1, seed=key.seed)
        policy, kwargs = "MlpPolicy", {}
    else:
        from _suite_zoo import prepare

        space = gym.spec(key.task).make().action_space
        action_dim = int(np.prod(space.shape)) if space.shape else 1
        entry = prepare(key.algo, zoo[0], zoo[1], action_dim)
        extra["zoo_entry"] = entry.name
        wrappers = entry.wrappers

        def wrap(env: gym.Env) -> gym.Env:
            for wrapper, wrapper_kwargs in wrappers:
                env = wrapper(env, **wrapper_kwargs)
            return env

        env = make_vec_env(
            key.task,
            n_envs=entry.n_envs,
            seed=key.seed,
            wrapper_class=wrap if wrappers else None,
            env_kwargs=entry.env_kwargs or None,
        )
        if entry.frame_stack:
            env = VecFrameStack(env, entry.frame_stack)
        if entry.normalize is not None:
            env = VecNormalize(env, **entry.normalize)
        policy, kwargs = entry.policy, entry.model_kwargs
    model = classes[key.algo](policy, env, seed=key.seed, device="cpu", verbose=0, **kwargs)
    model.learn(key.budget, callback=Episodes())
    env.close()
    return {**recorder.result(model.num_timesteps, time.monotonic() - started), **extra}
