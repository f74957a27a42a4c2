"""``num_envs`` copies of a single-agent env in this process, stepped one after the other.

Why not Gymnasium's ``SyncVectorEnv``: it merges the copies' ``info`` dicts into one dict of
arrays (``infos["x"]``, ``infos["_x"]``), which loses what :class:`StepBatch` must keep. The
arrays take the type of the first copy's value, so a later copy's ``1.5`` written into an int
array becomes ``1``, and a key that is a dict in one copy and a number in another fails; the
per-copy dicts would have to be rebuilt from the arrays on every step. The stepping loop itself
is a dozen lines, so it is written here, with Gymnasium's same-step autoreset semantics: a copy
whose episode ends is reset in the same step, its final observation kept apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np

from rlserve.env.base import StepBatch, VectorEnvSource
from rlserve.env.make import EnvContext, EnvSpec, env_creator, env_label
from rlserve.env.stacking import ObsStacker
from rlserve.errors import ConfigError, EnvError

__all__ = ["InProcessVectorSource", "step_copies"]

CopiesStep = tuple[
    list[Any],
    list[SupportsFloat],
    list[bool],
    list[bool],
    dict[int, Any],
    dict[int, dict[str, Any]],
    dict[int, dict[str, Any]],
]
"""What :func:`step_copies` returns (the columns of a :class:`StepBatch`, obs not stacked)."""


def step_copies(envs: list[gym.Env[Any, Any]], actions: Any, stacker: ObsStacker) -> CopiesStep:
    """Step ``envs[i]`` with ``actions[i]``, resetting each copy whose episode ends.

    Shared by the in-process source and the sub-process workers, so both give the same results.

    Args:
        envs: The copies.
        actions: One action per copy.
        stacker: Casts final observations to the observation space's dtype.

    Returns:
        The next observations (not stacked), rewards, terminated and truncated flags (an episode
        both terminated and truncated counts as terminated), then the final observations, the
        non-empty step infos and the non-empty reset infos, each keyed by copy index.
    """
    # The hot path: plain lists, converted to arrays once per column by the caller.
    n = len(envs)
    obs_list: list[Any] = [None] * n
    rewards: list[SupportsFloat] = [0.0] * n
    terminated = [False] * n
    truncated = [False] * n
    final_obs: dict[int, Any] = {}
    infos: dict[int, dict[str, Any]] = {}
    reset_infos: dict[int, dict[str, Any]] = {}
    for i, env in enumerate(envs):
        result = env.step(actions[i])
        if not isinstance(result, tuple) or len(result) != 5:
            raise EnvError(step_error(env, result))
        obs, reward, term, trunc, info = result
        if info:
            infos[i] = info
        if term or trunc:
            final_obs[i] = stacker.cast(obs)
            obs, reset_info = reset_checked(env)
            if reset_info:
                reset_infos[i] = reset_info
            terminated[i] = bool(term)
            truncated[i] = bool(trunc) and not term
        obs_list[i] = obs
        rewards[i] = reward
    return obs_list, rewards, terminated, truncated, final_obs, infos, reset_infos


def reset_checked(env: Any, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
    """``env.reset(**kwargs)``, refused with the fix unless it is Gymnasium's ``(obs, info)``.

    Raises:
        EnvError: The env returned something else (an old gym env returns the observation
            alone, which would otherwise be unpacked as an observation and an info).
    """
    result = env.reset(**kwargs)
    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], dict):
        return result
    raise EnvError(
        f"{type(env).__name__}.reset() must return (obs, info) as a Gymnasium env does, got "
        f"{_described(result)}; an env of the pre-Gymnasium gym API returns the observation "
        "alone: update it, or wrap it with shimmy's GymV26CompatibilityV0 ('rlserve check-env' "
        "checks an env)"
    )


def step_error(env: Any, result: Any) -> str:
    """Why a ``step()`` result is not Gymnasium's 5-tuple, with the fix."""
    return (
        f"{type(env).__name__}.step() must return (obs, reward, terminated, truncated, info) as "
        f"a Gymnasium env does, got {_described(result)}; a 4-tuple with 'done' is the "
        "pre-Gymnasium gym API: split done into terminated and truncated, or wrap the env with "
        "shimmy's GymV26CompatibilityV0 ('rlserve check-env' checks an env)"
    )


def _described(value: Any) -> str:
    if isinstance(value, tuple):
        return f"a tuple of {len(value)}"
    shape = getattr(value, "shape", None)
    return type(value).__name__ + ("" if shape is None else f" of shape {tuple(shape)}")


class InProcessVectorSource(VectorEnvSource):
    """``num_envs`` copies of one single-agent env, made and stepped in this process.

    A copy whose episode ends (``terminated`` or ``truncated``) is reset in the same step: its
    final observation goes to :attr:`StepBatch.final_obs` and its ``obs`` row starts the next
    episode. An episode that is both terminated and truncated counts as terminated only.
    Observations are cast to the observation space's dtype (a ``float64`` observation of a
    ``float32`` ``Box`` is accepted).

    Args:
        env: What names the env (see :func:`rlserve.env.make_env`); an instance only with
            ``num_envs=1``.
        env_config: The settings handed to each copy's creator, as an :class:`EnvContext`
            with ``vector_index`` the copy's index.
        num_envs: How many copies.
        seed: The seed of the first :meth:`reset_all` when it is given none (copy ``i`` gets
            ``seed + i``).
        render_mode: The Gymnasium render mode to ask each copy for.
        worker_index: The ``worker_index`` the copies' :class:`EnvContext` carries.
        first_env: An already made copy 0 (``to_source`` makes one to see what kind of env it
            is); the other copies are made as usual.

    Raises:
        ConfigError: ``env`` cannot be made, an instance was given with several copies, or the
            copies' spaces differ.
    """

    def __init__(
        self,
        env: EnvSpec,
        env_config: Mapping[str, Any] | None = None,
        *,
        num_envs: int = 1,
        seed: int | None = None,
        render_mode: str | None = None,
        worker_index: int = 0,
        first_env: gym.Env[Any, Any] | None = None,
    ) -> None:
        if num_envs < 1:
            raise ConfigError(f"num_envs must be at least 1, got {num_envs}")
        if isinstance(env, gym.Env):
            if num_envs != 1:
                raise ConfigError(
                    f"an env instance is one copy, but num_envs={num_envs}: pass the env's "
                    "registered id, its class, or a function that makes it"
                )
            envs = [env]
        else:
            context = EnvContext(env_config, worker_index=worker_index)
            envs = [] if first_env is None else [first_env]
            try:
                for i in range(len(envs), num_envs):
                    copy = context.copy_with(vector_index=i)
                    envs.append(env_creator(env, copy, render_mode=render_mode)())
            except BaseException:
                for made in envs:
                    made.close()
                raise
        self.envs: list[gym.Env[Any, Any]] = envs
        """The copies, in index order."""
        self.env_name = env_label(env)
        self.num_envs = num_envs
        self.observation_space = envs[0].observation_space
        self.action_space = envs[0].action_space
        for i, made in enumerate(envs[1:], start=1):
            if (
                made.observation_space != self.observation_space
                or made.action_space != self.action_space
            ):
                self.close()
                raise ConfigError(
                    f"copy {i} of the env has spaces {made.observation_space} / "
                    f"{made.action_space}, copy 0 has {self.observation_space} / "
                    f"{self.action_space}: every copy must have the same spaces"
                )
        self._stacker = ObsStacker(self.observation_space)
        self._seed = seed
        super().__init__()

    def reset_all(self, seed: int | None = None) -> tuple[np.ndarray, list[dict[str, Any]]]:
        """Reset every copy; copy ``i`` is seeded with ``seed + i`` (and so is its action space).

        Args:
            seed: The base seed; ``None`` uses the constructor's ``seed`` the first time, and
                no seed after that.

        Returns:
            The stacked first observations and each copy's reset info.
        """
        if seed is None:
            seed, self._seed = self._seed, None
        obs_list: list[Any] = []
        infos: list[dict[str, Any]] = []
        for i, env in enumerate(self.envs):
            obs, info = reset_checked(env, seed=None if seed is None else seed + i)
            if seed is not None:
                env.action_space.seed(seed + i)
            obs_list.append(obs)
            infos.append(info)
        if seed is not None:
            self.action_space.seed(seed)
        return self._stacker.stack(obs_list), infos

    def step_all(self, actions: Any) -> StepBatch:
        """Step copy ``i`` with ``actions[i]``; copies whose episode ends reset at once.

        Args:
            actions: One action per copy, indexable by copy (a list or a stacked array).

        Returns:
            The stacked results (see :class:`StepBatch`).
        """
        obs, rewards, terminated, truncated, final_obs, infos, reset_infos = step_copies(
            self.envs, actions, self._stacker
        )
        if final_obs:
            ended = np.array(terminated, dtype=np.bool_)
            cut = np.array(truncated, dtype=np.bool_)
        else:  # no episode ended: all flags False (np.zeros costs a third of np.array)
            ended = np.zeros(self.num_envs, np.bool_)
            cut = np.zeros(self.num_envs, np.bool_)
        return StepBatch(
            obs=self._stacker.stack(obs),
            rewards=np.array(rewards, dtype=np.float64),
            terminated=ended,
            truncated=cut,
            final_obs=final_obs,
            infos=infos,
            reset_infos=reset_infos,
        )

    def close(self) -> None:
        """Close every copy."""
        for env in self.envs:
            env.close()
