"""The environment conformance check: run a few episodes and report every departure.

:func:`check_env` takes what a user would hand the trainer (an env instance, a registered id, or
a class or creator taking an ``env_config`` dict, RLlib style) and checks, without stopping at
the first problem:

* the spaces exist and are gymnasium spaces (gymnasium's own space checks included);
* ``reset(seed=..., options=...)`` takes those keywords and returns ``(obs, info)``;
* ``step`` returns five values of the right types: a finite real reward, bool ``terminated`` and
  ``truncated``, a dict info;
* every observation lies in the observation space, shape, dtype and bounds told apart;
* the sampled actions are accepted, and an exception names the call, episode and step;
* two seeded rollouts with the same actions give the same observations and rewards;
* ``render()`` (when the env has a ``render_mode``) and ``close()``.

Multi-agent envs (RLlib's ``MultiAgentEnv`` conventions, duck-typed) are checked per agent; see
:mod:`rlserve.env.check_multi`. Findings of one kind are counted, not repeated. Problem kinds:
``create``, ``space_missing``, ``space_type``, ``space_invalid``, ``reset_signature``,
``reset_exception``, ``step_signature``, ``step_exception``, ``action_space_sample``,
``obs_type``, ``obs_shape``, ``obs_dtype``, ``obs_keys``, ``obs_outside_space``, ``reward_type``,
``reward_not_finite``, ``terminated_type``, ``truncated_type``, ``info_type``,
``nondeterministic``, ``render``, ``close``, and for multi-agent envs ``all_missing``,
``unknown_agent``, ``agent_after_done``, ``no_agent_acts``. Warning kinds: ``obs_dtype`` (a
lossless cast), ``obs_type`` (a list for an array), ``reward_type``, ``obs_reused``,
``terminated_and_truncated``, ``episode_not_ending``, ``reset_signature`` (a seed default),
``space``, ``render``, ``info_keys`` and ``env_warning`` (what the env warned itself).
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any, Protocol

import gymnasium as gym
import numpy as np
from gymnasium.utils.passive_env_checker import env_render_passive_checker

from rlserve.env.check_multi import MultiAgentChecks, is_multi_agent
from rlserve.env.check_single import SingleAgentChecks, Step
from rlserve.env.determinism import check_determinism
from rlserve.env.make import env_label
from rlserve.env.report import EnvReport, plain_warning
from rlserve.errors import ConfigError

__all__ = ["check_env"]

DETERMINISM_STEPS = 200
"""The most steps of each of the two rollouts that check determinism."""


class _Checks(Protocol):
    def check_spaces(self) -> bool: ...
    def sample(self, obs: Any) -> Any: ...
    def reset_result(self, result: Any) -> Any: ...
    def step_result(self, result: Any, step: int, episode: int) -> Step | None: ...


def check_env(
    env: Any,
    env_config: dict[str, Any] | None = None,
    *,
    episodes: int = 3,
    max_steps: int = 1000,
    seed: int = 0,
) -> EnvReport:
    """Check that an environment keeps the gymnasium (or RLlib multi-agent) contract.

    Args:
        env: An env instance, a registered gymnasium id, or a class or callable that takes an
            ``env_config`` dict and returns an env (one taking no argument works too).
        env_config: The config of a class or creator; the keyword arguments of ``gym.make`` for
            a registered id. Must be left out for an instance.
        episodes: How many episodes to run; episode ``i`` starts with ``reset(seed=seed + i)``.
        max_steps: The most steps of an episode; an episode still going then is a warning.
        seed: Seeds the resets and the action space the actions are sampled from.

    The env is closed at the end, an instance passed in as well.

    Returns:
        The report: every problem and warning found, and the episodes' statistics.

    Raises:
        ConfigError: ``env`` is an unknown id, or ``env_config`` cannot be given to it. An
            exception raised by the env itself, even while it is created, is a problem of
            the report instead.
    """
    report = EnvReport(env_name=env_label(env))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            instance = _make_env(env, env_config)
        except ConfigError:
            raise
        except Exception as exc:
            report.add_problem(
                "create",
                f"creating the env raised {_exception(exc)}: fix the constructor, or the "
                f"env_config {env_config or {}}",
            )
            return report
        _run_checks(report, instance, episodes, max_steps, seed)
    for warning in caught:
        report.add_warning(
            "env_warning",
            f"the env warned ({warning.category.__name__}): {plain_warning(warning.message)}",
            distinct=True,
        )
    return report


def _make_env(env: Any, env_config: dict[str, Any] | None) -> Any:
    """The env instance ``env`` names (to become :func:`rlserve.env.make.make_env`)."""
    config = dict(env_config or {})
    if isinstance(env, str):
        try:
            gym.spec(env)
        except gym.error.Error as exc:
            raise ConfigError(
                f"{env!r} is not a registered gymnasium id ({exc}): pass a registered id (e.g. "
                "CartPole-v1); on the command line also module:Name of a class or creator "
                "taking an env_config dict (e.g. examples/corridor.py:SimpleCorridor), in "
                "Python the env instance or class itself"
            ) from None
        # Our own checks replace gymnasium's passive checker, which would only warn once.
        return gym.make(env, disable_env_checker=True, **config)
    if isinstance(env, type) or (callable(env) and not hasattr(env, "step")):
        try:
            signature = inspect.signature(env)
        except (TypeError, ValueError):
            return env(config)
        try:
            signature.bind(config)
        except TypeError:
            if config:
                raise ConfigError(
                    f"{env_label(env)} takes no env_config argument: drop the env config, or give "
                    "it a parameter, e.g. def __init__(self, config=None)"
                ) from None
            return env()
        return env(config)
    if config:
        raise ConfigError(
            f"an env_config was given with an env instance ({env_label(env)}): pass the class or "
            "creator instead, or leave out the env_config"
        )
    return env


def _run_checks(report: EnvReport, env: Any, episodes: int, max_steps: int, seed: int) -> None:
    report.multi_agent = is_multi_agent(env)
    checks: _Checks = (
        MultiAgentChecks(report, env, seed)
        if report.multi_agent
        else SingleAgentChecks(report, env, seed)
    )
    if checks.check_spaces():
        seeded, with_options = _check_reset_signature(report, env)
        for episode in range(episodes):
            reset_kwargs: dict[str, Any] = {}
            if seeded:
                reset_kwargs["seed"] = seed + episode
            if with_options:
                reset_kwargs["options"] = None
            _run_episode(report, env, checks, episode, reset_kwargs, max_steps)
        spec = getattr(env, "spec", None)
        if seeded and report.episodes and not getattr(spec, "nondeterministic", False):
            steps = min(max_steps, DETERMINISM_STEPS)
            check_determinism(
                report,
                env,
                seed=seed,
                steps=steps,
                sample=checks.sample,
                multi_agent=report.multi_agent,
            )
        _check_render(report, env)
    try:
        env.close()
    except Exception as exc:
        report.add_problem(
            "close", f"close() raised {_exception(exc)}: close() must release resources quietly"
        )


def _check_reset_signature(report: EnvReport, env: Any) -> tuple[bool, bool]:
    """Whether ``reset`` takes ``seed`` and ``options`` keywords; a missing one is a problem."""
    try:
        parameters = inspect.signature(env.reset).parameters
    except (TypeError, ValueError):
        return True, True  # a builtin or a C extension: try calling it
    except AttributeError:
        report.add_problem("reset_signature", "the env has no reset() method: define reset()")
        return False, False
    any_keyword = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    missing = [name for name in ("seed", "options") if name not in parameters and not any_keyword]
    if missing:
        report.add_problem(
            "reset_signature",
            f"reset() does not take the keyword argument{'s' if len(missing) > 1 else ''} "
            f"{' and '.join(missing)}: define it as `def reset(self, *, seed=None, "
            "options=None)` and call super().reset(seed=seed) first",
        )
    default = parameters["seed"].default if "seed" in parameters else None
    if default is not None and default is not inspect.Parameter.empty:
        report.add_warning(
            "reset_signature",
            f"reset()'s seed defaults to {default!r}, so every unseeded episode starts alike: "
            "default it to None",
        )
    return "seed" not in missing, "options" not in missing


def _run_episode(
    report: EnvReport,
    env: Any,
    checks: _Checks,
    episode: int,
    reset_kwargs: dict[str, Any],
    max_steps: int,
) -> None:
    shown_kwargs = ", ".join(f"{key}={value!r}" for key, value in reset_kwargs.items())
    try:
        result = env.reset(**reset_kwargs)
    except Exception as exc:
        report.add_problem(
            "reset_exception",
            f"reset({shown_kwargs}) raised {_exception(exc)} (episode {episode}): reset() must "
            "start an episode for any seed",
        )
        return
    obs = checks.reset_result(result)
    if obs is None:
        return
    report.episodes += 1
    total, length, over = 0.0, 0, False
    while length < max_steps and not over:
        try:
            action = checks.sample(obs)
        except Exception as exc:
            report.add_problem(
                "action_space_sample",
                f"action_space.sample() raised {_exception(exc)}: fix the action space, or "
                "declare one of gymnasium's spaces",
            )
            break
        try:
            result = env.step(action)
        except Exception as exc:
            report.add_problem(
                "step_exception",
                f"step() raised {_exception(exc)} at step {length} of episode {episode}, for "
                f"the action {_short(action)} sampled from the action space: step() must "
                "accept every action of its action space",
            )
            break
        length += 1
        report.steps += 1
        step = checks.step_result(result, length - 1, episode)
        if step is None:
            break
        total += step.reward
        obs, over = step.obs, step.over
    else:
        if not over:
            cut = (
                "truncateds['__all__'] = True"
                if report.multi_agent
                else "truncated=True (e.g. gymnasium.wrappers.TimeLimit)"
            )
            report.add_warning(
                "episode_not_ending",
                f"episode {episode} did not end within {max_steps} steps: end episodes with "
                f"{cut} after a time limit, or check with more --max-steps",
            )
    report.episode_returns.append(total)
    report.episode_lengths.append(length)


def _check_render(report: EnvReport, env: Any) -> None:
    mode = getattr(env, "render_mode", None)
    if mode is None:
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            if hasattr(env, "metadata"):
                env_render_passive_checker(env)
            else:
                env.render()
        except AssertionError as exc:
            report.add_problem("render", f"render() with render_mode {mode!r}: {exc}")
        except Exception as exc:
            report.add_problem(
                "render", f"render() with render_mode {mode!r} raised {_exception(exc)}"
            )
    for warning in caught:
        report.add_warning(
            "render",
            f"render() with render_mode {mode!r}: {plain_warning(warning.message)}",
            distinct=True,
        )


def _exception(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _short(value: Any, limit: int = 60) -> str:
    if isinstance(value, np.ndarray | np.generic):
        value = value.tolist()
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
