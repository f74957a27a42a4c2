"""Helpers for the per-component config dataclasses.

Each component has one ``@dataclass`` config whose fields carry their documentation in
``metadata["help"]`` (written with :func:`option`). That text is the CLI help and the TOML
reference at once, so there is one place to document a field.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from typing import Any, TypeVar

from rlserve.errors import ConfigError

T = TypeVar("T")

TOKEN_ENV = "RLSERVE_TOKEN"
"""Environment variable the server and the client read the token from (when not given)."""


def option(default: Any, help: str) -> Any:
    """Declare a config field with its default and its documentation."""
    if isinstance(default, list | dict | set):
        return dataclasses.field(
            default_factory=lambda: type(default)(default), metadata={"help": help}
        )
    return dataclasses.field(default=default, metadata={"help": help})


def _base_type(tp: Any) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _base_type(args[0])
    return tp


def add_arguments(parser: argparse.ArgumentParser, cls: type, prefix: str = "") -> None:
    """Add one ``--flag`` per field of the dataclass ``cls``; defaults stay None (unset)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        flag = "--" + (prefix + f.name).replace("_", "-")
        tp = _base_type(hints[f.name])
        help_text = f"{f.metadata.get('help', '')} (default: {_default_of(f)})"
        if tp is bool:
            parser.add_argument(
                flag, dest=prefix + f.name, action=argparse.BooleanOptionalAction, help=help_text
            )
        elif typing.get_origin(tp) is tuple:
            item = typing.get_args(tp)[0]
            parser.add_argument(flag, dest=prefix + f.name, type=item, nargs="+", help=help_text)
        else:
            parser.add_argument(flag, dest=prefix + f.name, type=tp, help=help_text)


def _default_of(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return "required"


def build(
    cls: type[T], table: dict[str, Any] | None, args: argparse.Namespace | None, prefix: str = ""
) -> T:
    """Build ``cls`` from a TOML table, then apply the flags that were given on the command line.

    Raises:
        ConfigError: The table names a field ``cls`` does not have, or a value has the wrong type.
    """
    values: dict[str, Any] = {}
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    for key, value in (table or {}).items():
        if key not in names:
            raise ConfigError(
                f"unknown option '{key}' for {cls.__name__}; known options: "
                f"{', '.join(sorted(names))}"
            )
        values[key] = tuple(value) if isinstance(value, list) else value
    if args is not None:
        for name in names:
            value = getattr(args, prefix + name, None)
            if value is not None:
                values[name] = tuple(value) if isinstance(value, list) else value
    try:
        return cls(**values)
    except TypeError as exc:
        raise ConfigError(f"invalid {cls.__name__}: {exc}") from exc


def to_table(config: Any) -> dict[str, Any]:
    """A config dataclass as a TOML-ready table (tuples become lists, None is left out)."""
    table = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if value is None:
            continue
        table[f.name] = list(value) if isinstance(value, tuple) else value
    return table
