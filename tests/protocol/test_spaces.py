"""Unit tests of space descriptions and value checks."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from gymnasium import spaces

from rlserve.errors import SpaceError, UnsupportedSpaceError
from rlserve.protocol.box_bounds import SMALL_BOX_VALUES
from rlserve.protocol.spaces import (
    MAX_SPACE_DEPTH,
    check_batch,
    check_one,
    check_value,
    describe,
    flat_dim,
    from_description,
)


def _round_trip(space: spaces.Space[Any]) -> spaces.Space[Any]:
    # Through real JSON, as a description travels.
    return from_description(json.loads(json.dumps(describe(space), allow_nan=False)))


# -- describe / from_description -------------------------------------------------------------

ROUND_TRIP_SPACES = {
    "box_bounded_uniform": spaces.Box(-1.0, 2.0, (3,), np.float32),
    "box_bounded_per_element": spaces.Box(
        np.array([-1.0, 0.0, -5.5], np.float32), np.array([1.0, 3.0, 0.5], np.float32)
    ),
    "box_unbounded": spaces.Box(-np.inf, np.inf, (2, 2), np.float32),
    "box_half_bounded": spaces.Box(
        np.array([0.0, -np.inf], np.float32), np.array([np.inf, 1.0], np.float32)
    ),
    "box_float64": spaces.Box(-3.0, 3.0, (2,), np.float64),
    "box_int": spaces.Box(0, 10, (4,), np.int64),
    "box_int32_unbounded": spaces.Box(-np.inf, np.inf, (2,), np.int32),
    "box_uint8_image": spaces.Box(0, 255, (4, 4, 3), np.uint8),
    "box_scalar": spaces.Box(-1.0, 1.0, (), np.float32),
    "discrete": spaces.Discrete(4),
    "discrete_start": spaces.Discrete(3, start=-1),
    "multidiscrete": spaces.MultiDiscrete([3, 4, 2]),
    "multidiscrete_start": spaces.MultiDiscrete([3, 4], start=[1, -2]),
    "multidiscrete_2d": spaces.MultiDiscrete(np.array([[2, 3], [4, 5]])),
    "multibinary_list": spaces.MultiBinary([2, 3]),
    "dict": spaces.Dict({"pos": spaces.Box(-1, 1, (2,)), "mode": spaces.Discrete(3)}),
    "tuple": spaces.Tuple([spaces.Discrete(2), spaces.Box(0, 1, (1,))]),
    "nested": spaces.Dict(
        {
            "a": spaces.Tuple(
                [spaces.MultiBinary([4]), spaces.Dict({"z": spaces.Discrete(5, start=2)})]
            ),
            "b": spaces.Box(-np.inf, np.inf, (3,), np.float32),
        }
    ),
}


@pytest.mark.parametrize("name", sorted(ROUND_TRIP_SPACES))
def test_round_trip(name: str) -> None:
    space = ROUND_TRIP_SPACES[name]
    back = _round_trip(space)
    assert back == space
    assert type(back) is type(space)


def test_multibinary_int_round_trip() -> None:
    space = spaces.MultiBinary(5)
    assert _round_trip(space) == space


def test_box_int64_full_range_round_trip() -> None:
    # Gymnasium turns infinite int64 bounds into the int64 extremes; the description must keep
    # them (float64 cannot hold 2**63 - 1 exactly).
    space = spaces.Box(-np.inf, np.inf, (2,), np.int64)
    back = _round_trip(space)
    np.testing.assert_array_equal(back.low, space.low)
    np.testing.assert_array_equal(back.high, space.high)
    assert back == space


def test_box_description_fields() -> None:
    desc = describe(spaces.Box(-1.0, 2.0, (3,), np.float32))
    assert desc == {"type": "Box", "shape": [3], "dtype": "float32", "low": -1.0, "high": 2.0}


def test_box_unbounded_is_null() -> None:
    desc = describe(spaces.Box(-np.inf, np.inf, (2,), np.float32))
    assert desc["low"] is None
    assert desc["high"] is None
    json.dumps(desc, allow_nan=False)  # valid JSON: no Infinity


def test_box_per_element_bounds_are_lists_with_null_for_infinity() -> None:
    space = spaces.Box(np.array([0.0, -np.inf], np.float32), np.array([np.inf, 1.5], np.float32))
    desc = describe(space)
    assert desc["low"] == [0.0, None]
    assert desc["high"] == [None, 1.5]


def test_box_int_description() -> None:
    desc = describe(spaces.Box(0, 10, (2,), np.int64))
    assert desc == {"type": "Box", "shape": [2], "dtype": "int64", "low": 0, "high": 10}
    assert isinstance(desc["low"], int)


def test_box_description_defaults_to_float32_unbounded() -> None:
    space = from_description({"type": "Box", "shape": [2]})
    assert space == spaces.Box(-np.inf, np.inf, (2,), np.float32)


def test_discrete_description() -> None:
    assert describe(spaces.Discrete(3, start=2)) == {"type": "Discrete", "n": 3, "start": 2}
    assert from_description({"type": "Discrete", "n": 3}) == spaces.Discrete(3)


def test_multidiscrete_description() -> None:
    desc = describe(spaces.MultiDiscrete([3, 4], start=[1, 0]))
    assert desc == {"type": "MultiDiscrete", "nvec": [3, 4], "start": [1, 0], "dtype": "int64"}


def test_dict_and_tuple_descriptions() -> None:
    desc = describe(spaces.Dict({"b": spaces.Discrete(2), "a": spaces.MultiBinary([1])}))
    assert desc == {
        "type": "Dict",
        "spaces": {
            "a": {"type": "MultiBinary", "n": [1]},
            "b": {"type": "Discrete", "n": 2, "start": 0},
        },
    }
    assert describe(spaces.Tuple([spaces.Discrete(2)])) == {
        "type": "Tuple",
        "spaces": [{"type": "Discrete", "n": 2, "start": 0}],
    }


def test_unsupported_space_cannot_be_described() -> None:
    with pytest.raises(UnsupportedSpaceError, match="Text"):
        describe(spaces.Text(5))


@pytest.mark.parametrize(
    "desc",
    [
        None,
        [],
        {"type": 3},
        {"n": 3},
        {"type": "Box"},
        {"type": "Box", "shape": [2], "low": [0.0]},
        {"type": "Box", "shape": [2], "low": "x"},
        {"type": "Box", "shape": [2], "dtype": "str"},
        {"type": "Box", "shape": [2], "dtype": "complex64"},
        {"type": "Box", "shape": [100_000, 100_000]},
        {"type": "Discrete"},
        {"type": "Discrete", "n": "x"},
        {"type": "MultiDiscrete", "nvec": "x"},
        {"type": "MultiBinary", "n": [100_000, 100_000]},
        {"type": "Dict", "spaces": [1]},
        {"type": "Tuple", "spaces": {"a": 1}},
        {"type": "Dict", "spaces": {"a": {"type": "Nope"}}},
    ],
    ids=repr,
)
def test_malformed_descriptions(desc: Any) -> None:
    with pytest.raises(SpaceError):
        from_description(desc)


@pytest.mark.parametrize(
    "desc",
    [
        {"type": "MultiBinary", "n": [4294967296, 4294967296]},  # 2**64: 0 in int64
        {"type": "MultiBinary", "n": [2**62, 4, 3]},
        {"type": "Box", "shape": [4294967296, 4294967296]},
        {"type": "Box", "shape": [2**40, 2**40, 2**40]},
    ],
    ids=repr,
)
def test_a_shape_whose_element_count_overflows_int64_is_over_the_limit(desc: Any) -> None:
    with pytest.raises(SpaceError, match=r"elements, over the limit of 4000000"):
        from_description(desc)


@pytest.mark.parametrize(
    "desc",
    [
        {"type": "MultiBinary", "n": [-2, -3]},
        {"type": "Box", "shape": [-2, -3]},
    ],
    ids=repr,
)
def test_a_negative_dimension_is_refused_even_when_the_product_is_positive(desc: Any) -> None:
    with pytest.raises(SpaceError, match="negative dimension"):
        from_description(desc)


@pytest.mark.parametrize(
    "desc",
    [{"type": "Discrete", "n": 2**70}, {"type": "MultiDiscrete", "nvec": [2**70]}],
    ids=repr,
)
def test_an_integer_beyond_int64_in_a_description_is_a_space_error(desc: Any) -> None:
    with pytest.raises(SpaceError, match="malformed"):
        from_description(desc)


def test_a_shape_at_the_element_limit_is_accepted() -> None:
    assert from_description({"type": "MultiBinary", "n": [2000, 2000]}).shape == (2000, 2000)


@pytest.mark.parametrize(
    "desc",
    [
        {"type": "Discrete", "n": 4_000_001},  # one-hot: as wide as its choices
        {"type": "MultiDiscrete", "nvec": [2_000_000, 2_000_001]},
        {
            "type": "Dict",
            "spaces": {
                "a": {"type": "MultiBinary", "n": [2000, 2000]},
                "b": {"type": "Tuple", "spaces": [{"type": "Box", "shape": [1]}]},
            },
        },
    ],
    ids=["discrete", "multi_discrete", "dict"],
)
def test_a_space_wider_than_the_limit_flattened_is_refused(desc: Any) -> None:
    with pytest.raises(SpaceError, match=r"4000001 values wide flattened.* limit of 4000000"):
        from_description(desc)


def test_a_space_at_the_width_limit_flattened_is_accepted() -> None:
    parts = [{"type": "Discrete", "n": 1_000_000}, {"type": "MultiBinary", "n": [1000, 3000]}]
    assert from_description({"type": "Tuple", "spaces": parts})[0].n == 1_000_000


def test_unknown_space_type() -> None:
    with pytest.raises(UnsupportedSpaceError, match="unknown space type 'Graph'"):
        from_description({"type": "Graph"})


def test_nesting_deeper_than_the_limit_is_refused() -> None:
    desc: dict[str, Any] = {"type": "Discrete", "n": 2}
    for _ in range(MAX_SPACE_DEPTH):
        desc = {"type": "Tuple", "spaces": [desc]}
    from_description(desc)  # exactly at the limit
    with pytest.raises(SpaceError, match="nested deeper"):
        from_description({"type": "Tuple", "spaces": [desc]})


# -- check_value -----------------------------------------------------------------------------

BOX = spaces.Box(-1.0, 1.0, (2,), np.float32)


def test_check_box_returns_array_of_space_dtype() -> None:
    out = check_value(BOX, [0.5, -1.0])
    assert isinstance(out, np.ndarray)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, [0.5, -1.0])


def test_check_box_accepts_ints_for_float_box() -> None:
    assert check_value(BOX, [1, 0]).dtype == np.float32


@pytest.mark.parametrize("value", [[0.5], [0.1, 0.2, 0.3], [[0.1, 0.2]], 0.5], ids=repr)
def test_box_wrong_shape(value: Any) -> None:
    with pytest.raises(SpaceError) as info:
        check_value(BOX, value, "observation")
    message = str(info.value)
    assert message.startswith("observation:")
    assert f"shape {np.shape(value)}" in message
    assert "expected shape (2,)" in message


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf], ids=str)
def test_box_non_finite(bad: float) -> None:
    space = spaces.Box(-np.inf, np.inf, (3,), np.float32)
    with pytest.raises(SpaceError, match=r"contains .* at index \(1,\);"):
        check_value(space, [0.0, bad, 0.0], "obs")


def test_box_below_and_above_bounds_name_value_and_bound() -> None:
    space = spaces.Box(np.array([-1.0, 0.0], np.float32), np.array([1.0, 2.0], np.float32))
    with pytest.raises(SpaceError, match=r"obs: value -0.5 at index \(1,\) is below .* 0.0"):
        check_value(space, [0.0, -0.5], "obs")
    with pytest.raises(SpaceError, match=r"value 1.5 at index \(0,\) is above .* 1.0"):
        check_value(space, [1.5, 0.5], "obs")


def test_box_bounds_are_inclusive() -> None:
    check_value(BOX, [-1.0, 1.0])


def test_half_bounded_box_checks_its_bounded_side() -> None:
    space = spaces.Box(np.array([0.0, -np.inf], np.float32), np.array([np.inf, 1.0], np.float32))
    check_value(space, [1e30, -1e30])
    with pytest.raises(SpaceError, match="below"):
        check_value(space, [-1.0, 0.0])
    with pytest.raises(SpaceError, match="above"):
        check_value(space, [0.0, 2.0])


def test_float_for_int_box_is_refused() -> None:
    space = spaces.Box(0, 10, (2,), np.int64)
    with pytest.raises(SpaceError, match=r"dtype float64 cannot stand for .*int64"):
        check_value(space, [1.0, 2.0], "obs")
    with pytest.raises(SpaceError, match="float32"):
        check_value(space, np.array([1, 2], np.float32))


def test_non_numeric_values_are_refused() -> None:
    with pytest.raises(SpaceError, match="expected numbers"):
        check_value(BOX, ["a", "b"])
    with pytest.raises(SpaceError):
        check_value(BOX, [[1.0], 2.0])  # ragged
    with pytest.raises(SpaceError):
        check_value(BOX, None)


def test_int_box_values_and_bounds() -> None:
    space = spaces.Box(0, 10, (2,), np.int64)
    out = check_value(space, [0, 10])
    assert out.dtype == np.int64
    with pytest.raises(SpaceError, match="above"):
        check_value(space, [0, 11])


def test_uint8_box_accepts_in_range_python_ints() -> None:
    # JSON (and plain Python lists) can only carry int64; in-range values must be accepted.
    space = spaces.Box(0, 255, (3,), np.uint8)
    out = check_value(space, [0, 17, 255])
    assert out.dtype == np.uint8
    np.testing.assert_array_equal(out, [0, 17, 255])


@pytest.mark.parametrize(
    ("space", "value"),
    [
        (spaces.Box(-100, 100, (1,), np.int8), [300]),  # wraps to 44, inside the bounds
        (spaces.Box(0, 255, (2,), np.uint8), np.array([300, 5], np.uint16)),  # wraps to 44
        (spaces.Box(-np.inf, np.inf, (1,), np.int32), [2**31]),  # wraps to -2**31
    ],
    ids=["int8", "uint8-from-uint16", "int32"],
)
def test_integer_values_out_of_dtype_range_are_refused_not_wrapped(
    space: spaces.Box, value: Any
) -> None:
    with pytest.raises(SpaceError):
        check_value(space, value, "obs")


def test_discrete() -> None:
    space = spaces.Discrete(3, start=2)
    assert check_value(space, 2) == 2
    assert check_value(space, np.int64(4)) == 4
    assert check_value(space, np.array(3)) == 3
    assert type(check_value(space, np.int32(3))) is int
    with pytest.raises(SpaceError, match=r"5 is outside .*valid values are 2..4"):
        check_value(space, 5, "action")
    with pytest.raises(SpaceError, match="outside"):
        check_value(space, 1)
    with pytest.raises(SpaceError, match=r"needs an integer, got 2\.0"):
        check_value(space, 2.0)
    with pytest.raises(SpaceError, match="needs an integer"):
        check_value(space, True)
    with pytest.raises(SpaceError, match="needs an integer"):
        check_value(space, "2")


def test_multidiscrete() -> None:
    space = spaces.MultiDiscrete([3, 2])
    np.testing.assert_array_equal(check_value(space, [2, 1]), [2, 1])
    with pytest.raises(SpaceError, match=r"\[3, 0\] is outside"):
        check_value(space, [3, 0])
    with pytest.raises(SpaceError, match="shape"):
        check_value(space, [1, 1, 1])
    with pytest.raises(SpaceError, match="cannot stand for"):
        check_value(space, [1.0, 1.0])


def test_multibinary() -> None:
    space = spaces.MultiBinary([3])
    np.testing.assert_array_equal(check_value(space, [1, 0, 1]), [1, 0, 1])
    np.testing.assert_array_equal(check_value(space, np.array([1, 0, 1], np.int8)), [1, 0, 1])
    with pytest.raises(SpaceError, match="outside"):
        check_value(space, np.array([2, 0, 1], np.int8))
    with pytest.raises(SpaceError, match="shape"):
        check_value(space, np.array([1, 0], np.int8))


DICT = spaces.Dict({"pos": spaces.Box(-1, 1, (2,), np.float32), "mode": spaces.Discrete(3)})


def test_dict_ok() -> None:
    out = check_value(DICT, {"pos": [0.0, 0.5], "mode": 2})
    assert out["mode"] == 2
    np.testing.assert_array_equal(out["pos"], [0.0, 0.5])


def test_dict_missing_key() -> None:
    with pytest.raises(SpaceError, match=r"obs: keys .* missing \['mode'\], unexpected \[\]"):
        check_value(DICT, {"pos": [0.0, 0.0]}, "obs")


def test_dict_extra_key() -> None:
    with pytest.raises(SpaceError, match=r"missing \[\], unexpected \['speed'\]"):
        check_value(DICT, {"pos": [0.0, 0.0], "mode": 1, "speed": 3}, "obs")


def test_dict_needs_a_map() -> None:
    with pytest.raises(SpaceError, match="needs a map, got list"):
        check_value(DICT, [[0.0, 0.0], 1])


def test_nested_error_names_the_path() -> None:
    space = spaces.Dict(
        {"arm": spaces.Tuple([spaces.Discrete(2), spaces.Box(0, 1, (2,), np.float32)])}
    )
    with pytest.raises(SpaceError, match=r"^obs\['arm'\]\[1\]: value 2.0 at index \(0,\) is"):
        check_value(space, {"arm": [1, [2.0, 0.0]]}, "obs")
    with pytest.raises(SpaceError, match=r"^obs\['arm'\]\[0\]: 7 is outside"):
        check_value(space, {"arm": (7, [0.0, 0.0])}, "obs")


def test_tuple() -> None:
    space = spaces.Tuple([spaces.Discrete(2), spaces.Box(0, 1, (1,), np.float32)])
    out = check_value(space, [1, [0.5]])
    assert isinstance(out, tuple)
    assert out[0] == 1
    with pytest.raises(SpaceError, match="needs a list of 2 values"):
        check_value(space, [1])
    with pytest.raises(SpaceError, match="needs a list of 2 values"):
        check_value(space, 1)


def test_unsupported_space_value() -> None:
    with pytest.raises(UnsupportedSpaceError):
        check_value(spaces.Text(4), "abcd")


# -- check_batch -----------------------------------------------------------------------------


def test_check_batch_box() -> None:
    space = spaces.Box(-1, 1, (2, 2), np.float32)
    values = np.zeros((3, 2, 2), np.float64)
    out = check_batch(space, values, 3, "observations")
    assert out.shape == (3, 4)
    assert out.dtype == np.float32


def test_check_batch_box_wrong_count() -> None:
    with pytest.raises(SpaceError, match="observations: 2 values for 3 episodes"):
        check_batch(BOX, np.zeros((2, 2)), 3, "observations")


def test_check_batch_box_wrong_shape() -> None:
    two = r"^observations: a batch of 2 observations of shape \(2,\) must have shape \(2, 2\)"
    with pytest.raises(SpaceError, match=two + r", got \(2, 3\)$"):
        check_batch(BOX, np.zeros((2, 3)), 2, "observations")
    one = r"a batch of 1 observation of shape \(2,\) must have shape \(1, 2\), got \(\)$"
    with pytest.raises(SpaceError, match=one):
        check_batch(BOX, 0.5, 1, "observations")


def test_check_batch_scalar_box_with_a_scalar_instead_of_a_batch() -> None:
    space = spaces.Box(-1, 1, (), np.float32)
    assert check_batch(space, [0.5], 1, "obs").shape == (1, 1)
    with pytest.raises(SpaceError):
        check_batch(space, np.float32(0.5), 1, "obs")


def test_check_batch_box_nan_names_the_row() -> None:
    values = np.zeros((3, 2), np.float32)
    values[2, 1] = np.nan
    with pytest.raises(SpaceError, match=r"at index \(2, 1\)"):
        check_batch(BOX, values, 3, "observations")


def test_check_batch_box_out_of_bounds_names_the_row() -> None:
    values = np.zeros((3, 2), np.float32)
    values[1, 0] = -3.0
    with pytest.raises(SpaceError, match=r"value -3.0 at index \(1, 0\) is below"):
        check_batch(BOX, values, 3, "observations")


def test_check_batch_int_box_refuses_floats() -> None:
    space = spaces.Box(0, 10, (2,), np.int64)
    with pytest.raises(SpaceError, match="cannot stand for"):
        check_batch(space, [[1.5, 2.0]], 1, "observations")


def test_check_batch_dict_flattens() -> None:
    values = [{"pos": [0.5, -0.5], "mode": 1}, {"pos": [0.0, 1.0], "mode": 0}]
    out = check_batch(DICT, values, 2, "observations")
    assert out.shape == (2, flat_dim(DICT))
    assert out.dtype == np.float32
    # Gymnasium flattens Dict keys in sorted order: one-hot 'mode' then 'pos'.
    np.testing.assert_array_equal(out[0], [0, 1, 0, 0.5, -0.5])
    np.testing.assert_array_equal(out[1], [1, 0, 0, 0.0, 1.0])


def test_check_batch_dict_errors() -> None:
    with pytest.raises(SpaceError, match="expected a list of 2 values"):
        check_batch(DICT, [{"pos": [0, 0], "mode": 1}], 2, "observations")
    with pytest.raises(SpaceError, match=r"observations\[1\]: keys"):
        check_batch(DICT, [{"pos": [0, 0], "mode": 1}, {"pos": [0, 0]}], 2, "observations")


def test_check_batch_discrete_one_hot() -> None:
    out = check_batch(spaces.Discrete(3), [2, 0], 2, "obs")
    np.testing.assert_array_equal(out, [[0, 0, 1], [1, 0, 0]])


def test_flat_dim() -> None:
    assert flat_dim(spaces.Box(0, 1, (2, 3))) == 6
    assert flat_dim(spaces.Discrete(4)) == 4
    assert flat_dim(DICT) == 5


def test_discrete_refuses_an_array_of_several_values() -> None:
    with pytest.raises(SpaceError, match=r"action: Discrete\(2\) needs one integer, got an array"):
        check_value(spaces.Discrete(2), np.array([0, 1, 1]), "action")
    assert check_value(spaces.Discrete(2), np.array([1])) == 1


def test_a_float64_value_that_overflows_float32_is_refused_after_the_cast() -> None:
    space = spaces.Box(-np.inf, np.inf, (2,), np.float64)
    with pytest.raises(SpaceError, match=r"obs: value 1e\+39 at index \(0, 1\).*float32"):
        check_batch(space, np.array([[0.0, 1e39]]), 1, "obs")
    nested = spaces.Dict({"x": space})
    with pytest.raises(SpaceError, match=r"float32"):
        check_batch(nested, [{"x": np.array([-1e39, 0.0])}], 1, "obs")
    assert check_batch(space, np.array([[0.0, 1e38]]), 1, "obs").dtype == np.float32


# -- one observation: errors in the sender's terms --------------------------------------------

CARTPOLE = spaces.Box(
    np.array([-4.8, -np.inf, -0.41887903, -np.inf], np.float32),
    np.array([4.8, np.inf, 0.41887903, np.inf], np.float32),
)


def test_check_one_returns_a_flat_float32_row() -> None:
    out = check_one(CARTPOLE, [0.5, 1, 0.25, -2], "observation")
    assert out.dtype == np.float32 and out.shape == (1, 4)
    dict_space = spaces.Dict({"a": spaces.Discrete(3), "b": spaces.Box(0, 1, (2,), np.float32)})
    assert check_one(dict_space, {"a": 1, "b": [0.5, 1.0]}, "obs").shape == (1, 5)


@pytest.mark.parametrize("sent", [np.zeros(3), np.zeros((1, 4)), np.zeros((2, 4))], ids=str)
def test_check_one_wrong_shape_names_the_shape_sent_and_the_space_shape(sent: Any) -> None:
    with pytest.raises(SpaceError) as caught:
        check_one(CARTPOLE, sent, "observation")
    assert str(caught.value) == (
        f"observation: shape {sent.shape} does not fit {CARTPOLE}; expected shape (4,)"
    )


@pytest.mark.parametrize(
    ("sent", "message"),
    [
        (
            [0.0, 0.0, 9.0, 0.0],
            "observation: value 9.0 at index (2,) is above the space's high bound 0.41887903; "
            "clip it or widen the space",
        ),
        (
            np.array([-5.0, 0.0, 0.0, 0.0], np.float32),
            "observation: value -5.0 at index (0,) is below the space's low bound -4.8; "
            "clip it or widen the space",
        ),
        (
            np.array([0.0, np.nan, 0.0, 0.0], np.float32),
            "observation: contains nan at index (1,); values must be finite in float32 (the "
            "server stores float32: |x| <= 3.4028235e+38)",
        ),
        (
            np.array([0.0, 0.0, 0.0, 1e39]),
            "observation: value 1e+39 at index (3,) is out of range; it is stored as float32 "
            "and must be finite float32 values (-3.4028235e+38..3.4028235e+38)",
        ),
    ],
    ids=["above", "below", "nan", "float64-overflow"],
)
def test_check_one_indexes_into_the_observation_sent(sent: Any, message: str) -> None:
    """A 1-D observation gets a 1-D index (not one into a batch of one)."""
    with pytest.raises(SpaceError) as caught:
        check_one(CARTPOLE, sent, "observation")
    assert str(caught.value) == message


def test_check_one_of_a_scalar_box_names_no_index() -> None:
    with pytest.raises(SpaceError) as caught:
        check_one(spaces.Box(-1, 1, (), np.float32), 2.0, "observation")
    assert str(caught.value) == (
        "observation: value 2.0 is above the space's high bound 1.0; clip it or widen the space"
    )


LEAN_CHECK_SPACES = {
    "cartpole": CARTPOLE,
    "scalar": spaces.Box(-1.0, 1.0, (), np.float32),
    "matrix": spaces.Box(-2.0, 3.0, (3, 5), np.float32),
    "at_the_small_limit": spaces.Box(-1.0, 1.0, (SMALL_BOX_VALUES,), np.float32),
    "past_the_small_limit": spaces.Box(
        np.array([-np.inf] * 40 + [0.0] * 40, np.float32),
        np.array([1.0] * 40 + [np.inf] * 40, np.float32),
    ),
    "empty": spaces.Box(0.0, 1.0, (0,), np.float32),
}


def _reference_check(space: spaces.Box, value: np.ndarray) -> np.ndarray:
    """check_one without its fast path: the full check, as check_one ends."""
    return check_value(space, value, "observation").reshape(1, -1)


@pytest.mark.parametrize("name", sorted(LEAN_CHECK_SPACES))
def test_check_one_fast_path_agrees_with_the_full_check(name: str) -> None:
    """Values at, inside, just past and far past the bounds, NaN and infinities: check_one gives
    the full check's row or its error, word for word, small Box (Python floats) or large."""
    space = LEAN_CHECK_SPACES[name]
    low, high = space.low.reshape(-1), space.high.reshape(-1)
    big = np.finfo(np.float32).max
    candidates = np.concatenate(
        [low, high, np.nextafter(low, -np.inf), np.nextafter(high, np.inf)]
    ).astype(np.float32)
    specials = np.array([np.nan, np.inf, -np.inf, big, -big, 0.0, 0.5, -0.5], np.float32)
    pool = np.concatenate([candidates, specials])
    rng = np.random.default_rng(7)
    for trial in range(300):
        inside = rng.uniform(np.maximum(low, -1e3), np.minimum(high, 1e3)).astype(np.float32)
        value = inside.copy()
        swaps = rng.integers(0, 3) if trial % 3 else 0
        for _ in range(swaps if value.size else 0):
            value[rng.integers(value.size)] = rng.choice(pool)
        value = value.reshape(space.shape)
        try:
            expected: np.ndarray | str = _reference_check(space, value)
        except SpaceError as exc:
            expected = str(exc)
        try:
            got: np.ndarray | str = check_one(space, value, "observation")
        except SpaceError as exc:
            got = str(exc)
        if isinstance(expected, str):
            assert got == expected, (name, value)
        else:
            assert isinstance(got, np.ndarray), (name, value, got)
            assert got.dtype == np.float32 and got.shape == expected.shape
            np.testing.assert_array_equal(got, expected)


def test_check_batch_indexes_into_the_batch_sent() -> None:
    batch = np.zeros((3, 4), np.float32)
    batch[2, 1] = np.inf
    with pytest.raises(SpaceError, match=r"^observations: contains inf at index \(2, 1\);"):
        check_batch(CARTPOLE, batch, 3, "observations")


def test_a_float64_value_over_float32_in_a_nested_box_names_its_path_and_index() -> None:
    space = spaces.Dict({"speed": spaces.Box(-np.inf, np.inf, (2,), np.float64)})
    with pytest.raises(SpaceError, match=r"^obs\['speed'\]: value 1e\+39 at index \(1,\) is out"):
        check_one(space, {"speed": [0.0, 1e39]}, "obs")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([4.9, 0.0, 0.0, 0.0], "above the space's high bound"),
        ([0.0, float("nan"), 0.0, 0.0], "must be finite"),
        ([0.0, float("inf"), 0.0, 0.0], "must be finite"),
        ([0.0, 0.0, -0.5, 0.0], "below the space's low bound"),
    ],
)
def test_a_float32_observation_out_of_its_box_is_refused_like_any_other(
    value: list[float], message: str
) -> None:
    """check_one's fast path (a float32 array of the space's shape) refuses what the rest does."""
    high = np.array([4.8, np.inf, 0.42, np.inf], dtype=np.float32)
    space = spaces.Box(-high, high, dtype=np.float32)
    with pytest.raises(SpaceError, match=message):
        check_one(space, np.array(value, dtype=np.float32), "observation")
    with pytest.raises(SpaceError, match=message):
        check_one(space, value, "observation")  # a list takes the general path


def test_a_float32_observation_in_its_box_comes_back_as_one_row() -> None:
    high = np.array([4.8, np.inf, 0.42, np.inf], dtype=np.float32)
    space = spaces.Box(-high, high, dtype=np.float32)
    value = np.array([4.8, -3e38, -0.42, 1.0], dtype=np.float32)
    row = check_one(space, value, "observation")
    assert row.shape == (1, 4) and row.dtype == np.float32
    np.testing.assert_array_equal(row[0], value)
    with pytest.raises(SpaceError, match="expected shape"):
        check_one(space, np.zeros(3, dtype=np.float32), "observation")


def test_a_ragged_batch_names_the_item_that_breaks_the_shape() -> None:
    box = spaces.Box(-1.0, 1.0, (4,), np.float32)
    with pytest.raises(SpaceError, match=r"item 1 has shape \(2,\), item 0 has shape \(4,\)"):
        check_batch(box, [[0.0] * 4, [1.0, 2.0]], 2, "observations")
    with pytest.raises(SpaceError, match="cannot be read as an array"):  # deeper: numpy's words
        check_batch(box, [[0.0] * 4, [[1.0, 2.0], [3.0]]], 2, "observations")


def test_integers_beyond_int64_are_numbers_to_the_range_checks() -> None:
    box = spaces.Box(-np.inf, np.inf, (2,), np.float32)
    big = 10**24  # JSON allows it; numpy alone would make an object array of it
    np.testing.assert_allclose(check_value(box, [0, big]), [0.0, 1e24], rtol=1e-6)
    with pytest.raises(SpaceError, match=r"value 1e\+40 at index \(1,\) is out of range"):
        check_value(box, [0, 10**40], "observation")  # beyond float32
    with pytest.raises(SpaceError, match="beyond the float64 range"):
        check_value(box, [0, 10**400], "observation")
    with pytest.raises(SpaceError, match="expected numbers"):
        check_value(box, [0, "1"], "observation")
    for integers in (spaces.Box(-10, 10, (2,), np.int64), spaces.MultiDiscrete([3, 3])):
        with pytest.raises(SpaceError, match=r"value 1180591620717411303424 at flat index 1 does"):
            check_value(integers, [0, 2**70], "observation")  # not "send int64 values"
