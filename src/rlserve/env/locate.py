"""Find the env a command line names: a registered id, or ``module:Name``.

``module`` is a dotted module name (importable from the current folder or ``PYTHONPATH``) or a
path to a ``.py`` file, e.g. ``examples/corridor.py:SimpleCorridor``. ``Name`` is an attribute
of the module (a class, a creator or an instance), or an id the module registers with gymnasium
when imported (gymnasium's own ``module:Id`` form).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import gymnasium as gym

from rlserve.errors import ConfigError

__all__ = ["locate_env"]

EXAMPLE = "examples/corridor.py:SimpleCorridor"


def locate_env(text: str) -> Any:
    """The env ``text`` names: the id itself, or the attribute ``Name`` of ``module:Name``.

    Raises:
        ConfigError: The module cannot be found or imported, or has no such attribute.
    """
    if ":" not in text:
        return text
    module_name, _, attribute = text.rpartition(":")
    if not module_name or not attribute:
        raise ConfigError(f"{text!r}: write ENV as an id or as module:Name, e.g. {EXAMPLE}")
    module = _import(module_name)
    if hasattr(module, attribute):
        return getattr(module, attribute)
    if attribute in gym.registry:
        return attribute
    raise ConfigError(
        f"{module_name} has no attribute {attribute!r} and registers no gymnasium id of that "
        f"name: name the env class or creator defined there, e.g. {EXAMPLE}"
    )


def _import(module_name: str) -> ModuleType:
    if module_name.endswith(".py") or "/" in module_name or os.sep in module_name:
        return _import_file(Path(module_name))
    # As `python -m` does, so a module of the project the command runs in is found.
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise ConfigError(
                f"no module named {module_name!r}: run from the folder that holds it, add it to "
                f"PYTHONPATH, or give a file path, e.g. {EXAMPLE}"
            ) from None
        raise ConfigError(f"importing {module_name} failed: {exc}") from None
    except Exception as exc:
        raise ConfigError(f"importing {module_name} raised {type(exc).__name__}: {exc}") from None


def _import_file(path: Path) -> ModuleType:
    if not path.is_file():
        raise ConfigError(
            f"{path}: no such file; give the path of a .py file (e.g. {EXAMPLE}) or a module name"
        )
    name = f"_rlserve_env_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"{path}: not a Python file; give the path of a .py file")
    module = importlib.util.module_from_spec(spec)
    # Registered before running, as an import does, so dataclasses and pickling find it; the
    # file's folder goes on the path, as `python FILE` does, so it imports its neighbours.
    sys.modules[name] = module
    folder = str(path.resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise ConfigError(f"importing {path} raised {type(exc).__name__}: {exc}") from None
    return module
