"""The learner process's checkpoints, as the serving side hears of them.

Each ``checkpointed`` message names a policy: :class:`LearnerCheckpoints` keeps each policy's
newest checkpoint and counts those written on request (:meth:`NetworkAlgorithm.save
<rlserve.algorithm.network.NetworkAlgorithm.save>` waits on them), combines the log positions
every policy's kept checkpoints still need into the one the server cleans the experience log up
to, and tells :meth:`LearnerLink.stop <rlserve.server.learner_link.LearnerLink.stop>` when every
policy's final checkpoint is in. :func:`announce_ready` says where each policy's learner starts
from (a restored or initial checkpoint).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from rlserve.run.console import announce
from rlserve.server.stats import ServerStats

logger = logging.getLogger("rlserve.server")


class LearnerCheckpoints:
    """The checkpoints the learner process wrote while this server runs.

    Args:
        policy_ids: Every policy the learner process trains.
        stats: Server counters (``learner/steps_untrained_at_checkpoint``).
        on_checkpointed: Called after each checkpoint with ``log_needed_after`` (the log
            position every policy's kept checkpoints have trained through: log clean-up) and
            that checkpoint's ``policy_id``, ``path``, weights ``version`` and ``reason``.
    """

    def __init__(
        self,
        policy_ids: list[str],
        stats: ServerStats,
        on_checkpointed: Callable[[dict[str, Any]], Awaitable[None]],
    ):
        self._policy_ids = policy_ids
        self._stats = stats
        self._on_checkpointed = on_checkpointed
        # Per policy: the log position its kept checkpoints need (unknown until it says: 0).
        self._log_needed: dict[str, int] = {}
        self._final: set[str] = set()
        self.final_in = asyncio.Event()
        """Set once every policy's final checkpoint is in, or none can come (no learner)."""
        self.newest: dict[str, str] = {}
        """Each policy's newest checkpoint written while this server runs."""
        self.requested: dict[str, int] = {}
        """Checkpoints written on request (``{"type": "checkpoint"}``), per policy (counted)."""

    def expect_final(self) -> None:
        """Wait anew for every policy's final checkpoint (the learner was asked to stop)."""
        self.final_in.clear()
        self._final.clear()

    async def written(self, message: dict[str, Any]) -> None:
        """Note a policy's checkpoint; clean the log up to what every policy still needs."""
        policy_id = str(message["policy_id"])
        self.newest[policy_id] = str(message["path"])
        if message.get("reason") == "request":
            self.requested[policy_id] = self.requested.get(policy_id, 0) + 1
        self._stats.update_learner(
            policy_id,
            {"learner/steps_untrained_at_checkpoint": float(message["untrained_steps"])},
        )
        if message.get("reason") == "shutdown":
            self._final.add(policy_id)
            if self._final >= set(self._policy_ids):
                self.final_in.set()
        self._log_needed[policy_id] = int(message["log_needed_after"])
        needed = min(self._log_needed.get(pid, 0) for pid in self._policy_ids)
        await self._on_checkpointed(
            {
                "log_needed_after": needed,
                "policy_id": policy_id,
                "path": str(message["path"]),
                "version": int(message.get("version", -1)),
                "reason": str(message.get("reason", "")),
            }
        )


def announce_ready(policies: dict[str, dict[str, Any]]) -> None:
    """Say where each policy's learner starts from (a restored or initial checkpoint)."""
    several = len(policies) > 1
    for policy_id, info in policies.items():
        whose = f" for policy '{policy_id}'" if several else ""
        if info.get("restored"):
            announce(
                logger,
                f"rlserve: the learner continues from {info['restored']} "
                f"({int(info.get('updates', 0)):,} updates){whose}",
            )
        elif info.get("initialised_from"):
            announce(
                logger,
                f"rlserve: the learner starts from the weights of {info['initialised_from']}"
                f"{whose} (init_checkpoint)",
            )
