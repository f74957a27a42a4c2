"""The float32 range rule shared by remote calls and reports."""

from __future__ import annotations

import numpy as np
import pytest

from rlserve.errors import SpaceError
from rlserve.values import FLOAT32_MAX, MAX_ABS_LOGP, MAX_ABS_REWARD, check_float32, check_reward


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
