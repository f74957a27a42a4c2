"""The agents held in open multi-agent episodes: per owner (client identity) and in all.

``max_agents_per_episode`` bounds one episode, but a client may hold ``max_episodes_per_client``
episodes: without a count across them one client could make the server hold hundreds of
millions of agents. An agent counts from the call that brings it into its episode until the
episode ends (done agents included, as they stay in the episode).
"""

from __future__ import annotations

from rlserve.errors import CapacityError


class AgentCounts:
    """Agents of open multi-agent episodes, per owner and on the whole server.

    Args:
        max_per_owner: Most agents one owner's open episodes may hold (None: no limit).
        max_total: Most agents all open episodes may hold (None: no limit).
    """

    def __init__(self, max_per_owner: int | None, max_total: int | None):
        self.max_per_owner = max_per_owner
        self.max_total = max_total
        self.total = 0
        """Agents of all open episodes."""
        self._per_owner: dict[str, int] = {}

    def held(self, owner: str) -> int:
        """Agents of this owner's open episodes."""
        return self._per_owner.get(owner, 0)

    def fits(self, owner: str, more: int) -> bool:
        """Whether ``more`` agents fit, for the owner and on the server."""
        per_owner, total = self.max_per_owner, self.max_total
        return (per_owner is None or self.held(owner) + more <= per_owner) and (
            total is None or self.total + more <= total
        )

    def check(self, owner: str, new: int) -> None:
        """Refuse ``new`` agents that would take the owner or the server over its limit.

        Raises:
            CapacityError: Naming the count, the limit and what to do.
        """
        held = self.held(owner)
        if self.max_per_owner is not None and held + new > self.max_per_owner:
            raise CapacityError(
                f"this client's open episodes would hold {held + new} agents; the limit is "
                f"{self.max_per_owner} (max_agents_per_client): end episodes, or reuse agent ids "
                "in an episode instead of bringing in new ones"
            )
        if self.max_total is not None and self.total + new > self.max_total:
            raise CapacityError(
                f"the server's open episodes would hold {self.total + new} agents; the limit "
                f"is {self.max_total} (max_agents_per_server): end episodes, or try again "
                "when other clients' episodes have ended"
            )

    def add(self, owner: str, count: int) -> None:
        """Count agents that joined one of the owner's episodes."""
        if count:
            self._per_owner[owner] = self.held(owner) + count
            self.total += count

    def release(self, owner: str, count: int) -> None:
        """Forget the agents of an episode of the owner that ended."""
        if count:
            left = self.held(owner) - count
            if left:
                self._per_owner[owner] = left
            else:
                self._per_owner.pop(owner, None)
            self.total -= count
