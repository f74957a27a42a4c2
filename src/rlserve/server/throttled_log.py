"""Logged one-line warnings, at most one per kind and interval, with a count of the rest.

A hostile or broken client can cause the same error thousands of times a second; the log must
say that it happens, how often, and what it was, without a traceback each time.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TextIO

logger = logging.getLogger("rlserve.server")


@dataclass
class _Kind:
    last_printed: float
    suppressed: int = 0


@dataclass
class ThrottledLog:
    """Prints the first warning of a kind at once, then at most one per ``interval`` seconds.

    Attributes:
        interval: Seconds between two lines of the same kind.
        stream: Where lines go (default: the ``rlserve.server`` logger, at WARNING).
        clock: Monotonic clock (replaceable in tests).
    """

    interval: float = 60.0
    stream: TextIO | None = None
    clock: Callable[[], float] = time.monotonic
    _kinds: dict[str, _Kind] = field(default_factory=dict)

    def warn(self, kind: str, message: str) -> bool:
        """Log ``message`` unless a line of ``kind`` was logged within the interval.

        Args:
            kind: Groups messages that count as the same problem, e.g. ``internal``.
            message: One line saying what happened.

        Returns:
            Whether the line was written.
        """
        now = self.clock()
        entry = self._kinds.get(kind)
        if entry is not None and now - entry.last_printed < self.interval:
            entry.suppressed += 1
            return False
        suppressed = entry.suppressed if entry is not None else 0
        self._kinds[kind] = _Kind(now)
        more = f" (and {suppressed} more like it since the last such line)" if suppressed else ""
        if self.stream is None:
            logger.warning("rlserve: %s%s", message, more)
        else:
            self.stream.write(f"rlserve: {message}{more}\n")
            self.stream.flush()
        return True


SERVER_LOG = ThrottledLog()
"""The serving process's throttled warnings (carriers and the request handler)."""
