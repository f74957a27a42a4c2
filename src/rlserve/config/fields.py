"""Helpers for the per-component config dataclasses.

Each component has one ``@dataclass`` config whose fields carry their documentation in
``metadata["help"]`` (written with :func:`option`). That text is the CLI help and the TOML
reference at once, so there is one place to document a field.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import re
import sys
import types
import typing
from collections.abc import Collection, Iterable
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

    A ``bool | None`` field whose default is None (automatic) is ``--x`` / ``--no-x``, shown
    with the default ``auto``.

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
        if tp is bool and default is None:
            default = "auto"  # --x / --no-x decide; unset leaves it to the field's rule
        help_text = f.metadata.get("help", "")
        if default is not None or "(default" not in help_text:  # its own words say it better
            help_text = f"{help_text} (default: {'unset' if default is None else default})"
        if tp is bool:
            action = parser.add_argument(
                flag, dest=prefix + f.name, action=argparse.BooleanOptionalAction, help=help_text
            )
        elif typing.get_origin(tp) is tuple:
            item = typing.get_args(tp)[0]
            if typing.get_origin(item) is tuple:  # a list of lists: each as 16,2,1
                item = _int_list
            action = parser.add_argument(
                flag, dest=prefix + f.name, type=item, nargs="+", help=help_text
            )
        else:
            action = parser.add_argument(flag, dest=prefix + f.name, type=tp, help=help_text)
        added.append(action)
    return added


def _int_list(text: str) -> tuple[int, ...]:
    """A flag's ``16,2,1`` as ``(16, 2, 1)`` (one inner list of a list-of-lists setting)."""
    try:
        return tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected whole numbers separated by commas, e.g. 16,2,1; got '{text}'"
        ) from None


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

    A settings class may name options it refuses with the fix (a class attribute
    ``REFUSED_OPTIONS``: option name to the message's second half), for options another
    algorithm has.

    Raises:
        ConfigError: A key is not a field, or a value has the wrong type (:attr:`ConfigError.key`
            names the key).
    """
    names = {f.name for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    refused: dict[str, str] = getattr(cls, "REFUSED_OPTIONS", {})
    for key, value in table.items():
        if key in refused:
            error = ConfigError(
                f"option '{key}' is not supported by {cls.__name__}: {refused[key]}"
            )
            error.key = key
            raise error
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


def flag_of(name: str, prefix: str = "") -> str:
    """The command-line flag of the field ``name`` (``--ppo-train-batch-size``)."""
    return "--" + (prefix + name).replace("_", "-")


def _mentioned(message: str, names: Iterable[str]) -> list[str]:
    """The field names ``message`` mentions as whole words (not as part of a flag)."""
    return [n for n in names if re.search(rf"(?<![\w-]){re.escape(n)}(?![\w-])", message)]


def with_flags(message: str, names: Iterable[str], prefix: str = "") -> str:
    """``message`` with each field of ``names`` it mentions spelt as its flag."""
    for name in _mentioned(message, names):
        message = re.sub(rf"(?<![\w-]){re.escape(name)}(?![\w-])", flag_of(name, prefix), message)
    return message


def _where(source: tuple[str, str], key: str) -> str:
    """``FILE, line N`` of ``key`` in the table ``source`` (``(file, table)``) names."""
    path, table = source
    try:
        line = line_of_key(Path(path).read_text(encoding="utf-8"), table, key)
    except (OSError, UnicodeDecodeError):
        line = None
    return f"{path}, line {line}" if line else path


def _one_of(
    cls: type, table: dict[str, Any], flags: dict[str, Any], prefix: str, source: Any
) -> None:
    """Apply ``cls.EXCLUSIVE``: of each group of settings, one at most is used.

    A flag wins over the table's setting of another member of its group (the file's is
    dropped); two flags of one group, or two keys of one table, are refused.
    """
    for group in getattr(cls, "EXCLUSIVE", ()):
        given = [n for n in group if n in flags]
        if len(given) > 1:
            raise ConfigError(
                f"{' and '.join(flag_of(n, prefix) for n in given)} are alternatives; pass one"
            )
        in_table = [n for n in group if n in table]
        if given:
            for name in in_table:
                if name not in given:
                    del table[name]
        elif len(in_table) > 1:
            where = f"{_where(source, in_table[1])}: [{source[1]}]" if source else "the table"
            raise ConfigError(
                f"{where} sets both {' and '.join(in_table)}, which are alternatives; keep one "
                f"(a {' or '.join(flag_of(n, prefix) for n in group)} flag replaces both)"
            )


def _located(
    exc: ConfigError,
    table: dict[str, Any],
    flags: dict[str, Any],
    names: Iterable[str],
    prefix: str,
    source: tuple[str, str] | None,
    cli: bool,
) -> ConfigError:
    """A value error of the dataclass, naming where its values came from.

    On the command line (``cli``), the fields it names that no table set are spelt as their
    flags (a flag set them, or one would change them). When a file's key is at fault, the file,
    line and key lead it.
    """
    message = str(exc)
    mentioned = _mentioned(message, names)
    spelt = [n for n in mentioned if n in flags or (cli and n not in table)]
    message = with_flags(message, spelt, prefix)
    from_file = [n for n in mentioned if n in table and n not in flags]
    if source is not None and from_file:
        key = from_file[0]
        written = json.dumps(table[key])
        message = f"{_where(source, key)}: [{source[1]}] {key} = {written}: {message}"
    error = ConfigError(message)
    error.key = from_file[0] if from_file else exc.key
    return error


def build(
    cls: type[T],
    table: dict[str, Any] | None,
    args: argparse.Namespace | None,
    prefix: str = "",
    source: tuple[str, str] | None = None,
) -> T:
    """Build ``cls`` from a TOML table, then apply the flags that were given on the command line.

    A flag wins over the table. Of the settings the dataclass lists as alternatives
    (``EXCLUSIVE``, e.g. ``spaces_from`` and ``spaces_file``), a flag also replaces the
    table's other one.

    Args:
        cls: The config dataclass.
        table: Its TOML table (None: none).
        args: The parsed command line (None: no flags).
        prefix: The prefix of its flags' names (``ppo_`` for ``--ppo-lr``).
        source: ``(file, table name)`` the table was read from, named in errors.

    Raises:
        ConfigError: The table names a field ``cls`` does not have, a value has the wrong type
            (:attr:`ConfigError.key` is the table's key at fault), or a value is invalid (the
            message names the file, line and key, or the flag, it came from).
    """
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    table = dict(table or {})
    check_table(cls, table)
    flags: dict[str, Any] = {}
    if args is not None:
        for name in names:
            value = getattr(args, prefix + name, None)
            if value is not None:
                flags[name] = tuple(value) if isinstance(value, list) else value
    _one_of(cls, table, flags, prefix, source)
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in table.items()}
    values.update(flags)
    try:
        return cls(**values)
    except TypeError as exc:
        raise ConfigError(f"invalid {cls.__name__}: {exc}") from exc
    except ConfigError as exc:
        raise _located(exc, table, flags, names, prefix, source, args is not None) from None


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
