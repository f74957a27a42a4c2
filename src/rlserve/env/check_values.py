"""Checks of single values an environment returns: an observation, a reward, a flag, an info.

Each check adds what it finds to an :class:`~rlserve.env.report.EnvReport` and never raises.
``where`` names the call in the messages, e.g. ``"step()"`` or ``"step() for agent 'red'"``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.utils.passive_env_checker import check_action_space, check_observation_space

from rlserve.env.report import EnvReport, plain_warning

__all__ = [
    "check_flag",
    "check_info",
    "check_observation",
    "check_reward",
    "check_space",
]


def check_observation(report: EnvReport, obs: Any, space: spaces.Space[Any], where: str) -> None:
    """Check that ``obs`` lies in ``space``, naming the shape, dtype or bound that is wrong.

    A dtype that rlserve casts without loss of meaning (float64 for a float32 Box) and a list
    where an array is expected are warnings; everything else outside the space is a problem.
    """
    _check(report, obs, space, where, "")


def _check(report: EnvReport, obs: Any, space: spaces.Space[Any], where: str, path: str) -> None:
    noun = f"an observation with {path}" if path else "an observation"
    try:
        if isinstance(space, spaces.Box):
            _check_box(report, obs, space, where, noun)
        elif isinstance(space, spaces.Discrete):
            _check_discrete(report, obs, space, where, noun)
        elif isinstance(space, spaces.Dict):
            _check_dict(report, obs, space, where, path)
        elif isinstance(space, spaces.Tuple):
            _check_tuple(report, obs, space, where, path)
        elif isinstance(space, (spaces.MultiDiscrete, spaces.MultiBinary)):
            _check_multi(report, obs, space, where, noun)
        elif not space.contains(obs):
            report.add_problem(
                "obs_outside_space",
                f"{where} returned {noun} outside its {space}: return values that "
                "observation_space.contains() accepts, or fix observation_space",
            )
    except Exception as exc:  # a broken custom space or a strange value; keep checking the env
        report.add_problem(
            "obs_outside_space",
            f"{where} returned {noun} that {space}.contains() could not check "
            f"({type(exc).__name__}: {exc}): return a value of the type the space describes",
        )


def _as_array(report: EnvReport, obs: Any, space: Any, where: str, noun: str) -> Any:
    """``obs`` as a numeric numpy array, or None after reporting why it is not one."""
    if isinstance(obs, np.ndarray):
        array = obs
    elif isinstance(obs, (bool, int, float, np.generic, list, tuple)):
        try:
            array = np.asarray(obs)
        except ValueError:
            array = None
        if array is not None and array.shape != () and array.dtype.kind in "biuf":
            report.add_warning(
                "obs_type",
                f"{where} returned {noun} as a {type(obs).__name__}, not a numpy array: "
                f"rlserve converts it, but np.asarray(obs, dtype=np.{space.dtype}) saves the copy",
            )
    else:
        array = None
    if array is None or array.dtype.kind not in "biuf":
        report.add_problem(
            "obs_type",
            f"{where} returned {noun} of type {type(obs).__name__} for a {_name(space)}: "
            f"return a numpy array of shape {space.shape} and dtype {space.dtype}",
        )
        return None
    return array


def _check_box(report: EnvReport, obs: Any, space: spaces.Box, where: str, noun: str) -> None:
    array = _as_array(report, obs, space, where, noun)
    if array is None:
        return
    if array.shape != space.shape:
        report.add_problem(
            "obs_shape",
            f"{where} returned {noun} of shape {array.shape} for a Box of shape {space.shape}: "
            "return arrays of the declared shape, or fix observation_space",
        )
        return
    if array.dtype != space.dtype:
        if not _castable(array.dtype, space.dtype):
            report.add_problem(
                "obs_dtype",
                f"{where} returned {noun} of dtype {array.dtype} for a Box of dtype "
                f"{space.dtype}: casting would change the values; return {space.dtype} arrays, "
                "or declare the Box with the dtype you return",
            )
            return
        report.add_warning(
            "obs_dtype",
            f"{where} returned {noun} of dtype {array.dtype} for a Box of dtype {space.dtype}: "
            f"rlserve casts it, but returning {space.dtype} (e.g. obs.astype(np.{space.dtype})) "
            "saves the cast",
        )
    # A float Box compares in its own dtype, so float64 values rounded to float32 bounds pass;
    # integers compare exactly (numpy promotes), so -1 is not wrapped into a uint8 Box.
    values = array.astype(space.dtype) if space.dtype.kind == "f" else array
    if values.dtype.kind == "f" and np.isnan(values).any():
        index = tuple(int(i) for i in np.argwhere(np.isnan(values))[0])
        report.add_problem(
            "obs_outside_space",
            f"{where} returned {noun} holding NaN at index {index}: fix the computation that "
            "produced it (a division by zero, an uninitialised buffer)",
        )
        return
    for bound, outside, word in (
        (space.low, values < space.low, "below low"),
        (space.high, values > space.high, "above high"),
    ):
        if np.any(outside):
            index = tuple(int(i) for i in np.argwhere(outside)[0])
            report.add_problem(
                "obs_outside_space",
                f"{where} returned {noun} outside the Box's bounds: element {index} is "
                f"{values[index].item()!r}, {word} {bound[index].item()!r}; clip it or widen "
                "the Box",
            )
            return


def _castable(source: np.dtype[Any], target: np.dtype[Any]) -> bool:
    if np.can_cast(source, target, "same_kind"):
        return True
    return source.kind in "iu" and target.kind in "iu"


def _check_discrete(
    report: EnvReport, obs: Any, space: spaces.Discrete, where: str, noun: str
) -> None:
    value = obs
    if isinstance(obs, np.ndarray) and obs.shape == ():
        value = obs[()]
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | np.integer):
        report.add_problem(
            "obs_dtype",
            f"{where} returned {noun} of type {type(obs).__name__} for a {space}: return an int",
        )
        return
    low, high = int(space.start), int(space.start) + int(space.n) - 1
    if not low <= int(value) <= high:
        report.add_problem(
            "obs_outside_space",
            f"{where} returned {noun} of {int(value)} for a {space}, whose values are "
            f"{low}..{high}: fix the value or the space's n and start",
        )


def _check_multi(
    report: EnvReport,
    obs: Any,
    space: spaces.MultiDiscrete | spaces.MultiBinary,
    where: str,
    noun: str,
) -> None:
    array = _as_array(report, obs, space, where, noun)
    if array is None:
        return
    if array.shape != space.shape:
        report.add_problem(
            "obs_shape",
            f"{where} returned {noun} of shape {array.shape} for a {_name(space)} of shape "
            f"{space.shape}: return arrays of the declared shape, or fix observation_space",
        )
    elif array.dtype.kind == "f":
        report.add_problem(
            "obs_dtype",
            f"{where} returned {noun} of dtype {array.dtype} for a {_name(space)}: return "
            "integer arrays",
        )
    elif not space.contains(array.astype(space.dtype)):
        report.add_problem(
            "obs_outside_space",
            f"{where} returned {noun} outside its {space}: fix the values or the space",
        )


def _check_dict(report: EnvReport, obs: Any, space: spaces.Dict, where: str, path: str) -> None:
    noun = f"an observation with {path}" if path else "an observation"
    if not isinstance(obs, Mapping):
        report.add_problem(
            "obs_type",
            f"{where} returned {noun} of type {type(obs).__name__} for a Dict space: return a "
            f"dict with the keys {sorted(space.spaces)}",
        )
        return
    missing = [key for key in space.spaces if key not in obs]
    extra = [key for key in obs if key not in space.spaces]
    if missing or extra:
        report.add_problem(
            "obs_keys",
            f"{where} returned {noun} whose keys differ from its Dict space (missing: "
            f"{missing}, unknown: {extra}): return exactly the keys of the space",
        )
    for key, subspace in space.spaces.items():
        if key in obs:
            _check(report, obs[key], subspace, where, f"{path}[{key!r}]")


def _check_tuple(report: EnvReport, obs: Any, space: spaces.Tuple, where: str, path: str) -> None:
    noun = f"an observation with {path}" if path else "an observation"
    if not isinstance(obs, tuple | list) or len(obs) != len(space.spaces):
        size = len(obs) if isinstance(obs, tuple | list) else type(obs).__name__
        report.add_problem(
            "obs_type",
            f"{where} returned {noun} of {size} for a Tuple space of {len(space.spaces)} "
            f"elements: return a tuple of {len(space.spaces)} values",
        )
        return
    for index, (item, subspace) in enumerate(zip(obs, space.spaces, strict=True)):
        _check(report, item, subspace, where, f"{path}[{index}]")


def _name(space: Any) -> str:
    return type(space).__name__


def check_reward(report: EnvReport, reward: Any, where: str) -> float:
    """Check that ``reward`` is a finite real number; return it as a float (0.0 if it is not)."""
    if isinstance(reward, np.ndarray) and reward.shape == () and reward.dtype.kind in "iuf":
        report.add_warning(
            "reward_type",
            f"{where} returned a reward as a 0-d numpy array: rlserve converts it, but return "
            "float(reward)",
        )
        reward = reward[()]
    if isinstance(reward, bool | np.bool_):
        report.add_warning(
            "reward_type",
            f"{where} returned a bool reward: rlserve reads it as 0.0 or 1.0, but return a float",
        )
        return float(reward)
    if not isinstance(reward, int | float | np.integer | np.floating):
        report.add_problem(
            "reward_type",
            f"{where} returned a reward of type {type(reward).__name__}: return a float "
            "(0.0 when nothing happened)",
        )
        return 0.0
    value = float(reward)
    if not math.isfinite(value):
        report.add_problem(
            "reward_not_finite",
            f"{where} returned a reward of {value}: rewards must be finite; fix the computation "
            "(a division by zero, a log of 0) or clip it",
        )
        return 0.0
    return value


def check_flag(report: EnvReport, flag: Any, name: str, where: str) -> bool:
    """Check that ``flag`` (``terminated`` or ``truncated``) is a bool; return its truth."""
    if isinstance(flag, bool | np.bool_):
        return bool(flag)
    report.add_problem(
        f"{name}_type",
        f"{where} returned {name} of type {type(flag).__name__}: return a bool (e.g. bool({name}))",
    )
    try:
        return bool(flag)
    except (TypeError, ValueError):  # e.g. an array of several elements
        return False


def check_info(report: EnvReport, info: Any, where: str) -> None:
    """Check that ``info`` is a dict."""
    if not isinstance(info, dict):
        report.add_problem(
            "info_type",
            f"{where} returned an info of type {type(info).__name__}: return a dict ({{}} when "
            "there is nothing to say)",
        )


def check_space(report: EnvReport, space: Any, role: str, owner: str) -> bool:
    """Check that ``space`` is a valid gymnasium space; return whether it is one.

    Gymnasium's own space checks run too: their assertions become problems, their warnings
    (e.g. a Box whose low equals its high) warnings.

    Args:
        report: Where findings go.
        space: The value of the attribute.
        role: ``"observation"`` or ``"action"``.
        owner: Where the space comes from, e.g. ``"observation_space"`` or
            ``"observation_spaces['red']"``.
    """
    if space is None:
        fix = (
            f"give the env {role}_spaces, a dict of a gymnasium space per agent id"
            if "[" in owner
            else f"set self.{role}_space to a gymnasium space in __init__"
        )
        report.add_problem(
            "space_missing",
            f"the env has no {owner}: {fix} (e.g. gymnasium.spaces.Box(-1, 1, (4,), np.float32))",
        )
        return False
    if not isinstance(space, spaces.Space):
        report.add_problem(
            "space_type",
            f"the env's {owner} is a {type(space).__module__}.{type(space).__name__}, not a "
            "gymnasium space: use gymnasium.spaces (gym.spaces of the old gym package is "
            "not the same class)",
        )
        return False
    check = check_observation_space if role == "observation" else check_action_space
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            check(space)
        except (AssertionError, TypeError) as exc:
            report.add_problem("space_invalid", f"the env's {owner} {space} is invalid: {exc}")
            return False
    for warning in caught:
        report.add_warning(
            "space", f"the env's {owner} {space}: {plain_warning(warning.message)}", distinct=True
        )
    return True
