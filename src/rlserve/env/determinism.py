"""Seeded determinism: the same seed and actions must give the same observations and rewards.

Two rollouts start with ``reset(seed=seed)``; the second replays the first one's actions, and the
first step where an observation or reward differs (beyond a small tolerance) is reported. Any
exception ends the check quietly: the episodes of the main check already report it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from copy import deepcopy
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlserve.env.report import EnvReport

__all__ = ["check_determinism", "difference"]

TOLERANCE = 1e-5
"""Relative and absolute tolerance of the comparisons (gymnasium's ``data_equivalence`` too)."""

ALL = "__all__"

FIX = (
    "draw every random number from self.np_random (not the random module, np.random or a "
    "generator made in __init__) and call super().reset(seed=seed) in reset()"
)


@dataclass
class _Rollout:
    observations: list[Any] = field(default_factory=list)
    rewards: list[Any] = field(default_factory=list)
    actions: list[Any] = field(default_factory=list)


def check_determinism(
    report: EnvReport,
    env: Any,
    *,
    seed: int,
    steps: int,
    sample: Callable[[Any], Any],
    multi_agent: bool,
) -> None:
    """Run two seeded rollouts of at most ``steps`` steps and report where they first differ.

    Args:
        report: Where a ``nondeterministic`` problem goes.
        env: The environment, already checked to accept ``reset(seed=...)``.
        seed: The seed of both resets.
        steps: The most steps of each rollout.
        sample: Returns the action (a dict of actions for multi-agent) for an observation.
        multi_agent: Whether ``env`` follows the multi-agent dict conventions.
    """
    first = _rollout(env, seed, steps, sample, None, multi_agent)
    if first is None:
        return
    second = _rollout(env, seed, len(first.actions), None, first.actions, multi_agent)
    if second is None:
        return
    pairs = zip(first.observations, second.observations, strict=False)
    for step, (one, two) in enumerate(pairs):
        found = difference(one, two)
        if found is None and step > 0:
            found = difference(first.rewards[step - 1], second.rewards[step - 1])
            what = "rewards"
        else:
            what = "observations"
        if found is None:
            continue
        if step == 0:
            told = f"reset(seed={seed}) twice gave different observations ({found})"
        else:
            told = (
                f"with reset(seed={seed}) and the same actions, the {what} of step {step - 1} "
                f"differ ({found})"
            )
        report.add_problem("nondeterministic", f"{told}: {FIX}{_np_random_hint(env)}")
        return


def _rollout(
    env: Any,
    seed: int,
    steps: int,
    sample: Callable[[Any], Any] | None,
    actions: list[Any] | None,
    multi_agent: bool,
) -> _Rollout | None:
    rollout = _Rollout()
    try:
        result = env.reset(seed=seed)
        obs = result[0] if isinstance(result, tuple) and len(result) == 2 else result
        rollout.observations.append(deepcopy(obs))
        for step in range(steps):
            action = actions[step] if actions is not None else sample(obs)  # type: ignore[misc]
            result = env.step(action)
            obs, reward = result[0], result[1]
            rollout.actions.append(deepcopy(action))
            rollout.observations.append(deepcopy(obs))
            rollout.rewards.append(deepcopy(reward))
            if _ended(result, multi_agent):
                break
    except Exception:
        return None
    return rollout


def _ended(result: tuple[Any, ...], multi_agent: bool) -> bool:
    flags = result[2:-1]
    if multi_agent:
        return any(isinstance(f, Mapping) and bool(f.get(ALL, False)) for f in flags)
    return any(bool(f) for f in flags)


def _np_random_hint(env: Any) -> str:
    unwrapped = getattr(env, "unwrapped", env)
    if hasattr(unwrapped, "_np_random") and unwrapped._np_random is None:
        return " (self.np_random was never seeded: reset() does not call super().reset(seed=seed))"
    return ""


def difference(one: Any, two: Any, path: str = "") -> str | None:
    """The first difference between two observations or rewards, in words; None if equal.

    Arrays and numbers are compared with a tolerance of :data:`TOLERANCE`; NaN equals NaN.
    """
    at = f" at {path}" if path else ""
    if isinstance(one, Mapping) and isinstance(two, Mapping):
        if set(one) != set(two):
            return f"keys{at} {sorted(map(str, one))} vs {sorted(map(str, two))}"
        for key in one:
            found = difference(one[key], two[key], f"{path}[{key!r}]")
            if found is not None:
                return found
        return None
    if isinstance(one, tuple | list) and isinstance(two, tuple | list):
        if len(one) != len(two):
            return f"lengths{at} {len(one)} vs {len(two)}"
        for index, (a, b) in enumerate(zip(one, two, strict=True)):
            found = difference(a, b, f"{path}[{index}]")
            if found is not None:
                return found
        return None
    try:
        a, b = np.asarray(one), np.asarray(two)
    except Exception:
        return None if one == two else f"{one!r} vs {two!r}{at}"
    if a.shape != b.shape:
        return f"shapes{at} {a.shape} vs {b.shape}"
    if a.dtype.kind in "biuf" and b.dtype.kind in "biuf":
        close = np.isclose(a, b, rtol=TOLERANCE, atol=TOLERANCE, equal_nan=True)
    else:
        close = np.asarray(a == b)
    if np.all(close):
        return None
    if a.shape == ():
        return f"{_show(a)} vs {_show(b)}{at}"
    first = tuple(int(i) for i in np.argwhere(~close)[0])
    return f"element {first}{at} is {_show(a[first])} vs {_show(b[first])}"


def _show(value: Any) -> str:
    item = value.item() if isinstance(value, np.ndarray | np.generic) else value
    if isinstance(item, float) and math.isfinite(item):
        return f"{item:.6g}"
    return repr(item)
