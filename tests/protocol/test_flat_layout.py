"""``flat_columns`` says where each part of an observation lies in the flattened batch."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
from gymnasium import spaces

from rlserve.errors import UnsupportedSpaceError
from rlserve.protocol.flat_layout import flat_columns
from rlserve.protocol.spaces import check_batch, flat_dim

NESTED = spaces.Dict(
    {
        "pos": spaces.Box(-1.0, 1.0, (2, 3), np.float32),
        "gear": spaces.Discrete(3, start=5),
        "pair": spaces.Tuple((spaces.MultiBinary(2), spaces.MultiDiscrete([2, 4], start=[1, -2]))),
    }
)


def _leaf_value(value: Any, key: str) -> Any:
    for part in key.split("/") if key else ():
        value = value[int(part)] if isinstance(value, tuple) else value[part]
    return value


def test_each_leafs_columns_hold_its_value_as_the_server_flattens_it() -> None:
    columns = flat_columns(NESTED)
    assert [c["key"] for c in columns] == ["gear", "pair/0", "pair/1", "pos"]  # a Dict's order
    assert columns[0]["start"] == 0 and columns[-1]["stop"] == flat_dim(NESTED)
    assert all(a["stop"] == b["start"] for a, b in itertools.pairwise(columns))
    NESTED.seed(0)
    values = [NESTED.sample() for _ in range(5)]
    batch = check_batch(NESTED, values, len(values), "obs")  # the server's own flattening
    for row, value in zip(batch, values, strict=True):
        for column in columns:
            cells = row[column["start"] : column["stop"]]
            leaf = np.asarray(_leaf_value(value, column["key"]))
            if column["encoding"] == "values":
                np.testing.assert_array_equal(cells, leaf.reshape(-1))
            elif column["encoding"] == "one_hot":
                expected = np.zeros(column["n"])
                expected[int(leaf) - column["value_start"]] = 1
                np.testing.assert_array_equal(cells, expected)
            else:
                assert column["encoding"] == "one_hot_each"
                blocks = np.split(cells, np.cumsum(column["nvec"])[:-1])
                for block, v, first in zip(blocks, leaf, column["value_start"], strict=True):
                    assert block.argmax() == v - first and block.sum() == 1


def test_a_space_that_is_one_leaf() -> None:
    assert flat_columns(spaces.Discrete(4)) == [
        {"key": "", "start": 0, "stop": 4, "type": "Discrete", "encoding": "one_hot", "n": 4,
         "value_start": 0}
    ]  # fmt: skip
    assert flat_columns(spaces.Box(0, 1, (3,)))[0]["shape"] == [3]


def test_a_space_without_a_layout_is_refused() -> None:
    with pytest.raises(UnsupportedSpaceError, match="Text spaces have no flat layout"):
        flat_columns(spaces.Dict({"name": spaces.Text(5)}))
