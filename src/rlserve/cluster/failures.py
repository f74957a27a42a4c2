"""Ray's errors about a lost actor, made one line that names the root error and its fix."""

from __future__ import annotations

import re

__all__ = ["actor_failure"]

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_ROOT = re.compile(r"^(?:[\w.]+\.)?(\w+(?:Error|Exception)): (.*)$")

_IMPORT_FIX = (
    "every node must be able to import what the runners run: install it on every node, or "
    "ray.init(runtime_env={'py_modules': [...]}) (Ray ships them)"
)


def actor_failure(exc: BaseException) -> str:
    """One line for Ray's error ``exc``: its first line, and the error at the root of it."""
    lines = [line.strip() for line in _ANSI.sub("", str(exc)).splitlines() if line.strip()]
    reason = f"{type(exc).__name__}: {lines[0] if lines else ''}"
    roots = [m for line in lines[1:] if (m := _ROOT.match(line))]
    if roots:
        name, text = roots[-1].groups()
        reason += f" ({name}: {text})"
        if name == "ModuleNotFoundError":
            reason += f"; {_IMPORT_FIX}"
    return reason
