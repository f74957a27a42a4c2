"""The fast path of the common step calls builds what the general parser builds, or steps aside.

:func:`rlserve.protocol.messages.parse_request` reads a single-episode ``get_action`` or
``log_returns`` inline; anything it does not take goes to :func:`parse_general`, which words
every error. Over a grid of valid and invalid fields, both must agree: the same record, or the
same error.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

from rlserve.errors import RLServeError
from rlserve.protocol import messages
from rlserve.protocol.limits import DEFAULT_LIMITS, Limits
from rlserve.protocol.messages import MAX_SEQ, parse_general, parse_request

ABSENT = object()

IDS = [ABSENT, None, 0, 7, -1, True, 1.5, "7"]
EPISODE_IDS = [ABSENT, None, "ep-1", "", "x" * 300, 5]
REWARDS = [ABSENT, None, 1.0, -0.5, 1, True, float("nan"), float("inf"), 1e10, -1e9, "1"]
SEQS = [ABSENT, None, 1, 0, MAX_SEQ, MAX_SEQ + 1, True, 2.0, "3"]
INFOS = [ABSENT, None, {}, {"k": 1}, [1]]
OBSERVATIONS = [ABSENT, None, np.zeros(4, dtype=np.float32), [0.0, 0.0, 0.0, 0.0]]


def _message(kind: str, fields: dict[str, Any]) -> dict[str, Any]:
    raw: dict[str, Any] = {"type": kind}
    raw.update({name: value for name, value in fields.items() if value is not ABSENT})
    return raw


def _outcome(parse: Any, raw: dict[str, Any], limits: Limits) -> tuple[str, Any]:
    try:
        request = parse(raw, limits)
    except RLServeError as exc:
        return "error", (type(exc), str(exc))
    return "request", request


def _same(fast: tuple[str, Any], general: tuple[str, Any]) -> bool:
    if fast[0] != general[0]:
        return False
    if fast[0] == "error":
        return bool(fast[1] == general[1])
    a, b = fast[1], general[1]
    if type(a) is not type(b):
        return False
    for name in a.__slots__:
        x, y = getattr(a, name), getattr(b, name)
        if isinstance(x, list) and x and isinstance(x[0], np.ndarray):
            if not all(np.array_equal(p, q) for p, q in zip(x, y, strict=True)):
                return False
        elif x != y:
            return False
    return True


@pytest.mark.parametrize("kind", ["get_action", "log_returns"])
def test_the_fast_path_agrees_with_the_general_parser(kind: str) -> None:
    short = Limits(max_id_length=DEFAULT_LIMITS.max_id_length)
    grid = itertools.product(IDS, EPISODE_IDS, REWARDS, SEQS)
    checked = 0
    for request_id, episode_id, reward, seq in grid:
        for extra in ({"info": i} for i in INFOS):
            fields = {"id": request_id, "episode_id": episode_id, "reward": reward, "seq": seq}
            fields.update(extra)
            if kind == "get_action":
                fields["observation"] = OBSERVATIONS[2]
            raw = _message(kind, fields)
            fast = _outcome(parse_request, raw, short)
            general = _outcome(parse_general, raw, short)
            assert _same(fast, general), (raw, fast, general)
            checked += 1
    assert checked == len(IDS) * len(EPISODE_IDS) * len(REWARDS) * len(SEQS) * len(INFOS)


@pytest.mark.parametrize("observation", OBSERVATIONS)
def test_a_get_action_observation_is_passed_as_sent(observation: Any) -> None:
    raw = _message("get_action", {"id": 1, "episode_id": "e", "observation": observation})
    fast = _outcome(parse_request, raw, DEFAULT_LIMITS)
    general = _outcome(parse_general, raw, DEFAULT_LIMITS)
    assert _same(fast, general), (raw, fast, general)


def test_an_unknown_field_is_left_to_the_general_parser() -> None:
    raw = {"type": "get_action", "id": 1, "episode_id": "e", "observation": [0.0], "extra": 1}
    assert messages._lean_step(raw, "get_action", DEFAULT_LIMITS.max_id_length) is None
    assert _same(
        _outcome(parse_request, raw, DEFAULT_LIMITS), _outcome(parse_general, raw, DEFAULT_LIMITS)
    )


def test_a_remote_clients_step_takes_the_fast_path() -> None:
    """What PolicyClient sends on every step is read inline (else the fast path is dead code)."""
    obs = np.zeros(4, dtype=np.float32)
    step = {"type": "get_action", "id": 9, "episode_id": "e", "observation": obs, "reward": 1.0}
    lean = messages._lean_step({**step, "seq": 4}, "get_action", 64)
    assert lean is not None and lean.seqs == [4] and lean.rewards == [1.0]
    returns = {"type": "log_returns", "id": 10, "episode_id": "e", "reward": 0.5, "seq": 5}
    assert messages._lean_step(returns, "log_returns", 64) is not None
