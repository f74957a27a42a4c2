"""Which clients are talking to the server, and how fast: the dashboard's client table.

:meth:`ClientActivity.saw` counts each request by its client identity (the key that owns its
episodes). Identities are bearer secrets over HTTP (``X-RLServe-Client``), so the table shows a
short hash of each, never the identity itself; binary clients also show the name from ``hello``.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

ACTIVE_SECONDS = 60.0
"""A client that sent nothing for this long leaves the table."""

MAX_CLIENTS = 10_000
"""Client identities tracked at once (beyond it, the first tracked is forgotten; :meth:`table`
forgets idle ones every second anyway)."""


def client_label(key: str) -> str:
    """A short, stable name for a client identity that does not reveal it."""
    return hashlib.sha256(key.encode()).hexdigest()[:8]


@dataclass(slots=True)
class _Client:
    name: str
    requests: int = 0
    last_seen: float = 0.0
    mark_requests: int = 0
    rate: float = 0.0


class ClientActivity:
    """Requests per client identity, and their rate between two :meth:`table` calls.

    Args:
        clock: Seconds, monotonic (for tests).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._clients: dict[str, _Client] = {}
        self._mark = clock()

    def saw(self, key: str, name: str) -> None:
        """Count one request of the client ``key`` (``name``: its ``hello`` name, or "")."""
        client = self._clients.get(key)
        if client is None:
            if len(self._clients) >= MAX_CLIENTS:
                self._clients.pop(next(iter(self._clients)))
            client = self._clients[key] = _Client(name)
        client.requests += 1
        client.last_seen = self._clock()

    def table(self, open_episodes: dict[str, int]) -> list[dict[str, Any]]:
        """The clients seen in the last :data:`ACTIVE_SECONDS`, busiest first.

        Each row: ``client`` (a hash of the identity), ``name``, ``requests_per_s`` since the
        previous call, ``requests``, ``idle_s``, ``open_episodes`` (from ``open_episodes``, by
        identity).
        """
        now = self._clock()
        elapsed = now - self._mark
        self._mark = now
        rows: list[dict[str, Any]] = []
        for key, client in list(self._clients.items()):
            if now - client.last_seen > ACTIVE_SECONDS and not open_episodes.get(key):
                del self._clients[key]
                continue
            if elapsed > 0:
                client.rate = (client.requests - client.mark_requests) / elapsed
            client.mark_requests = client.requests
            rows.append(
                {
                    "client": client_label(key),
                    "name": client.name,
                    "requests_per_s": client.rate,
                    "requests": client.requests,
                    "idle_s": now - client.last_seen,
                    "open_episodes": open_episodes.get(key, 0),
                }
            )
        rows.sort(key=lambda row: (-float(row["requests_per_s"]), str(row["client"])))
        return rows
