"""A fragment's ``state_in`` (memory policies): whole-record and report forms, and bad values."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from rlserve.errors import DecodeError, SpaceError
from rlserve.protocol.codec import decode, encode
from rlserve.protocol.fragment import Fragment, read_report, report_wire
from rlserve.protocol.limits import Limits


def _fragment(state_in: np.ndarray | None) -> Fragment:
    steps = 2
    return Fragment(
        "e1",
        "agent0",
        "default",
        np.arange((steps + 1) * 3, dtype=np.float32).reshape(steps + 1, 3),
        np.arange(steps, dtype=np.int64),
        np.ones(steps, np.float32),
        np.full(steps, -0.5, np.float32),
        np.ones(steps, bool),
        np.zeros(steps, np.int64),
        terminated=False,
        truncated=False,
        state_in=state_in,
    )


STATE = np.array([0.25, -0.5, 1.5, 0.0], dtype=np.float32)


def test_state_in_round_trips_in_both_forms() -> None:
    fragment = _fragment(STATE)
    back = Fragment.from_wire(decode(encode(fragment.to_wire())))
    assert back.state_in is not None and back.state_in.dtype == np.float32
    assert np.array_equal(back.state_in, STATE)
    read = read_report(decode(encode(report_wire(fragment))), Limits(), "r")
    assert read.state_in is not None and np.array_equal(read.state_in, STATE)


def test_without_memory_the_key_is_absent_and_reads_back_as_none() -> None:
    fragment = _fragment(None)
    assert "state_in" not in fragment.to_wire() and "state_in" not in report_wire(fragment)
    assert Fragment.from_wire(decode(encode(fragment.to_wire()))).state_in is None
    assert read_report(decode(encode(report_wire(fragment))), Limits(), "r").state_in is None


BAD: list[tuple[Any, str]] = [
    (np.zeros((2, 2), np.float32), "1-D array of numbers"),
    (np.float32(1.0), "1-D array of numbers"),
    ("abc", "1-D array of numbers"),
    ([1.0, "x"], "1-D array of numbers"),
    ({"h": 1}, "1-D array of numbers"),
    (np.array([0.0, np.nan], np.float32), "not finite"),
    (np.array([np.inf], np.float64), "not finite"),
]


@pytest.mark.parametrize(("value", "match"), BAD)
def test_a_bad_state_in_is_refused_in_the_report(value: Any, match: str) -> None:
    wire = report_wire(_fragment(None))
    wire["state_in"] = value
    with pytest.raises(SpaceError, match=f"r: 'state_in'.*{match}"):
        read_report(decode(encode(wire)), Limits(), "r")


@pytest.mark.parametrize(("value", "match"), BAD)
def test_a_bad_state_in_is_refused_in_the_record(value: Any, match: str) -> None:
    wire = _fragment(None).to_wire()
    wire["state_in"] = value
    with pytest.raises(DecodeError, match=f"fragment 'state_in'.*{match}"):
        Fragment.from_wire(decode(encode(wire)))


def test_integers_are_read_as_float32() -> None:
    wire = report_wire(_fragment(None))
    wire["state_in"] = [0, 1, 2]
    read = read_report(decode(encode(wire)), Limits(), "r")
    assert read.state_in is not None and read.state_in.dtype == np.float32
