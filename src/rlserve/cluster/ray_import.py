"""Ray, imported only when asked for, and the choice between Ray actors and processes."""

from __future__ import annotations

import sys
from types import ModuleType

from rlserve.errors import ConfigError

__all__ = ["BACKENDS", "RAY_INSTALL", "import_ray", "use_ray"]

RAY_INSTALL = "pip install -e '.[ray]' in the checkout (or add [ray] to the wheel you installed)"
"""The command that installs the Ray this package runs on."""

BACKENDS = ("ray", "process")
"""The env-runner backends one can name (None: Ray when it is initialised, else processes)."""


def import_ray(wanted: str = "backend='ray'") -> ModuleType:
    """The ``ray`` module.

    Args:
        wanted: What asked for Ray, for the error message.

    Raises:
        ConfigError: Ray is not installed (the message names the install command).
    """
    try:
        import ray
    except ImportError:
        raise ConfigError(f"{wanted} needs Ray, which is not installed: {RAY_INSTALL}") from None
    return ray


def use_ray(backend: str | None) -> bool:
    """Whether a group of workers with ``backend`` runs as Ray actors.

    ``"ray"``: yes, on the cluster ``ray.init`` connected to; ``"process"``: no; None: yes when
    this process has already initialised Ray (never importing Ray to find out).

    Raises:
        ConfigError: ``backend="ray"`` without Ray installed, or before ``ray.init``.
    """
    if backend == "process":
        return False
    if backend is None:
        ray = sys.modules.get("ray")
        return ray is not None and bool(ray.is_initialized())
    if backend != "ray":
        raise ConfigError(f"backend must be 'ray', 'process' or None, got {backend!r}")
    ray = import_ray()
    if not ray.is_initialized():
        raise ConfigError(
            "backend='ray' needs a Ray cluster to run on: call ray.init(address=...) first "
            "(ray.init() starts one on this machine), or use backend='process'"
        )
    return True
