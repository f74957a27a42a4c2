"""Server addresses: plain text or TLS by their scheme, and the TLS context of a connection."""

from __future__ import annotations

import os
import ssl
from typing import NamedTuple

from rlserve.errors import ConfigError

PLAIN_SCHEMES = ("tcp", "http")
"""Address schemes of a plain-text connection (``http`` is RLlib's form of the same address)."""

TLS_SCHEMES = ("tls", "https")
"""Address schemes of a TLS connection: the server's certificate and host name are verified."""

TLS_CA_ENV = "RLSERVE_TLS_CA"
"""Environment variable with a CA bundle file that TLS connections trust (when ``tls_ca`` is
not given)."""


class Address(NamedTuple):
    """A parsed server address."""

    host: str
    port: int
    tls: bool


def parse_address(address: str) -> Address:
    """Parse a server address: plain text or TLS, by its scheme.

    ``host:port``, ``tcp://host:port`` and RLlib's ``http://host:port`` are plain text;
    ``tls://host:port`` and ``https://host:port`` are TLS. A scheme that promises TLS always
    gets TLS; there is no fallback to plain text.

    Raises:
        ConfigError: An unknown scheme, a bare port, a path, no port or a port out of range
            (a ``ValueError`` too).
    """
    if not isinstance(address, str):
        # A user's mistake (a tuple, a bare port): say what to write, never an AttributeError.
        example = (
            f"'{address[0]}:{address[1]}'"
            if isinstance(address, tuple | list) and len(address) == 2
            else "'localhost:9900'"
        )
        raise ConfigError(
            f"the server address must be a string like {example} (or 'tls://host:port'), got "
            f"{address!r} ({type(address).__name__})"
        )
    scheme, sep, rest = address.partition("://")
    if not sep:
        scheme, rest = "", address
    elif scheme.lower() not in PLAIN_SCHEMES + TLS_SCHEMES:
        raise ConfigError(
            f"address '{address}' has the unknown scheme '{scheme}://'; use host:port, tcp:// "
            "or http:// (plain text), or tls:// or https:// (TLS)"
        )
    host, sep, port = rest.rstrip("/").rpartition(":")
    if not sep and rest.isdigit():
        raise ConfigError(
            f"address '{address}' is a port without a host; write 'localhost:{rest}' (or the "
            f"server's host:{rest})"
        )
    if "/" in rest.rstrip("/"):
        raise ConfigError(
            f"address '{address}' has a path; a server address is host:port only, e.g. "
            "'localhost:9900'"
        )
    if not sep or not port.isdigit():
        raise ConfigError(f"address '{address}' needs a port, e.g. 'localhost:9900'")
    if not 1 <= int(port) <= 65535:
        raise ConfigError(f"address '{address}': the port must be from 1 to 65535, got {port}")
    return Address(host.strip("[]") or "127.0.0.1", int(port), scheme.lower() in TLS_SCHEMES)


def client_ssl_context(address: str, tls_ca: str | None) -> ssl.SSLContext | None:
    """The TLS context of a connection to ``address``, or None for a plain-text address.

    The server's certificate must chain to ``tls_ca`` (a PEM bundle; default: the
    ``RLSERVE_TLS_CA`` environment variable, else the system's trusted CAs) and name the host.

    Raises:
        ConfigError: ``tls_ca`` given for a plain-text address, or a CA file that cannot be read.
    """
    if not parse_address(address).tls:
        if tls_ca is not None:
            raise ConfigError(
                f"tls_ca is set but the address '{address}' is plain text; use "
                "tls://host:port to connect with TLS"
            )
        return None
    cafile = tls_ca if tls_ca is not None else os.environ.get(TLS_CA_ENV) or None
    try:
        return ssl.create_default_context(cafile=cafile)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot read the CA bundle {cafile} ({exc}); pass a PEM file") from exc
