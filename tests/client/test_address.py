"""Client addresses: which schemes mean TLS, and no fallback to plain text."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rlserve.client.address import Address, client_ssl_context, parse_address
from rlserve.errors import ConfigError


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("localhost:9900", Address("localhost", 9900, False)),
        ("tcp://10.0.0.2:9900", Address("10.0.0.2", 9900, False)),
        ("http://sim-host:9900/", Address("sim-host", 9900, False)),
        ("tls://example.org:9900", Address("example.org", 9900, True)),
        ("https://example.org:9900", Address("example.org", 9900, True)),
        ("TLS://[::1]:9900", Address("::1", 9900, True)),
        (":9900", Address("127.0.0.1", 9900, False)),
    ],
)
def test_schemes(address: str, expected: Address) -> None:
    assert parse_address(address) == expected


@pytest.mark.parametrize("address", ["ssl://host:1", "udp://host:1", "wss://host:1"])
def test_unknown_schemes_are_refused_by_name(address: str) -> None:
    with pytest.raises(ValueError, match=r"unknown scheme.*tls://.*https://"):
        parse_address(address)


def test_missing_port() -> None:
    with pytest.raises(ValueError, match="needs a port"):
        parse_address("tls://host")


@pytest.mark.parametrize(
    ("address", "message"),
    [
        ("9900", r"'9900' is a port without a host; write 'localhost:9900'"),
        ("tcp://host:9900/v1", "has a path; a server address is host:port only"),
        ("localhost:99999", "the port must be from 1 to 65535, got 99999"),
        ("localhost:0", "the port must be from 1 to 65535, got 0"),
    ],
)
def test_an_address_mistake_says_what_to_write(address: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_address(address)


def test_a_tls_address_always_gets_a_verifying_context(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RLSERVE_TLS_CA", raising=False)
    context = client_ssl_context("https://example.org:9900", None)
    assert context is not None
    assert context.check_hostname
    assert client_ssl_context("http://example.org:9900", None) is None


def test_tls_ca_needs_a_tls_address_and_a_readable_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="tls://"):
        client_ssl_context("localhost:9900", str(tmp_path / "ca.pem"))
    with pytest.raises(ConfigError, match="cannot read the CA bundle"):
        client_ssl_context("tls://localhost:9900", str(tmp_path / "missing.pem"))
    (tmp_path / "junk.pem").write_text("not a certificate")
    with pytest.raises(ConfigError, match="cannot read the CA bundle"):
        client_ssl_context("tls://localhost:9900", str(tmp_path / "junk.pem"))


@pytest.mark.parametrize(
    ("address", "written"),
    [(9900, "'localhost:9900'"), (("sim-host", 9900), "'sim-host:9900'"), (None, "'localhost")],
)
def test_an_address_that_is_not_a_string_says_what_to_write(address: Any, written: str) -> None:
    with pytest.raises(ConfigError, match="must be a string like " + written):
        parse_address(address)
