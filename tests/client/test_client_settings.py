"""A client setting that would spin a core or never wait is refused by name before connecting."""

from __future__ import annotations

from typing import Any

import pytest

from rlserve import LocalConfig, PolicyClient
from rlserve.errors import ConfigError, ConnectionLostError

LOCAL_MISTAKES: dict[str, tuple[dict[str, Any], str]] = {
    "no batch interval": ({"batch_interval": 0}, "batch_interval must be at least 0.01 s"),
    "an empty batch": ({"batch_steps": 0}, "batch_steps must be a whole number of 1 or more"),
    "an empty fragment": ({"fragment_length": -1}, "fragment_length must be a whole number"),
    "no episode": ({"max_episodes": 0}, "max_episodes must be a whole number of 1 or more"),
    "a fractional batch": ({"batch_steps": 2.5}, "batch_steps must be a whole number"),
}


@pytest.mark.parametrize("case", sorted(LOCAL_MISTAKES))
def test_a_local_config_that_would_spin_is_refused(case: str) -> None:
    settings, message = LOCAL_MISTAKES[case]
    with pytest.raises(ConfigError, match=message):
        LocalConfig(**settings)


CLIENT_MISTAKES: dict[str, tuple[dict[str, Any], str]] = {
    "weights fetched without pause": (
        {"update_interval": 0},
        r"update_interval must be at least 0.01 s, or None",
    ),
    "a negative connect timeout": ({"connect_timeout": -1}, "connect_timeout must be a positive"),
    "a timeout that is no number": ({"timeout": float("nan")}, "timeout must be a positive"),
    "a negative reconnect window": ({"reconnect_timeout": -0.5}, "reconnect_timeout must be 0"),
}


@pytest.mark.parametrize("case", sorted(CLIENT_MISTAKES))
def test_a_client_timing_mistake_is_refused_before_connecting(case: str) -> None:
    settings, message = CLIENT_MISTAKES[case]
    # Port 1 on loopback: nothing listens, so reaching the network would fail differently.
    with pytest.raises(ConfigError, match=message):
        PolicyClient("127.0.0.1:1", **settings)


def test_no_reply_timeout_is_still_allowed() -> None:
    # timeout=None waits for a reply without a limit: it passes the checks and dials.
    with pytest.raises(ConnectionLostError):
        PolicyClient("127.0.0.1:1", timeout=None, reconnect_timeout=0)
