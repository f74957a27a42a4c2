"""Helpers for the per-component config dataclasses.

Each component has one ``@dataclass`` config whose fields carry their documentation in
``metadata["help"]`` (written with :func:`option`). That text is the CLI help and the TOML
reference at once, so there is one place to document a field.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import re
import sys
import types
import typing
from collections.abc import Collection
from pathlib import Path
from typing import Any, TypeVar

from rlserve.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, as a package
    import tomli as tomllib

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


def add_arguments(
    parser: argparse.ArgumentParser,
    cls: type,
    prefix: str = "",
    defaults: dict[str, Any] | None = None,
    names: Collection[str] | None = None,
) -> list[argparse.Action]:
    """Add one ``--flag`` per field of the dataclass ``cls``; defaults stay None (unset).

    ``defaults`` are the values that apply to the command where they differ from the
    dataclass's own (shown in the help; the command applies them itself). ``names``: only
    these fields (default: all). Returns the flags' actions.
    """
    hints = typing.get_type_hints(cls)
    shown = defaults or {}
    added = []
    for f in dataclasses.fields(cls):
        if names is not None and f.name not in names:
            continue
        flag = "--" + (prefix + f.name).replace("_", "-")
        tp = _base_type(hints[f.name])
        default = shown[f.name] if f.name in shown else _default_of(f)
        help_text = f"{f.metadata.get('help', '')} (default: {default})"
        if tp is bool:
            action = parser.add_argument(
                flag, dest=prefix + f.name, action=argparse.BooleanOptionalAction, help=help_text
            )
        elif typing.get_origin(tp) is tuple:
            item = typing.get_args(tp)[0]
            action = parser.add_argument(
                flag, dest=prefix + f.name, type=item, nargs="+", help=help_text
            )
        else:
            action = parser.add_argument(flag, dest=prefix + f.name, type=tp, help=help_text)
        added.append(action)
    return added


def _default_of(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return "required"


_TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true or false"}


def _type_problem(tp: Any, value: Any) -> str | None:
    """What is wrong with ``value`` for a field of type ``tp`` (None when it fits)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(tp) if a is not type(None)]
        return _type_problem(options[0], value) if value is not None else None
    if origin is tuple:
        item = typing.get_args(tp)[0]
        if not isinstance(value, list | tuple):
            return f"must be a list of {_TYPE_NAMES.get(item, item)} values"
        for element in value:
            if _type_problem(item, element) is not None:
                return f"must be a list of {_TYPE_NAMES.get(item, item)} values, got {element!r}"
        return None
    if tp is bool:
        ok = isinstance(value, bool)
    elif tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif tp is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    elif tp is str:
        ok = isinstance(value, str)
    else:
        return None
    if ok:
        return None
    written = f"'{value}'" if isinstance(value, str) else repr(value)
    return f"must be {_TYPE_NAMES[tp]}, got {written}"


def check_table(cls: type, table: dict[str, Any]) -> None:
    """Check that every key of ``table`` is a field of ``cls`` and its value has the field's type.

    Raises:
        ConfigError: A key is not a field, or a value has the wrong type (:attr:`ConfigError.key`
            names the key).
    """
    names = {f.name for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    for key, value in table.items():
        if key not in names:
            close = difflib.get_close_matches(key, names, n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            error = ConfigError(
                f"unknown option '{key}' for {cls.__name__}; {hint}known options: "
                f"{', '.join(sorted(names))}"
            )
            error.key = key
            raise error
        problem = _type_problem(hints[key], value)
        if problem is not None:
            error = ConfigError(f"option '{key}' {problem}")
            error.key = key
            raise error


def build(
    cls: type[T], table: dict[str, Any] | None, args: argparse.Namespace | None, prefix: str = ""
) -> T:
    """Build ``cls`` from a TOML table, then apply the flags that were given on the command line.

    Raises:
        ConfigError: The table names a field ``cls`` does not have, or a value has the wrong type
            (:attr:`ConfigError.key` is the table's key at fault).
    """
    values: dict[str, Any] = {}
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    check_table(cls, table or {})
    for key, value in (table or {}).items():
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


CONFIG_TABLES = ("server", "ppo")
"""The tables a ``--config`` TOML file may have."""


def line_of_key(text: str, table: str, key: str) -> int | None:
    """The line where ``key`` is set inside ``[table]`` of a TOML text (None if not found).

    ``table`` is the header's dotted name (``policies.red.ppo``); ``key = ""`` finds the header.
    """
    current = None
    pattern = re.compile(rf"^\s*(?:{re.escape(key)}|\"{re.escape(key)}\")\s*=")
    for number, line in enumerate(text.splitlines(), start=1):
        header = re.match(r"^\s*\[\s*([^\]]+?)\s*\]", line)
        if header:
            current = header.group(1).strip('"')
            if current == table and key == "":
                return number
        elif current == table and pattern.match(line):
            return number
    return None


def load_config_file(
    path: str, classes: dict[str, type], free_tables: tuple[str, ...] = ()
) -> dict[str, dict[str, Any]]:
    """Read a ``--config`` TOML file and check its tables and keys against ``classes``.

    Args:
        path: The TOML file.
        classes: The config dataclass of each table a file may have (``server``, ``ppo``).
        free_tables: Further tables a file may have, whose keys the caller checks
            (``policies``, ``mapping``).

    Raises:
        ConfigError: The file cannot be read, is not TOML, has a table or key that is not an
            option, or a value of the wrong type; the message names the file, the line and the
            key, and what to write instead.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            f"--config {path}: no such file; copy examples/rlserve.toml and edit it"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--config {path}: cannot read it ({exc})") from None
    try:
        tables = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(
            f'{path}: not valid TOML: {exc} (strings need quotes, e.g. host = "0.0.0.0"; '
            "compare with examples/rlserve.toml)"
        ) from None
    known = ", ".join(f"[{name}]" for name in (*classes, *free_tables))
    for name, table in tables.items():
        if name in free_tables and isinstance(table, dict):
            continue
        if name not in classes and name not in free_tables:
            line = line_of_key(text, name, "")
            close = difflib.get_close_matches(name, [*classes, *free_tables], n=1)
            hint = f"did you mean [{close[0]}]? " if close else ""
            where = f"{path}, line {line}" if line else path
            raise ConfigError(f"{where}: unknown table [{name}]; {hint}the tables are {known}")
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: '{name}' must be a table ([{name}] with keys under it)")
        try:
            check_table(classes[name], table)
        except ConfigError as exc:
            key = getattr(exc, "key", None)
            if key is None:
                raise ConfigError(f"{path}, [{name}]: {exc}") from None
            line = line_of_key(text, name, key)
            where = f"{path}, line {line}" if line else path
            raise ConfigError(f"{where}: [{name}] {exc}") from None
    return tables
