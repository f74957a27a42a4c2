"""A client's serving front-ends: every address it may use, the one in use, which to dial next.

``PolicyClient`` takes one address or several (front-ends of one run, each an ordinary rlserve
server with its own port). It connects to the first that answers, in the order given. When its
connection breaks it dials the same front-end again for :data:`SAME_FRONT_END_GRACE` seconds (a
network blip, or a server restarting in place), then the others in turn from the one after it
(round-robin, its own last), until the reconnect timeout. Every front-end after the first must
serve the same policies and spaces as the first one's ``welcome``: a front-end of another run is
a configuration mistake. Standard library only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rlserve.client.address import parse_address
from rlserve.client.dial import Dialer
from rlserve.errors import ConfigError
from rlserve.protocol.replies import Welcome

SAME_FRONT_END_GRACE = 1.0
"""Seconds a broken connection dials only its own front-end before it tries the others."""


def split_addresses(address: str | Sequence[str]) -> list[str]:
    """The addresses of ``PolicyClient``'s ``address``: one, comma-separated, or a list.

    Every address is parsed here, so a bad one fails before anything is dialled.

    Raises:
        ConfigError: An empty list or entry, a bad address (in a list, the error names it), or
            something that is not a string.
    """
    if isinstance(address, str):
        if "," not in address:
            parse_address(address)
            return [address]
        parts = [part.strip() for part in address.split(",")]
    elif isinstance(address, list | tuple) and all(isinstance(a, str) for a in address):
        parts = [part.strip() for part in address]
    else:
        if isinstance(address, list | tuple) and len(address) != 2:
            bad = next(a for a in address if not isinstance(a, str))
            raise ConfigError(
                f"the server addresses must be strings like 'localhost:9900', got {bad!r} "
                f"({type(bad).__name__}) in {address!r}"
            )
        parse_address(address)  # type: ignore[arg-type]  # raises: it says what to write
        raise AssertionError("unreachable")  # pragma: no cover
    if not parts or not all(parts):
        raise ConfigError(
            f"the server addresses {address!r} hold an empty entry; give one or more "
            "'host:port' addresses, as a list or separated by commas"
        )
    for part in parts:
        try:
            parse_address(part)
        except ValueError as exc:
            raise ConfigError(f"front-end address '{part}' of {address!r}: {exc}") from exc
    return parts


class FrontEnds:
    """The front-ends one connection may use, and the one it uses.

    Args:
        addresses: One or more server addresses (see :func:`split_addresses`).
        tls_ca: CA bundle a ``tls://`` front-end's certificate must chain to.
        connect_timeout: Seconds to wait for a connection to open.
    """

    def __init__(self, addresses: Sequence[str], tls_ca: str | None, connect_timeout: float):
        self.dialers = [Dialer(address, tls_ca, connect_timeout) for address in addresses]
        self.index = 0
        """The front-end in use (or dialled last)."""
        self._lost_since: float | None = None
        self._first: tuple[str, Welcome] | None = None

    @property
    def several(self) -> bool:
        """Whether there is more than one front-end to move to."""
        return len(self.dialers) > 1

    def name(self, index: int) -> str:
        """``host:port`` of a front-end."""
        dialer = self.dialers[index]
        return f"{dialer.host}:{dialer.port}"

    @property
    def names(self) -> str:
        """Every front-end, comma-separated."""
        return ", ".join(self.name(i) for i in range(len(self.dialers)))

    def dial_order(self) -> list[int]:
        """Every front-end, the one in use first, then the others in turn."""
        count = len(self.dialers)
        return [(self.index + k) % count for k in range(count)]

    def reconnect_order(self, now: float) -> list[int]:
        """The front-ends to dial now that the connection is lost (since the first call).

        The same one for :data:`SAME_FRONT_END_GRACE` seconds, then the others in turn from the
        one after it, and itself last (a hung front-end costs a request timeout to find out).
        """
        if self._lost_since is None:
            self._lost_since = now
        if now - self._lost_since < SAME_FRONT_END_GRACE:
            return [self.index]
        count = len(self.dialers)
        return [(self.index + k) % count for k in range(1, count + 1)]

    def welcomed(self, index: int, welcome: Welcome) -> str | None:
        """Front-end ``index`` said welcome: use it; the one it replaces, if it is another.

        Raises:
            ConfigError: It serves other policies or spaces than the first front-end.
        """
        name = self.name(index)
        if self._first is None:
            self._first = (name, welcome)
        elif self.several and _served(welcome) != _served(self._first[1]):
            first = self._first[0]
            raise ConfigError(
                f"front-end {name} serves other policies or spaces than {first}, the first "
                f"front-end this client reached ({_difference(welcome, self._first[1])}); every "
                "address given to PolicyClient must be "
                f"a front-end of the same run: remove '{name}' from the list"
            )
        previous = self.index
        self.index = index
        self._lost_since = None
        return self.name(previous) if previous != index else None


def _difference(welcome: Welcome, first: Welcome) -> str:
    """What differs between two front-ends' ``welcome``, in words."""
    if set(welcome.policies) != set(first.policies):
        return f"policies {sorted(welcome.policies)} vs {sorted(first.policies)}"
    spaces = sorted(p for p in first.policies if welcome.policies[p] != first.policies[p])
    if spaces:
        return "the spaces of " + ", ".join(f"policy '{p}'" for p in spaces) + " differ"
    return "the agent mapping differs"


def _served(welcome: Welcome) -> tuple[dict[str, Any], Any, bool]:
    """What a front-end serves: its policies and spaces, agent mapping and multi-agent flag."""
    return welcome.policies, welcome.mapping, welcome.multi_agent
