"""A remote-inference client's calls: sequence numbers, re-sending, and a server's restarts.

Every episode call carries the episode's next sequence number ``seq`` and every ``hello`` the
client's random ``client_id``, so a call re-sent after a lost reply or a timeout is answered
with its first answer and never applied twice (see ``docs/protocol.md``, "Exactly-once calls").
:class:`RemoteSession` numbers the calls, re-sends them on a fresh connection, and remembers
which episodes are open, ended or lost (a restarted server, or the front-end the client moved
to when its own died, does not know them).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from rlserve.client.connection import Connection, Timeouts
from rlserve.client.engine import ServerView
from rlserve.errors import ConnectionLostError, EpisodeError, EpisodeLostError, RLServeError
from rlserve.protocol.replies import Welcome
from rlserve.protocol.session_requests import Ping

logger = logging.getLogger("rlserve.client")

ENDED_SEQS_KEPT = 4096
"""Ended episodes whose last call number is kept (in case the server refuses the end)."""

EPISODES_TRACKED = 100_000
"""Open (and lost) episode ids a remote-mode client remembers, oldest forgotten first."""


class RemoteSession:
    """Sends a remote-mode client's calls until they are answered, each applied once.

    Args:
        conn: The client's open connection.
        timeouts: How long to keep re-sending (``reconnect``).
        view: The server's welcome; re-read on every reconnection.
        forget: Called when the server restarted, to drop what was kept for its episodes.
        drop: Called with an episode that never opened on the server (its pipelined start was
            refused, or given up: unconfirmed when the connection stayed lost, or not re-sent
            behind a refused call), to drop what was kept for it (the rewards logged before its
            first action).
    """

    def __init__(
        self,
        conn: Connection,
        timeouts: Timeouts,
        view: ServerView,
        forget: Callable[[], None],
        drop: Callable[[str], None],
    ):
        self.conn = conn
        self._timeouts = timeouts
        self._view = view
        self._forget = forget
        self._drop = drop
        self.open: OrderedDict[str, None] = OrderedDict()
        """Episodes this client started and has not ended."""
        self.lost: OrderedDict[str, str] = OrderedDict()
        """Episodes a restarted server, or another front-end, does not know -> why (their
        calls raise EpisodeLostError)."""
        self.seq: dict[str, int] = {}
        """Episode id -> the ``seq`` of its last call the server accepted."""
        # The end_episode seq of recently ended episodes: calls after the end take the next
        # number; if the server refuses the end, the episode goes on with the end's number.
        self._ended_seq: OrderedDict[str, int] = OrderedDict()

    def request(self, message: dict[str, Any]) -> dict[str, Any]:
        """Send ``message`` and return its reply (re-sent until answered; errors raised)."""
        reply = self._call(message, wait=True)
        assert reply is not None
        return reply

    def send_nowait(self, message: dict[str, Any], settle: bool = True) -> None:
        """Send ``message`` pipelined: its error, if any, is raised by the next call.

        ``settle=False``: sent behind earlier pipelined calls without waiting for their replies
        (see :meth:`Connection.send_nowait`).
        """
        self._call(message, wait=False, settle=settle)

    def _call(
        self, message: dict[str, Any], wait: bool, settle: bool = True
    ) -> dict[str, Any] | None:
        """Send ``message`` (and re-send pipelined calls a broken connection lost) until done.

        Every message this client sends is idempotent on the server (see the class docstring
        of :class:`~rlserve.PolicyClient`), so re-sending after a lost reply never applies a
        call twice.
        """
        conn = self.conn
        deadline: float | None = None
        replay: list[dict[str, Any]] = []
        # Pipelined starts a restarted server (or another front-end) has never seen.
        unseen: set[str] = set()
        resending = False  # after a lost connection ``message`` may have been applied already
        check_lost = False  # the server restarted: are this call's episodes gone?
        while True:
            try:
                while replay:
                    resent = replay[0]
                    seen = resent.get("episode_id") not in unseen
                    unseen.discard(resent.get("episode_id"))
                    try:
                        conn.request(dict(resent), raise_deferred=False)
                    except ConnectionLostError:
                        raise
                    except EpisodeError:
                        # A pipelined start (a fresh random id) the server already knows took
                        # effect before the connection broke; the episode may be in use since.
                        if not (seen and resent.get("type") == "start_episode"):
                            self._undo_refused(resent)
                            self._give_up(replay[1:], _NOT_RESENT)
                            raise
                    except RLServeError:
                        self._undo_refused(resent)
                        self._give_up(replay[1:], _NOT_RESENT)
                        raise
                    replay.pop(0)
                if check_lost:
                    # Only now: the pipelined starts re-sent above are started on the new server.
                    check_lost = False
                    self.check_not_lost(_episodes_of(message))
                if wait:
                    # Numbered in place: nothing else holds it.
                    return conn.request(message, raise_deferred=not resending)
                conn.send_nowait(dict(message), settle)
                return None
            except ConnectionLostError:  # RequestTimeoutError included
                resending = True
                replay = conn.take_unanswered() + replay
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self._timeouts.reconnect
                if now >= deadline:
                    self._give_up(replay, _UNCONFIRMED)
                    raise
                try:
                    welcome = conn.reconnect(deadline)
                except RLServeError:
                    self._give_up(replay, _UNCONFIRMED)
                    raise
                if self._welcome(welcome):
                    replay = self._restarted_replay(replay)
                    unseen = {m["episode_id"] for m in replay if m.get("type") == "start_episode"}
                    check_lost = True
            except RLServeError:
                # A pipelined call the server refused is undone here (an end_episode leaves its
                # episode open, a start_episode never opened one), the latest first: a refused
                # start and end of one episode leave it unopened.
                for refused in reversed(conn.refused):
                    self._undo_refused(refused)
                conn.refused.clear()
                raise

    def _give_up(self, replay: list[dict[str, Any]], reason: str) -> None:
        """Give up on unanswered calls that will not be re-sent; their starts' episodes are lost.

        That is when the connection stayed lost, or when a call re-sent before them was refused.
        Their calls then raise :class:`~rlserve.errors.EpisodeLostError` (why: ``reason``)
        without a round trip (the server may never have seen them), and the other calls are
        dropped, as a call that raises drops them.
        """
        for message in replay:
            if message.get("type") == "start_episode":
                episode_id = message["episode_id"]
                self.open.pop(episode_id, None)
                self._drop(episode_id)
                remember(self.lost, episode_id, reason)

    def _welcome(self, welcome: Welcome) -> bool:
        """Take a reconnection's ``welcome``; True when it is a restarted server."""
        restarted = self._view.read(welcome)
        if restarted:
            # The server restarted, or this is another front-end: the episodes this client had
            # open are unknown here.
            reason = self._lost_reason()
            for episode_id in [*self.open, *self.seq]:
                remember(self.lost, episode_id, reason)
            self.open.clear()
            self.seq.clear()
            self._ended_seq.clear()
            self._forget()
        return restarted

    def _lost_reason(self) -> str:
        """Why the episodes open before the latest reconnection are unknown now."""
        moved_from = self.conn.moved_from
        if moved_from is None:
            return "the server restarted since it started and no longer knows it"
        return (
            f"it was started on front-end {moved_from}, which was lost, and this client moved "
            f"to front-end {self.conn.front_end}, which does not know it"
        )

    def _restarted_replay(self, replay: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The unanswered pipelined calls a restarted server (or another front-end) still takes.

        Those are the episodes started without waiting, which it has not seen yet, and their
        ends. The rest concern episodes it does not know; they are dropped, with a warning.
        """
        fresh = {m["episode_id"] for m in replay if m.get("type") == "start_episode"}
        kept = [m for m in replay if m.get("episode_id") in fresh]
        if len(kept) < len(replay):
            moved_from = self.conn.moved_from
            logger.warning(
                "rlserve: %s; %d unanswered call(s) for its ended episodes are not re-sent",
                "the server restarted"
                if moved_from is None
                else f"front-end {moved_from} was lost",
                len(replay) - len(kept),
            )
        ended = {m["episode_id"] for m in kept if m.get("type") == "end_episode"}
        for message in kept:
            if message.get("type") == "end_episode":
                # Kept again (the restart cleared them): if this server refuses the end, the
                # episode goes on with the end's number, as on the server that was lost.
                self._ended_seq[message["episode_id"]] = int(message["seq"])
        for episode_id in fresh:
            self.lost.pop(episode_id, None)
            if episode_id not in ended:
                remember(self.open, episode_id)
        return kept

    def _undo_refused(self, message: dict[str, Any]) -> None:
        """Undo a refused pipelined call.

        ``start_episode``: the episode never opened. ``end_episode``: the episode goes on, its
        next call takes the number.
        """
        if message.get("type") == "start_episode":
            self.open.pop(message["episode_id"], None)
            self.seq.pop(message["episode_id"], None)
            self._ended_seq.pop(message["episode_id"], None)
            self._drop(message["episode_id"])
            return
        if message.get("type") != "end_episode":
            return
        episode_id, seq = message["episode_id"], int(message["seq"])
        if self._ended_seq.get(episode_id) == seq:
            del self._ended_seq[episode_id]
            remember(self.open, episode_id)
            if seq > 1:
                self.seq[episode_id] = seq - 1

    def check_not_lost(self, episode_ids: list[str]) -> None:
        """Raise :class:`~rlserve.errors.EpisodeLostError` naming those a restart took.

        Raises:
            EpisodeLostError: The server restarted since one of these episodes started.
        """
        lost = [eid for eid in episode_ids if eid in self.lost]
        if lost:
            names = ", ".join(f"'{eid}'" for eid in lost)
            raise EpisodeLostError(
                f"episode {names} is lost: {self.lost[lost[0]]}; start a new episode (reset "
                "your environment) and carry on",
                lost,
            )

    def next_seq(self, episode_id: str) -> int:
        """The ``seq`` of the episode's next call."""
        last = self.seq.get(episode_id)
        if last is None:
            last = self._ended_seq.get(episode_id, 0)
        return last + 1

    def started(self, episode_id: str) -> None:
        """The server started ``episode_id`` for this client."""
        remember(self.open, episode_id)
        self.lost.pop(episode_id, None)

    def ended(self, episode_id: str, seq: int) -> None:
        """``end_episode`` of ``episode_id`` went out with ``seq`` (its reply is pipelined)."""
        self.open.pop(episode_id, None)
        self.seq.pop(episode_id, None)
        self._ended_seq[episode_id] = seq
        if len(self._ended_seq) > ENDED_SEQS_KEPT:
            self._ended_seq.popitem(last=False)

    def close(self) -> None:
        """Settle a pipelined ``end_episode`` (re-sent if the connection broke) and disconnect.

        Raises:
            RLServeError: The last pipelined call failed.
        """
        try:
            if self.conn.unanswered:
                self.request(Ping(0).to_wire())
        finally:
            self.conn.close()


_UNCONFIRMED = (
    "its start_episode was sent without waiting and the connection was lost before the server "
    "confirmed it"
)
_NOT_RESENT = (
    "its start_episode was sent without waiting and, after the connection was lost, a call "
    "re-sent before it was refused, so it was not re-sent"
)


def _episodes_of(message: dict[str, Any]) -> list[str]:
    """The episode ids an episode call names (none for other calls)."""
    if message.get("type") == "start_episode":
        return []
    if "episode_ids" in message:
        return list(message["episode_ids"])
    episode_id = message.get("episode_id")
    return [episode_id] if isinstance(episode_id, str) else []


def remember(ids: OrderedDict[str, Any], episode_id: str, value: Any = None) -> None:
    """Add ``episode_id`` (with ``value``) to ``ids`` as the newest, dropping the oldest."""
    ids[episode_id] = value
    ids.move_to_end(episode_id)
    if len(ids) > EPISODES_TRACKED:
        ids.popitem(last=False)
