"""ObservationCheck: check_value's result and its errors, word for word, with a cached fast path."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from gymnasium import spaces

from rlserve.client.observation_check import ObservationCheck
from rlserve.errors import SpaceError
from rlserve.experience.agent_values import plain_value
from rlserve.protocol.spaces import check_value

BOX = spaces.Box(
    np.array([-1.0, -np.inf], np.float32), np.array([1.0, np.inf], np.float32), (2,), np.float32
)
PIXELS = spaces.Box(0, 200, (2, 3), np.uint8)
BIG = spaces.Box(-1.0, 1.0, (200, 100), np.float32)  # past the bytes-compared size
WIDE = spaces.Box(-1.0, 1.0, (2,), np.float64)


def _error(fn: Any, *args: Any) -> str:
    with pytest.raises(SpaceError) as caught:
        fn(*args)
    return str(caught.value)


def _reference(space: spaces.Space[Any], value: Any) -> Any:
    return plain_value(check_value(space, value, "observation"))


@pytest.mark.parametrize(
    ("space", "value"),
    [
        (BOX, np.array([0.5, 1e30], np.float32)),
        (PIXELS, np.full((2, 3), 200, np.uint8)),
        (BIG, np.zeros((200, 100), np.float32)),
        (WIDE, np.array([0.5, -0.5])),
    ],
)
def test_a_valid_array_of_the_spaces_own_form_is_sent_as_it_is(
    space: spaces.Box, value: np.ndarray
) -> None:
    got = ObservationCheck(space, True)(value)
    assert got is value
    assert got is _reference(space, value)


@pytest.mark.parametrize(
    "value",
    [
        [0.5, 0.25],  # a list: cast
        np.array([0.5, 0.25]),  # float64 for a float32 space: cast
        np.array([0, 1], np.int64),
        np.array([0.5, 0.25], np.dtype(">f4")),  # the same dtype in the other byte order
    ],
)
def test_other_forms_are_cast_as_check_value_does(value: Any) -> None:
    got = ObservationCheck(BOX, True)(value)
    want = _reference(BOX, value)
    assert type(got) is np.ndarray and got.dtype == want.dtype == np.float32
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    ("space", "value"),
    [
        (BOX, np.zeros(3, np.float32)),  # wrong shape
        (BOX, np.zeros((1, 2), np.float32)),
        (BOX, np.array([0.0, np.nan], np.float32)),
        (BOX, np.array([np.inf, 0.0], np.float32)),
        (BOX, np.array([0.0, -np.inf], np.float32)),
        (BOX, np.array([1.5, 0.0], np.float32)),  # above the high bound
        (BOX, np.array([-1.5, 0.0], np.float32)),  # below the low bound
        (BOX, np.array(["a", "b"])),  # wrong dtype
        (BOX, np.array([1e39, 0.0])),  # float64 that overflows float32
        (BOX, None),
        (PIXELS, np.full((2, 3), 201, np.uint8)),
        (PIXELS, np.full((3, 2), 1, np.uint8)),
        (PIXELS, np.full((2, 3), 1.5, np.float32)),
        (BIG, np.full((200, 100), 2.0, np.float32)),
        (BIG, np.zeros((100, 200), np.float32)),
        (WIDE, np.array([2.0, 0.0])),
        (WIDE, np.array([1e39, 0.0])),
    ],
)
def test_a_bad_observation_gives_check_values_error(space: spaces.Space[Any], value: Any) -> None:
    check = ObservationCheck(space, True)
    for _ in range(2):  # the second time with everything cached
        assert _error(check, value) == _error(check_value, space, value, "observation")


def test_one_bad_value_in_a_large_array_is_found() -> None:
    check = ObservationCheck(BIG, True)
    value = np.zeros((200, 100), np.float32)
    value[199, 99] = np.nan
    assert "index (199, 99)" in _error(check, value)


@pytest.mark.parametrize(
    ("space", "value"),
    [
        (spaces.Discrete(3), 2),
        (spaces.Discrete(3), np.int64(1)),
        (spaces.Dict({"a": BOX}), {"a": [0.0, 0.0]}),
        (spaces.Tuple((spaces.Discrete(2), BOX)), (1, [0.0, 0.0])),
    ],
)
def test_other_spaces_take_check_value(space: spaces.Space[Any], value: Any) -> None:
    got = ObservationCheck(space, True)(value)
    want = _reference(space, value)
    assert type(got) is type(want)
    assert str(got) == str(want)  # lists of arrays compare element-wise, their text does not


@pytest.mark.parametrize(
    ("space", "value"), [(spaces.Discrete(3), 7), (spaces.Dict({"a": BOX}), {"b": 1})]
)
def test_other_spaces_refuse_as_check_value_does(space: spaces.Space[Any], value: Any) -> None:
    assert _error(ObservationCheck(space, True), value) == _error(
        check_value, space, value, "observation"
    )


@pytest.mark.parametrize(
    "value",
    [np.array([5.0, np.nan], np.float32), np.zeros(7), (1, (2, 3)), {"a": (1, 2)}, "text"],
)
def test_unchecked_values_are_only_made_plain(value: Any) -> None:
    got = ObservationCheck(BOX, False)(value)
    if isinstance(value, np.ndarray):
        assert got is value
    else:
        assert got == plain_value(value)
