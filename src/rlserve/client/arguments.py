"""The checks and conversions of PolicyClient's arguments, the same in both inference modes.

Rewards must be finite numbers in range, multi-agent values are dicts keyed by agent id (the
keys read as strings), ``info`` maps must be able to travel, and RLlib's done and truncated
dicts become one mark per agent; the client's timings must neither spin nor never wait.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from rlserve.client.local_config import MIN_INTERVAL_S
from rlserve.errors import ConfigError, EpisodeError, SpaceError
from rlserve.protocol.info import check_info_size, wire_info
from rlserve.protocol.values import MAX_ABS_REWARD

_STR_ONLY = {str}
_PLAIN_FLOATS = {float}
_NUMBER_TYPES = {float, int, np.float64, np.float32, np.int64, np.int32}
"""Reward types checked together (bool is not among them: it is not a reward)."""


def reward_number(reward: Any, where: str) -> float:
    """``reward`` as a float, refused at once when it is not a finite number in range.

    Args:
        reward: What the simulator passed.
        where: The call and episode, for the error message.

    Raises:
        SpaceError: Not a number, or not finite within ``-MAX_ABS_REWARD..MAX_ABS_REWARD``.
    """
    if isinstance(reward, bool) or not isinstance(reward, int | float | np.number):
        raise SpaceError(f"{where}: reward must be a number, got {type(reward).__name__}")
    try:
        value = float(reward)
    except OverflowError:
        value = float("inf")
    if not -MAX_ABS_REWARD <= value <= MAX_ABS_REWARD:  # False for NaN
        raise SpaceError(
            f"{where}: reward {reward!r} is out of range; a reward must be a finite number "
            f"within -{MAX_ABS_REWARD:g}..{MAX_ABS_REWARD:g}"
        )
    return value


def step_returns(
    episode_id: str, reward: Any, info: dict[str, Any] | None, max_info_bytes: int
) -> tuple[float, dict[str, Any] | None]:
    """A single-agent step's reward as a float and its ``info`` as a plain map (or None).

    Raises:
        SpaceError: The reward is not a finite number in range, or ``info`` cannot travel.
        LimitExceededError: ``info`` is over ``max_info_bytes``.
    """
    if not isinstance(reward, int | float | np.number) or isinstance(reward, bool):
        raise SpaceError(
            f"log_returns for episode '{episode_id}': reward must be a number, got "
            f"{type(reward).__name__} (a dict of rewards is for multi-agent episodes: "
            "PolicyClient(..., multiagent=True))"
        )
    where = f"log_returns for episode '{episode_id}'"
    value = reward_number(reward, where)
    plain = None
    if info:
        plain = wire_info(info, where)
        check_info_size(plain, max_info_bytes, where)
    return value, plain


def agent_keys(values: Mapping[Any, Any]) -> list[str]:
    """The keys of a dict keyed by agent id, as strings."""
    keys = list(values)
    if set(map(type, keys)) <= _STR_ONLY:
        return keys
    return [str(a) for a in keys]


def agent_rewards(episode_id: str, reward: Any) -> dict[str, float]:
    """A multi-agent reward dict with each value checked, keyed by agent id as a string.

    Raises:
        SpaceError: Not a dict, or a value that is not a finite number in range.
    """
    if not isinstance(reward, Mapping):
        raise SpaceError(
            f"log_returns for episode '{episode_id}': a multi-agent episode takes a dict of "
            f"rewards keyed by agent id, got {type(reward).__name__}"
        )
    kinds = set(map(type, reward.values()))
    if kinds <= _NUMBER_TYPES and set(map(type, reward)) <= _STR_ONLY:
        # Numbers keyed by strings (the common case): checked together.
        try:
            values = np.fromiter(reward.values(), np.float64, len(reward))
        except OverflowError:
            values = np.array([np.inf])  # an int too large for a float: reported below
        if (np.abs(values) <= MAX_ABS_REWARD).all():  # False for NaN and infinities
            if kinds <= _PLAIN_FLOATS:
                return dict(reward)
            return dict(zip(reward, values.tolist(), strict=True))
    return {
        str(agent_id): reward_number(
            value, f"log_returns for episode '{episode_id}', agent '{agent_id}'"
        )
        for agent_id, value in reward.items()
    }


def done_marks(
    done: Mapping[str, bool] | None, truncated: Mapping[str, bool] | None
) -> dict[str, bool]:
    """Agent id -> True (terminated) or False (truncated); ``__all__`` kept as given."""
    marks: dict[str, bool] = {}
    for agent_id, flag in (truncated or {}).items():
        if flag:
            marks[str(agent_id)] = False
    for agent_id, flag in (done or {}).items():
        if flag and str(agent_id) not in marks:
            marks[str(agent_id)] = True
    return marks


def agent_infos(
    episode_id: str, info: Mapping[str, Any] | None, max_info_bytes: int
) -> dict[str, dict[str, Any]]:
    """Per-agent info maps, made plain and checked against ``max_info_bytes``.

    Raises:
        SpaceError: ``info`` is not a dict of maps, or holds a value that cannot travel.
        LimitExceededError: An agent's info is over ``max_info_bytes``.
    """
    if not info:
        return {}
    if not isinstance(info, Mapping):
        raise SpaceError(
            f"log_returns for episode '{episode_id}': info of a multi-agent episode is a "
            "dict of info maps keyed by agent id"
        )
    out = {}
    for agent_id, agent_info in info.items():
        if not agent_info:
            continue
        where = f"log_returns for episode '{episode_id}', agent '{agent_id}'"
        if not isinstance(agent_info, Mapping):
            raise SpaceError(f"{where}: info must be a map, got {type(agent_info).__name__}")
        plain = wire_info(dict(agent_info), where)
        check_info_size(plain, max_info_bytes, where)
        out[str(agent_id)] = plain
    return out


def check_timings(
    update_interval: float | None,
    timeout: float | None,
    connect_timeout: float,
    reconnect_timeout: float,
) -> None:
    """Refuse, naming the argument, a ``PolicyClient`` time that would spin or never wait.

    Raises:
        ConfigError: ``update_interval`` below :data:`MIN_INTERVAL_S` (None: refresh only on
            ``update_policy_weights()``), ``timeout`` (None: no limit) or ``connect_timeout`` not
            positive, ``reconnect_timeout`` negative, or any of them not a finite number.
    """
    if update_interval is not None and not (
        _seconds(update_interval) and update_interval >= MIN_INTERVAL_S
    ):
        raise ConfigError(
            f"update_interval must be at least {MIN_INTERVAL_S} s, or None to refresh the "
            f"weights only on update_policy_weights(); got {update_interval!r}"
        )
    if timeout is not None and not (_seconds(timeout) and timeout > 0):
        raise ConfigError(
            f"timeout must be a positive number of seconds (None: no limit), got {timeout!r}"
        )
    if not (_seconds(connect_timeout) and connect_timeout > 0):
        raise ConfigError(
            f"connect_timeout must be a positive number of seconds, got {connect_timeout!r}"
        )
    if not (_seconds(reconnect_timeout) and reconnect_timeout >= 0):
        raise ConfigError(
            f"reconnect_timeout must be 0 (no retry) or more seconds, got {reconnect_timeout!r}"
        )


def _seconds(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def episode_ids(episode_id: Any, call: str) -> list[str]:
    """The episode ids of a call on several episodes (any iterable of strings but a string).

    Raises:
        EpisodeError: ``episode_id`` is neither a string nor a sequence of strings.
    """
    if not isinstance(episode_id, (str, bytes)) and isinstance(episode_id, Iterable):
        ids = list(episode_id)  # a list, a tuple, dict keys, an array of strings...
        if all(isinstance(e, str) for e in ids):
            return ids
    raise EpisodeError(
        f"{call}: an episode id is the string start_episode returned (or a list of them for "
        f"several episodes at once), got {episode_id!r} ({type(episode_id).__name__})"
    )
