"""Several front-end addresses: their forms, checked up front, and the order they are dialled."""

from __future__ import annotations

import socket
import time

import pytest

from rlserve import PolicyClient
from rlserve.client import front_ends
from rlserve.client.connection import Connection, Timeouts
from rlserve.client.front_ends import FrontEnds, split_addresses
from rlserve.errors import ConfigError, ConnectionLostError


def _refusing_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_one_address_stays_one() -> None:
    assert split_addresses("localhost:9900") == ["localhost:9900"]
    assert split_addresses("tls://host:1") == ["tls://host:1"]


def test_comma_separated_and_list_forms() -> None:
    expected = ["127.0.0.1:9900", "tls://b:9900"]
    assert split_addresses("127.0.0.1:9900, tls://b:9900") == expected
    assert split_addresses(["127.0.0.1:9900", "tls://b:9900"]) == expected
    assert split_addresses(("127.0.0.1:9900", " tls://b:9900 ")) == expected


@pytest.mark.parametrize(
    ("address", "named"),
    [
        ("127.0.0.1:9900,b-host", "'b-host'"),
        (["127.0.0.1:9900", "ssl://b:1"], "'ssl://b:1'"),
        (["127.0.0.1:9900", "b:port"], "'b:port'"),
    ],
)
def test_a_bad_address_in_the_list_is_named(address: object, named: str) -> None:
    with pytest.raises(ConfigError, match=f"front-end address {named}"):
        split_addresses(address)  # type: ignore[arg-type]


@pytest.mark.parametrize("address", ["a:1,,b:2", "a:1,", [], ["a:1", ""]])
def test_an_empty_entry_is_refused(address: object) -> None:
    with pytest.raises(ConfigError, match="empty entry"):
        split_addresses(address)  # type: ignore[arg-type]


def test_host_and_port_as_a_pair_still_says_what_to_write() -> None:
    with pytest.raises(ConfigError, match="'localhost:9900'"):
        split_addresses(("localhost", 9900))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"strings like 'localhost:9900', got 9900"):
        split_addresses(["a:1", "b:2", 9900])  # type: ignore[list-item]


def test_a_bad_address_fails_before_any_dialling() -> None:
    # The first address would refuse; the error is about the second, before any connection.
    with pytest.raises(ConfigError, match="front-end address 'nowhere'"):
        PolicyClient([f"127.0.0.1:{_refusing_port()}", "nowhere"], connect_timeout=1)


def test_reconnecting_dials_its_own_front_end_first_then_all_in_turn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ends = FrontEnds(["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"], None, 1.0)
    assert ends.dial_order() == [0, 1, 2]
    ends.index = 1
    assert ends.reconnect_order(100.0) == [1]
    assert ends.reconnect_order(100.0 + front_ends.SAME_FRONT_END_GRACE / 2) == [1]
    assert ends.reconnect_order(100.0 + front_ends.SAME_FRONT_END_GRACE) == [2, 0, 1]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("form", ["list", "commas"])
def test_every_front_end_down_names_them_all(form: str) -> None:
    ports = [_refusing_port(), _refusing_port()]
    addresses = [f"127.0.0.1:{port}" for port in ports]
    address: str | list[str] = addresses if form == "list" else ",".join(addresses)
    with pytest.raises(ConnectionLostError, match="cannot reach any of the front-ends") as err:
        PolicyClient(address, inference_mode="remote", connect_timeout=2)
    for name in addresses:
        assert str(err.value).count(name) >= 2, err.value  # in the list and with its reason


@pytest.mark.timeout(30)
def test_a_reconnection_cut_short_says_how_long_it_tried() -> None:
    # A background thread reconnects in short slices: the error of one slice must not claim
    # the whole reconnect timeout (a 0.3 s try read "within 60 s" and misled a diagnosis).
    addresses = [f"127.0.0.1:{_refusing_port()}", f"127.0.0.1:{_refusing_port()}"]
    conn = Connection(addresses, None, "test", "local", Timeouts(connect=1.0, reconnect=60.0))
    with pytest.raises(ConnectionLostError, match=r"within 0\.3 s; start the server") as err:
        conn.reconnect(time.monotonic() + 0.3)
    assert "60 s" not in str(err.value)
    assert conn.several
