"""The float32 range rule shared by remote calls and reports."""

from __future__ import annotations

import numpy as np
import pytest

from rlserve.errors import SpaceError
from rlserve.protocol.values import (
    FLOAT32_MAX,
    MAX_ABS_LOGP,
    MAX_ABS_REWARD,
    check_float32,
    check_reward,
    indices_within,
    within,
)


def test_values_in_range_come_back_as_float32() -> None:
    out = check_float32(np.array([1.0, -2.5, FLOAT32_MAX], np.float64), "obs")
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out[:2], [1.0, -2.5])


@pytest.mark.parametrize("bad", [1e39, -1e39, np.inf, np.nan], ids=str)
def test_a_value_infinite_once_cast_is_refused_with_value_index_and_range(bad: float) -> None:
    with pytest.raises(SpaceError) as info:
        check_float32(np.array([[0.0, 0.0], [0.0, bad]]), "report 'b'.obs")
    message = str(info.value)
    assert message.startswith("report 'b'.obs: value ")
    assert "at index (1, 1)" in message and repr(float(bad)) in message
    assert "float32" in message and "3.4028235e+38" in message
    assert info.value.code == "bad_value"


def test_a_bound_below_the_float32_range_applies() -> None:
    check_float32([MAX_ABS_LOGP, -MAX_ABS_LOGP], "logp", MAX_ABS_LOGP)
    with pytest.raises(SpaceError, match=r"logp: value -1e\+30 at index \(1,\).*-10000\.\.10000"):
        check_float32(np.array([0.0, -1e30]), "logp", MAX_ABS_LOGP)
    with pytest.raises(SpaceError, match=r"value 3e\+38 .*-1e\+09\.\.1e\+09"):
        check_float32(3e38, "rewards", MAX_ABS_REWARD)


def test_check_reward() -> None:
    assert check_reward(-MAX_ABS_REWARD, "r") == -MAX_ABS_REWARD
    for bad in (1e39, -3e38, MAX_ABS_REWARD * 2, float("nan")):
        with pytest.raises(SpaceError, match=r"r: reward .* is out of range"):
            check_reward(bad, "r")


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf, 2.0, -2.0], ids=str)
def test_within_finds_one_bad_float32_value_anywhere(bad: float) -> None:
    values = np.zeros((3, 4), np.float32)
    assert within(values, 1.0) and within(np.zeros(0, np.float32), 1.0)
    values[2, 1] = bad
    assert not within(values, 1.0)


def test_float32_input_is_checked_without_a_copy_and_big_endian_is_cast() -> None:
    values = np.array([1.0, -np.inf], np.float32)
    assert check_float32(values[:1], "obs").base is values
    with pytest.raises(SpaceError, match="at index \\(1,\\)"):
        check_float32(values, "obs")
    out = check_float32(np.array([1.5], ">f4"), "obs")
    assert out.dtype == np.dtype("<f4") and out[0] == 1.5


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint8, np.uint64])
def test_indices_within_checks_both_ends_in_every_integer_dtype(dtype: type) -> None:
    assert indices_within(np.array([0, 1, 2], dtype), 2)
    assert not indices_within(np.array([0, 3], dtype), 2)
    if np.dtype(dtype).kind == "i":
        assert not indices_within(np.array([1, -1], dtype), 2)
        assert not indices_within(np.array([np.iinfo(dtype).min], dtype), 2)
