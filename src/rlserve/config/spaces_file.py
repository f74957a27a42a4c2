"""Reading a ``--spaces-file``: a JSON object with ``observation_space`` and ``action_space``.

Every mistake a person makes writing one (a JSON typo, a misspelt key, a missing space) becomes
one :class:`~rlserve.errors.ConfigError` naming the file, the line where it can tell, the key,
and the fix; ``examples/spaces.json`` is a file to start from.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any

import gymnasium as gym

from rlserve.errors import ConfigError, RLServeError
from rlserve.protocol.spaces import from_description

SPACE_KEYS = ("observation_space", "action_space")
"""The keys of a spaces file, both required."""

KEYS_BY_TYPE: dict[str, tuple[str, ...]] = {
    "Box": ("type", "shape", "dtype", "low", "high"),
    "Discrete": ("type", "n", "start"),
    "MultiDiscrete": ("type", "nvec", "start", "dtype"),
    "MultiBinary": ("type", "n"),
    "Dict": ("type", "spaces"),
    "Tuple": ("type", "spaces"),
}
"""The keys each space description may have (``docs/protocol.md``, section 6.2)."""

EXAMPLE = "examples/spaces.json"
"""The shipped spaces file that error messages point to."""


def _suggest(key: str, known: tuple[str, ...] | list[str]) -> str:
    close = difflib.get_close_matches(key, known, n=1)
    return f"did you mean '{close[0]}'? " if close else ""


def _line_of(text: str, key: str) -> int | None:
    """The line of ``"key"`` in ``text`` when it occurs exactly once (else unknown)."""
    needle = json.dumps(key)
    if text.count(needle) != 1:
        return None
    return text[: text.index(needle)].count("\n") + 1


def _check_keys(desc: Any, where: str, found: list[tuple[str, str, str]]) -> None:
    """Collect ``(where, key, type)`` for each key a description of a known type cannot have."""
    if not isinstance(desc, dict):
        return
    known = KEYS_BY_TYPE.get(desc.get("type"))  # type: ignore[arg-type]
    if known is None:
        return  # an unknown or missing type: from_description says so
    for key in desc:
        if key not in known:
            found.append((where, str(key), desc["type"]))
    children = desc.get("spaces")
    if isinstance(children, dict):
        for name, child in children.items():
            _check_keys(child, f"{where}.spaces.{name}", found)
    elif isinstance(children, list):
        for i, child in enumerate(children):
            _check_keys(child, f"{where}.spaces[{i}]", found)


def load_spaces_file(path: str | Path) -> tuple[gym.Space[Any], gym.Space[Any]]:
    """The observation and action spaces a spaces file describes.

    Raises:
        ConfigError: The file cannot be read, is not JSON, lacks a space, has a key that is not
            part of the format, or a description is malformed; the message names the file (and
            the line and key where it can) and what to write instead.
    """
    name = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            f"--spaces-file {name}: no such file; copy {EXAMPLE} and edit it, or pass "
            "--spaces-from ENV"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--spaces-file {name}: cannot read it ({exc})") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{name}, line {exc.lineno} column {exc.colno}: not valid JSON: {exc.msg} (a comma "
            "after the last item, single quotes and comments are common causes; compare with "
            f"{EXAMPLE})"
        ) from None
    if not isinstance(raw, dict):
        raise ConfigError(
            f"{name}: must hold a JSON object with 'observation_space' and 'action_space', got "
            f"{type(raw).__name__}; see {EXAMPLE}"
        )
    for key in raw:
        if key not in SPACE_KEYS:
            line = _line_of(text, str(key))
            raise ConfigError(
                f"{name}{f', line {line}' if line else ''}: unknown key '{key}'; "
                f"{_suggest(str(key), SPACE_KEYS)}a spaces file has exactly "
                "'observation_space' and 'action_space'"
            )
    for key in SPACE_KEYS:
        if key not in raw:
            raise ConfigError(
                f"{name}: '{key}' is missing; a spaces file has 'observation_space' and "
                f"'action_space', each a space description (see {EXAMPLE} and docs/protocol.md, "
                "section 6.2)"
            )
    result = []
    for key in SPACE_KEYS:
        unknown: list[tuple[str, str, str]] = []
        _check_keys(raw[key], key, unknown)
        if unknown:
            where, bad, kind = unknown[0]
            known = KEYS_BY_TYPE[kind]
            line = _line_of(text, bad)
            raise ConfigError(
                f"{name}{f', line {line}' if line else ''}: {where} has the unknown key "
                f"'{bad}'; {_suggest(bad, known)}a {kind} space takes {', '.join(known)}"
            )
        try:
            result.append(from_description(raw[key]))
        except RLServeError as exc:
            raise ConfigError(
                f"{name}: {key}: {exc} (space descriptions: docs/protocol.md, section 6.2; "
                f"example: {EXAMPLE})"
            ) from None
    return result[0], result[1]
