"""What a :class:`rlserve.server.service.Service` needs around it in a unit test: a sink that
keeps the fragments it is handed, and a loop that never runs a flush (the test runs it)."""

from __future__ import annotations

from typing import Any

from rlserve.protocol.fragment import Fragment


class RecordingSink:
    """The experience sink: keeps every fragment; a reported batch is stored at once."""

    def __init__(self) -> None:
        self.fragments: list[Fragment] = []

    def add(self, fragment: Fragment) -> None:
        """Keep one fragment of a remote episode."""
        self.fragments.append(fragment)

    def add_batch(
        self, fragments: list[Fragment], batch_id: str, on_done: Any, source: str = ""
    ) -> None:
        """Keep a local client's reported batch and say it was stored, dropping nothing."""
        self.fragments.extend(fragments)
        on_done(0)


class NoLoop:
    """The service's event loop: flushes are run by the test (``service.flush()``)."""

    def call_soon(self, callback: Any) -> None:
        """Schedule nothing."""
