"""How the service answers: the reply callback, and the ``internal`` error of its own faults.

A bug while handling a request, or while computing a batch's actions, costs the requests it
touched one ``error`` reply each, never the connection or the server; the cause is logged on one
throttled line (:mod:`~rlserve.server.throttled_log`), without a traceback.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from typing import Any

from rlserve.protocol.replies import ErrorReply
from rlserve.server.stats import ServerStats
from rlserve.server.throttled_log import SERVER_LOG

Respond = Callable[[dict[str, Any]], None]
"""Callback a carrier passes to write one reply."""

INTERNAL_ERROR = "internal"
"""Error code of a request the server failed to handle because of its own fault."""


def answer_internal_error(
    stats: ServerStats,
    exc: Exception,
    log_line: str,
    failed: str,
    advice: str,
    answers: Iterable[tuple[int | None, Respond]],
) -> None:
    """Count and log one internal error, then answer every request it cost.

    Args:
        stats: Counts the error under ``internal``.
        exc: The server's fault.
        log_line: What failed, for the server's log.
        failed: What the server failed to do, for the replies (``handle this request``).
        advice: What the client may do now, for the replies.
        answers: The failed requests' ids and the callbacks that answer them.
    """
    stats.count_error(INTERNAL_ERROR)
    SERVER_LOG.warn(INTERNAL_ERROR, log_line)
    for request_id, respond in answers:
        with contextlib.suppress(Exception):  # a broken respond cannot be answered
            message = f"the server failed to {failed} ({type(exc).__name__}: {exc}); {advice}"
            respond(ErrorReply(request_id, INTERNAL_ERROR, message).to_wire())
