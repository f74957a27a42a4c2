"""Typed reads of a raw request map's fields, each failure a clear DecodeError.

The checks every request parser shares: ids and their lengths, sequence numbers, rewards (finite
and within the reward bound), info maps (within their size limit), and lists of numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlserve.errors import DecodeError, LimitExceededError
from rlserve.protocol.episode_requests import MAX_SEQ
from rlserve.protocol.info import check_info_size
from rlserve.protocol.limits import DEFAULT_LIMITS, Limits
from rlserve.protocol.values import MAX_ABS_REWARD, check_reward, short_repr


@dataclass(slots=True)
class RequestFields:
    """Typed accessors over a raw message map that raise a clear DecodeError."""

    raw: dict[str, Any]
    kind: str
    limits: Limits = field(default=DEFAULT_LIMITS)

    def missing(self, name: str) -> DecodeError:
        """The error for a required field ``name`` that is absent."""
        return DecodeError(f"'{self.kind}' needs the field '{name}'")

    def wrong(self, name: str, expected: str, value: Any) -> DecodeError:
        """The error for a field ``name`` whose ``value`` is not ``expected``."""
        got = type(value).__name__
        if isinstance(value, int | float) and not isinstance(value, bool):
            got = f"{got} {short_repr(value)}"  # a number out of range, or not the type
        return DecodeError(f"'{self.kind}' field '{name}' must be {expected}, got {got}")

    def int_(self, name: str, default: int | None = None) -> int:
        """The non-negative integer ``name`` (``default`` when absent; None: required)."""
        value = self.raw.get(name, default)
        if value is None:
            raise self.missing(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise self.wrong(name, "a non-negative integer", value)
        return value

    def bool_(self, name: str, default: bool) -> bool:
        """The boolean ``name``, ``default`` when absent."""
        value = self.raw.get(name, default)
        if not isinstance(value, bool):
            raise self.wrong(name, "true or false", value)
        return value

    def float_opt(self, name: str) -> float | None:
        """The finite reward-bounded number ``name``, or None when absent."""
        value = self.raw.get(name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.wrong(name, "a number", value)
        number = finite_number(value)
        if number is None:
            problem = "is out of range" if isinstance(value, int) else "must be finite"
            raise DecodeError(
                f"'{self.kind}' field '{name}' {problem}, got {short_repr(value)}; a reward must "
                f"be within -{MAX_ABS_REWARD:g}..{MAX_ABS_REWARD:g}"
            )
        return check_reward(number, f"'{self.kind}' field '{name}'")

    def seq_opt(self, name: str) -> int | None:
        """The call sequence number ``name``, or None when absent."""
        value = self.raw.get(name)
        return None if value is None else self.check_seq(name, value)

    def check_seq(self, name: str, value: Any) -> int:
        """``value`` of ``name`` checked as a call sequence number (1 to MAX_SEQ)."""
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_SEQ:
            raise DecodeError(
                f"'{self.kind}' field '{name}' must be an integer from 1 to {MAX_SEQ} (the "
                f"episode's call number), got {short_repr(value)}"
            )
        return value

    def id_(self, name: str) -> str:
        """The required id ``name``."""
        value = self.raw.get(name)
        if value is None:
            raise self.missing(name)
        return self.check_id(name, value)

    def id_opt(self, name: str) -> str | None:
        """The id ``name``, or None when absent."""
        value = self.raw.get(name)
        return None if value is None else self.check_id(name, value)

    def check_id(self, name: str, value: Any) -> str:
        """``value`` of ``name`` checked as an id (a string within the length limit)."""
        if not isinstance(value, str):
            raise self.wrong(name, "a string", value)
        if not value or len(value) > self.limits.max_id_length:
            raise LimitExceededError(
                f"'{self.kind}' field '{name}' must have 1 to {self.limits.max_id_length} "
                f"characters, got {len(value)}"
            )
        return value

    def str_(self, name: str, default: str) -> str:
        """The string ``name`` within the id length limit, ``default`` when absent."""
        value = self.raw.get(name, default)
        if not isinstance(value, str):
            raise self.wrong(name, "a string", value)
        if len(value) > self.limits.max_id_length:
            raise LimitExceededError(
                f"'{self.kind}' field '{name}' has {len(value)} characters; the limit is "
                f"{self.limits.max_id_length}"
            )
        return value

    def info_opt(self, name: str) -> dict[str, Any] | None:
        """The info map ``name``, or None when absent."""
        return self.check_info(name, self.raw.get(name))

    def check_info(self, name: str, value: Any) -> dict[str, Any] | None:
        """``value`` of ``name`` checked as an info map within its size limit (None passes)."""
        if value is None:
            return None
        if not isinstance(value, dict):
            raise self.wrong(name, "a map", value)
        if value:
            check_info_size(value, self.limits.max_info_bytes, f"'{self.kind}' field '{name}'")
        return value

    def present(self, name: str) -> Any:
        """The field ``name`` as it is, which must be present (nil counts as a value)."""
        if name not in self.raw:
            raise self.missing(name)
        return self.raw[name]


_PLAIN_NUMBERS = frozenset({float, int})


def checked_numbers(value: Any, count: int) -> np.ndarray | None:
    """``value`` as ``[count]`` float64 when it is all finite numbers within the reward bound.

    The common case, checked with a few vectorised operations; None otherwise, and
    :func:`float_list` then reports what is wrong.
    """
    if isinstance(value, np.ndarray):
        if value.shape != (count,) or value.dtype.kind not in "fiu":
            return None
        numbers = value.astype(np.float64)
    elif isinstance(value, list) and len(value) == count:
        if not set(map(type, value)) <= _PLAIN_NUMBERS:  # bools and numpy scalars excepted
            return None
        try:
            numbers = np.array(value, dtype=np.float64)
        except OverflowError:
            return None
    else:
        return None
    if not (np.abs(numbers) <= MAX_ABS_REWARD).all():  # False for NaN and infinities
        return None
    return numbers


def float_list(f: RequestFields, name: str, value: Any, count: int) -> list[float]:
    """``value`` as ``count`` finite reward-bounded floats, the field ``name`` of ``f``.

    Raises:
        DecodeError: ``value`` is not a list of ``count`` such numbers; the message says why.
    """
    numbers = checked_numbers(value, count)
    if numbers is not None:
        return list(numbers.tolist())
    if hasattr(value, "tolist"):
        value = value.tolist()
    if not isinstance(value, list) or len(value) != count:
        raise DecodeError(f"{f.kind} '{name}' must be a list of {count} numbers")
    out = []
    for item in value:
        number = finite_number(item)
        if number is None:
            raise DecodeError(f"{f.kind} '{name}' must hold finite numbers, got {item!r}")
        out.append(check_reward(number, f"{f.kind} '{name}'"))
    return out


def finite_number(value: Any) -> float | None:
    """``value`` as a finite float, or None (not a number, a bool, NaN, infinite, too large)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None
