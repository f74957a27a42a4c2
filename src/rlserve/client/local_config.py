"""How a local-inference client batches and buffers experience (:class:`LocalConfig`).

Its own module so that :mod:`rlserve.client.local` stays one concern: the engine. Import it from
either.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

from rlserve.config.fields import option
from rlserve.errors import ConfigError

MIN_INTERVAL_S = 0.01
"""Shortest ``batch_interval`` (and ``PolicyClient``'s ``update_interval``): a background thread
wakes this often at most, so a 0 cannot turn it into a loop that takes a core."""


@dataclass
class LocalConfig:
    """How a local-inference client batches and buffers experience."""

    batch_steps: int = option(512, "Ship a batch once this many steps are ready.")
    batch_interval: float = option(1.0, "Ship what is ready at least this often (seconds).")
    fragment_length: int = option(200, "Steps of an episode per fragment.")
    max_buffered_steps: int = option(100_000, "Unshipped steps kept while the server is away.")
    when_full: str = option("drop", "At the bound: 'drop' the oldest steps or 'block' get_action.")
    max_episodes: int = option(10_000, "Concurrent episodes on this client.")

    def __post_init__(self) -> None:
        for name in ("batch_steps", "fragment_length", "max_buffered_steps", "max_episodes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                raise ConfigError(
                    f"LocalConfig {name} must be a whole number of 1 or more, got {value!r}"
                )
        interval = self.batch_interval
        if (
            isinstance(interval, bool)
            or not isinstance(interval, (int, float))
            or not (MIN_INTERVAL_S <= interval < float("inf"))
        ):
            raise ConfigError(
                f"LocalConfig batch_interval must be at least {MIN_INTERVAL_S} s (the shipping "
                f"thread wakes this often), got {interval!r}"
            )
        if self.when_full not in ("drop", "block"):
            raise ConfigError(f"when_full must be 'drop' or 'block', got '{self.when_full}'")
        if self.max_buffered_steps < self.batch_steps:
            raise ConfigError(
                f"max_buffered_steps ({self.max_buffered_steps}) must be at least batch_steps "
                f"({self.batch_steps})"
            )
