"""Range checks shared by the algorithms' settings (importable without torch).

Each raises :class:`~rlserve.errors.ConfigError` naming the setting, the value and what it
must be, so that a bad value stops ``rlserve serve`` / ``train`` (or ``build()``) before
anything starts, instead of a learner that fails at every restart.
"""

from __future__ import annotations

import math
import numbers
import operator
from typing import Any

import numpy as np

from rlserve.errors import ConfigError

DEVICES = ("auto", "cpu", "cuda")
"""Device names a learner accepts (besides ``cuda:N``)."""


def check_rate(name: str, value: float) -> None:
    """A finite number above 0 (a learning rate, a clip, a norm)."""
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise ConfigError(f"{name} must be a finite positive number, got {value!r}")


def whole_number(value: Any) -> int | None:
    """``value`` as an int when it is a whole number (an int, a numpy int, ``4000.0``), else None.

    A bool is not a number here.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, float):
        return int(value) if value.is_integer() else None
    try:
        return operator.index(value)
    except TypeError:
        return None


def check_at_least(name: str, value: Any, low: int) -> None:
    """A whole number of ``low`` or more."""
    number = whole_number(value)
    if number is None or number < low:
        raise ConfigError(f"{name} must be a whole number of {low} or more, got {value!r}")


def _real(value: Any) -> bool:
    """A real number: Python's or numpy's (``np.float32(1e-3)``), not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def check_within(name: str, value: float, low: float, high: float) -> None:
    """A number within ``[low, high]``."""
    if not (_real(value) and low <= value <= high):
        raise ConfigError(f"{name} must be within [{low}, {high}], got {value!r}")


def check_finite(name: str, value: float, low: float = -math.inf) -> None:
    """A finite number of ``low`` or more (a loss weight)."""
    if not (_real(value) and math.isfinite(value) and value >= low):
        more = "" if low == -math.inf else f" of {low} or more"
        raise ConfigError(f"{name} must be a finite number{more}, got {value!r}")


def check_network(settings: Any) -> None:
    """The network and device settings every algorithm has.

    ``hidden`` (each size 1 or more; empty is a linear model), ``activation``, ``device``
    (``auto``, ``cpu``, ``cuda`` or ``cuda:N``) and ``torch_threads`` (1 or more).
    """
    hidden = settings.hidden
    if not isinstance(hidden, (tuple, list)) or not all(
        isinstance(size, int) and not isinstance(size, bool) and size >= 1 for size in hidden
    ):
        raise ConfigError(
            f"hidden must list layer sizes of 1 or more (e.g. [64, 64]), got {hidden!r}"
        )
    if settings.activation not in ("tanh", "relu"):
        raise ConfigError(f"activation must be tanh or relu, got '{settings.activation}'")
    device = settings.device
    if not isinstance(device, str) or not (
        device in DEVICES or (device.startswith("cuda:") and device[5:].isdigit())
    ):
        raise ConfigError(f"device must be auto, cpu, cuda or cuda:N, got '{device}'")
    check_at_least("torch_threads", settings.torch_threads, 1)


def check_device_present(device: str, what: str = "device") -> None:
    """Refuse a ``cuda`` device this machine's torch cannot use (imports torch for ``cuda*``).

    ``what`` names the setting in the error. ``auto`` and ``cpu`` always work; ``rlserve
    serve`` calls this before listening, so that a learner is never started (and restarted) on
    a device it cannot open.
    """
    if not device.startswith("cuda"):
        return
    import torch

    if not torch.cuda.is_available():
        built = f"with CUDA {torch.version.cuda}" if torch.version.cuda else "without CUDA"
        raise ConfigError(
            f"{what} {device}: torch {torch.__version__} (built {built}) sees no CUDA device "
            "here; use auto (cuda where present) or cpu"
        )
    count = torch.cuda.device_count()
    index = int(device[5:]) if device.startswith("cuda:") else 0
    if index >= count:
        raise ConfigError(
            f"{what} {device}: this machine has {count} CUDA device(s), cuda:0 to "
            f"cuda:{count - 1}; pick one of them, or auto"
        )
