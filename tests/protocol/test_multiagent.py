"""The agent -> policy mapping: exact ids, shell patterns, precedence, errors, wire form."""

from __future__ import annotations

import pytest

from rlserve.errors import ConfigError, SpaceError
from rlserve.protocol.mapping import PolicyMapping, is_pattern


def test_exact_ids_win_over_patterns_and_the_first_pattern_wins() -> None:
    mapping = PolicyMapping(
        [("red_*", "red"), ("red_boss", "boss"), ("*", "crowd"), ("blue_?", "blue")],
        ["red", "boss", "crowd", "blue"],
    )
    assert mapping.resolve("red_7") == "red"
    assert mapping.resolve("red_boss") == "boss"
    assert mapping.resolve("blue_1") == "crowd"  # '*' comes before 'blue_?'
    assert mapping.resolve("anything") == "crowd"


def test_one_policy_without_rules_takes_every_agent() -> None:
    mapping = PolicyMapping([], ["default"])
    assert mapping.resolve("agent_42") == "default"


def test_an_unmapped_agent_is_named_with_the_rules_and_the_fix() -> None:
    mapping = PolicyMapping([("red_*", "red")], ["red", "blue"])
    with pytest.raises(SpaceError, match=r"agent 'green_1' maps to no policy.*'red_\*' -> 'red'"):
        mapping.resolve("green_1")
    assert mapping.policy_for("green_1") is None


def test_a_rule_naming_an_undeclared_policy_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="not declared"):
        PolicyMapping([("a", "nope")], ["red"])
    with pytest.raises(ConfigError, match="policy id"):
        PolicyMapping.from_table({"a": 3}, ["red"])


def test_wire_round_trip_keeps_the_order() -> None:
    mapping = PolicyMapping.from_table({"b*": "x", "*": "y"}, ["x", "y"])
    again = PolicyMapping.from_wire(mapping.to_wire(), ["x", "y"])
    assert again.rules == mapping.rules
    assert again.resolve("bob") == "x" and again.resolve("alice") == "y"
    with pytest.raises(SpaceError):
        PolicyMapping.from_wire([["only-one"]], ["x"])


def test_patterns_are_recognised() -> None:
    assert is_pattern("red_*") and is_pattern("u_??") and is_pattern("[ab]_1")
    assert not is_pattern("red_1")
