"""What a :class:`~rlserve.server.app.PolicyServer` needs of its learner side.

``rlserve serve``'s is a :class:`~rlserve.server.learner_link.LearnerLink` (a supervised
learner process); an Algorithm with a server attached hands experience on in process
(:class:`~rlserve.algorithm.serving.AttachedLearner`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

from rlserve.protocol.fragment import Fragment


class LearnerSide(Protocol):
    """What the server needs of its learner side.

    :class:`~rlserve.server.learner_link.LearnerLink` (a supervised learner process), or an
    in-process hand-off such as :class:`rlserve.algorithm.serving.AttachedLearner`.

    It logs each fragment (:meth:`add`) and reported batch (:meth:`add_batch`) to the
    experience log before the server acknowledges it.
    """

    failure: str | None
    """The learner side's last failure, for ``/v1/health``; None while healthy."""
    device: str

    @property
    def pid(self) -> int | None:
        """The learner process id (None: none, or in this process)."""

    def add(self, fragment: Fragment) -> None:
        """Log a fragment cut from a remote episode."""

    def add_batch(
        self,
        fragments: list[Fragment],
        batch_id: str,
        on_done: Callable[[int], None],
        source: str = "",
    ) -> None:
        """Log a reported batch of ``source``; ``on_done(dropped)`` once it may be answered."""

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start on the server's event loop."""

    async def stop(self) -> dict[str, str]:
        """Stop; return each policy's newest checkpoint (path) written while serving."""

    def request_checkpoint(self) -> None:
        """Ask for a checkpoint now."""
