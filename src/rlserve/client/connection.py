"""A blocking binary-carrier connection: framing, request ids, pipelining, reconnection.

Requests get increasing ids. :meth:`Connection.request` sends one and reads replies until its
own arrives. :meth:`Connection.send_nowait` sends one without waiting (it is pipelined: the
caller goes on, e.g. resets its simulator, while the reply travels). Pipelined replies are read
as they arrive, on the way to a later request's reply; an error among them, naming the request
it belongs to, is raised by the next call before it sends anything: a call that raises has
taken no effect. With several front-ends
(:mod:`rlserve.client.front_ends`), opening and re-opening move between them. Standard library
sockets only.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rlserve.client.front_ends import FrontEnds, split_addresses
from rlserve.errors import (
    ConfigError,
    ConnectionLostError,
    FrameTooLargeError,
    ProtocolError,
    RequestTimeoutError,
    RLServeError,
    TLSError,
    error_for_code,
)
from rlserve.protocol.codec import decode
from rlserve.protocol.framing import HEADER, FrameDecoder
from rlserve.protocol.limits import DEFAULT_LIMITS, PROTOCOL_VERSION, Limits
from rlserve.protocol.replies import ErrorReply, Welcome
from rlserve.protocol.request_frames import RequestFramer
from rlserve.protocol.session_requests import Hello

logger = logging.getLogger("rlserve.client")


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Client timeouts, in seconds.

    Attributes:
        connect: To open the TCP connection.
        request: For a reply (a first get_action may wait while the server's learner starts).
        reconnect: How long to keep retrying, with backoff, after the connection breaks.
    """

    connect: float = 10.0
    request: float = 60.0
    reconnect: float = 30.0


HEAD_BYTES = 64
"""First bytes of a connection kept to name a peer that is not a binary carrier."""

MAX_PIPELINED = 64
"""Pipelined requests sent without settling before a send waits for their replies."""


class Connection:
    """One binary-carrier connection to an rlserve server, re-opened when it breaks.

    Args:
        address: Where the server listens; or several front-ends of one run (a list, or
            addresses separated by commas): the connection opens to the first that answers and
            re-opens to another when its own is lost (see :mod:`rlserve.client.front_ends`).
        token: The server's token, if it has one.
        client_name: Shown in the server's logs and metrics.
        inference_mode: Sent in ``hello``.
        timeouts: Connect, request and reconnect timeouts.
        tls_ca: CA bundle a ``tls://`` server's certificate must chain to (see
            :func:`~rlserve.client.address.client_ssl_context`).
        client_id: The client identity sent in every ``hello`` (episodes belong to it); None:
            the server treats each connection as its own client.
    """

    def __init__(
        self,
        address: str | Sequence[str],
        token: str | None,
        client_name: str,
        inference_mode: str,
        timeouts: Timeouts,
        tls_ca: str | None = None,
        client_id: str | None = None,
    ):
        self._front_ends = FrontEnds(split_addresses(address), tls_ca, timeouts.connect)
        self._use(0)
        self.moved_from: str | None = None
        """The front-end this connection left at its latest (re)opening, if it moved."""
        self._head: bytearray | None = None
        """The first bytes of the connection until its first frame (to name a foreign peer)."""
        self._token = token
        self._client_name = client_name
        self._inference_mode = inference_mode
        self._client_id = client_id
        self.timeouts = timeouts
        self.limits: Limits = DEFAULT_LIMITS
        self._sock: socket.socket | None = None
        self._decoder = FrameDecoder(DEFAULT_LIMITS.max_frame_bytes)
        self._framer = RequestFramer()
        self._next_id = 1
        self._unanswered: dict[int, dict[str, Any]] = {}
        self._replies: dict[int, dict[str, Any]] = {}
        self._deferred_error: RLServeError | None = None
        self._deferred_message: dict[str, Any] | None = None
        """The pipelined request whose refusal is ``_deferred_error``."""
        self.refused: list[dict[str, Any]] = []
        """Every pipelined request the server refused since the caller last took them (the
        first one's error is raised; the caller undoes them all)."""
        self.welcome: Welcome | None = None
        """The server's latest ``welcome``."""
        self.reconnects = 0

    @property
    def tcp_connected(self) -> bool:
        """Whether a TCP connection to the server was ever established."""
        return self._dialer.tcp_connected

    @property
    def several(self) -> bool:
        """Whether it has more than one front-end to move to."""
        return self._front_ends.several

    @property
    def front_end(self) -> str:
        """``host:port`` of the front-end in use (or dialled last)."""
        return f"{self.host}:{self.port}"

    def _use(self, index: int) -> None:
        self._dialer = self._front_ends.dialers[index]
        self.host, self.port, self.tls = self._dialer.host, self._dialer.port, self._dialer.tls

    # -- lifecycle -------------------------------------------------------------------------

    def open(self) -> Welcome:
        """Connect and say hello; return the server's ``welcome``.

        With several front-ends: the one in use first, then the others in turn; the first
        that answers is used.

        Raises:
            ConnectionLostError: No front-end can be reached (the error names each).
            TLSError: Only one side speaks TLS.
            ConfigError: The address leads to an HTTP port, not a binary one (the message names
                the binary port when the server's health says it); or a front-end serves other
                policies or spaces than the first one.
            AuthenticationError, VersionMismatchError: The server refused the hello.
        """
        return self._open_any(self._front_ends.dial_order())

    def _open_any(self, order: list[int]) -> Welcome:
        """Open to the first front-end of ``order`` that answers (see :meth:`open`)."""
        front_ends = self._front_ends
        failures: list[str] = []
        for index in order:
            self._use(index)
            try:
                welcome = self._open_one()
            except TLSError:
                raise  # a mistake of this client's settings, not an outage
            except ConnectionLostError as exc:
                if len(order) == 1:
                    raise
                failures.append(str(exc))
                continue
            try:
                left = front_ends.welcomed(index, welcome)
            except ConfigError:
                self._drop_socket()
                raise
            self.moved_from = left if self.welcome is not None else None
            if self.moved_from is not None:
                logger.warning(
                    "rlserve: front-end %s is unreachable; moved to front-end %s",
                    self.moved_from,
                    self.front_end,
                )
            self.welcome = welcome
            self.limits = welcome.limits
            self._decoder.max_frame_bytes = self.limits.max_frame_bytes
            return welcome
        raise ConnectionLostError(
            f"cannot reach any of the front-ends {front_ends.names}: " + "; ".join(failures)
        )

    def _open_one(self) -> Welcome:
        """Connect to the current front-end and say hello; its ``welcome``."""
        sock = self._dialer.connect()
        sock.settimeout(self.timeouts.request)
        self._sock = sock
        self._decoder = FrameDecoder(DEFAULT_LIMITS.max_frame_bytes)
        self._head = bytearray()
        self._unanswered.clear()
        self._replies.clear()
        try:
            hello = Hello(
                0,
                PROTOCOL_VERSION,
                self._client_name,
                self._token,
                self._inference_mode,
                self._client_id,
                map_agents=self._inference_mode == "local",
            )
            # An error kept from the last connection is the next call's, not the hello's.
            welcome = Welcome.from_wire(self._roundtrip(hello.to_wire(), raise_deferred=False))
        except ConnectionLostError as exc:
            # Closed without a byte of reply: what a TLS server does to a plain-text hello.
            closed = not isinstance(exc, RequestTimeoutError)
            dialer = self._dialer
            if closed and not self.tls and self._head == b"" and dialer.speaks_tls():
                raise TLSError(dialer.tls_peer_message()) from exc
            raise
        return welcome

    def close(self) -> None:
        """Read outstanding replies (raising a deferred error) and close the socket."""
        try:
            self._read_pipelined(starts_too=True)
        finally:
            self._drop_socket()
        self._raise_deferred()

    def _drop_socket(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
        self._sock = None

    def reconnect(self, deadline: float | None = None) -> Welcome:
        """Re-open the connection with exponential backoff until the reconnect timeout.

        With several front-ends: the same one first, then the others in turn (see
        :meth:`FrontEnds.reconnect_order`); :attr:`moved_from` says whether it moved.

        Args:
            deadline: Give up at this ``time.monotonic()`` instead (e.g. a call's own deadline).

        Raises:
            ConnectionLostError: The server (every front-end) stayed unreachable.
            ConfigError: The front-end that answered serves other policies or spaces.
        """
        self._drop_socket()
        started = time.monotonic()
        if deadline is None:
            deadline = started + self.timeouts.reconnect
        delay = 0.05
        while True:
            try:
                welcome = self._open_any(self._front_ends.reconnect_order(time.monotonic()))
                self.reconnects += 1
                return welcome
            except ConnectionLostError:
                if time.monotonic() + delay > deadline:
                    others = ""
                    if self._front_ends.several:
                        others = f" or to another front-end ({self._front_ends.names})"
                    # The time it tried, which a caller's deadline may make shorter.
                    tried = deadline - started
                    raise ConnectionLostError(
                        f"lost the connection to {self.host}:{self.port} and could not "
                        f"reconnect{others} within {tried:.{0 if tried >= 10 else 1}f} s; start "
                        "the server or raise the reconnect timeout"
                    ) from None
                time.sleep(max(0.0, min(delay, deadline - time.monotonic())))
                delay = min(delay * 2, 2.0)

    # -- requests --------------------------------------------------------------------------

    def request(self, message: dict[str, Any], raise_deferred: bool = True) -> dict[str, Any]:
        """Send ``message`` and return its reply; an ``error`` reply is raised.

        The replies of earlier pipelined requests are read first, and an error among them is
        raised before sending: a call that raises has taken no effect. Pipelined
        ``start_episode`` requests are not waited for (a fresh random id can only be refused
        for a server limit): their replies are read on the way to this one's, and an error
        among them is raised by this call if it failed too (it acts in the episode whose start
        was refused), else by the next call.

        Args:
            message: The request.
            raise_deferred: False for a request that may have been applied already (re-sent
                after a lost connection): an earlier pipelined error is then left for the next
                call, and an error reply is this request's own.
        """
        if self._unanswered or (raise_deferred and self._deferred_error is not None):
            self._settle(raise_deferred)
        return self._roundtrip(message, raise_deferred)

    def send_nowait(self, message: dict[str, Any], settle: bool = True) -> None:
        """Send ``message`` without waiting; its error, if any, is raised by the next call.

        Args:
            message: The request.
            settle: First read the replies of the earlier pipelined requests but starts
                (raising the first error among them). False: send at once, behind them (once
                :data:`MAX_PIPELINED` are on their way, their replies are read first).
        """
        if len(self._unanswered) >= MAX_PIPELINED:
            self._read_pipelined(starts_too=True)
        if settle:
            self._settle()
        else:
            self._raise_deferred()
        request_id = self._send(message)
        self._unanswered[request_id] = message

    @property
    def unanswered(self) -> int:
        """How many pipelined requests still wait for their reply."""
        return len(self._unanswered)

    def abort(self) -> None:
        """Shut the socket down from another thread: a blocked read returns at once."""
        sock = self._sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def take_unanswered(self) -> list[dict[str, Any]]:
        """The pipelined requests whose replies never came (the connection broke), in order.

        The caller decides whether re-sending them is safe; they are forgotten here.
        """
        lost = [self._unanswered[key] for key in sorted(self._unanswered)]
        self._unanswered.clear()
        return lost

    def _settle(self, raise_deferred: bool = True) -> None:
        """Read the replies of pipelined requests; raise the first error among them.

        Pipelined starts are not waited for (see :meth:`request`).
        """
        self._read_pipelined(starts_too=False)
        if raise_deferred:
            self._raise_deferred()

    def _read_pipelined(self, starts_too: bool) -> None:
        """Read replies until no pipelined request (but starts, unless ``starts_too``) waits."""
        while self._sock is not None and any(
            starts_too or sent["type"] != "start_episode" for sent in self._unanswered.values()
        ):
            self._receive_some()

    def _roundtrip(self, message: dict[str, Any], raise_deferred: bool = True) -> dict[str, Any]:
        request_id = self._send(message)
        reply = self._read_until(request_id)
        if reply.get("type") == "error":
            # An earlier pipelined request's error is the cause to name first (e.g. the refused
            # start_episode of the episode this call acts in).
            if raise_deferred or self._refused_start_of(message):
                self._raise_deferred()
            error = ErrorReply.of(reply)
            assert error is not None
            raise error_for_code(error.code, error.message, request_id)
        return reply

    def _send(self, message: dict[str, Any]) -> int:
        if self._sock is None:
            raise ConnectionLostError("the connection is closed")
        request_id = self._next_id
        message["id"] = request_id
        data = self._framer.frame(message)
        if len(data) - HEADER.size > self.limits.max_frame_bytes:
            raise FrameTooLargeError(
                f"a {message.get('type')} of {len(data) - HEADER.size} bytes is over the "
                f"server's frame limit of {self.limits.max_frame_bytes} bytes; send less per call"
            )
        self._next_id += 1
        try:
            self._sock.sendall(data)
        except OSError as exc:
            self._drop_socket()
            raise ConnectionLostError(f"sending to {self.host}:{self.port} failed: {exc}") from exc
        return request_id

    def _read_until(self, request_id: int) -> dict[str, Any]:
        while request_id not in self._replies:
            self._receive_some()
        return self._replies.pop(request_id)

    def _receive_some(self) -> None:
        assert self._sock is not None
        try:
            data = self._sock.recv(1 << 16)
        except TimeoutError as exc:
            self._drop_socket()
            raise RequestTimeoutError(
                f"no reply from {self.host}:{self.port} within {self.timeouts.request} s; "
                "raise the request timeout if the server is busy"
            ) from exc
        except OSError as exc:
            self._drop_socket()
            raise ConnectionLostError(
                f"connection to {self.host}:{self.port} broke: {exc}"
            ) from exc
        if not data:
            self._drop_socket()
            raise ConnectionLostError(
                f"the server at {self.host}:{self.port} closed the connection"
            )
        if self._head is not None and len(self._head) < HEAD_BYTES:
            self._head += data[: HEAD_BYTES - len(self._head)]
        try:
            bodies = self._decoder.feed(data)
            replies = [decode(body, self.limits) for body in bodies]
        except ProtocolError as exc:
            self._drop_socket()
            foreign = self._dialer.foreign_error(bytes(self._head or b""))
            if foreign is not None:
                raise foreign from exc
            raise ConnectionLostError(f"the server sent an invalid frame: {exc}") from exc
        if replies:
            self._head = None
        for reply in replies:
            reply_id = reply.get("id")
            if isinstance(reply_id, int) and reply_id in self._unanswered:
                sent = self._unanswered.pop(reply_id)
                kind = sent["type"]
                error = ErrorReply.of(reply)
                if error is not None:
                    self.refused.append(sent)
                if error is not None and self._deferred_error is None:
                    self._deferred_message = sent
                    episode = sent.get("episode_id")
                    of = f" of episode '{episode}'" if isinstance(episode, str) else ""
                    self._deferred_error = error_for_code(
                        error.code,
                        f"the earlier {kind}{of} failed: {error.message} (it was sent "
                        "without waiting for its reply, so its error is raised by the next "
                        "call, which was not sent)",
                        reply_id,
                    )
            elif isinstance(reply_id, int):
                self._replies[reply_id] = reply
            elif (error := ErrorReply.of(reply)) is not None:
                # An error without a request id concerns the connection itself.
                self._drop_socket()
                raise error_for_code(error.code, error.message)

    def _refused_start_of(self, message: dict[str, Any]) -> bool:
        """Whether the error kept to raise is of a refused start of an episode ``message`` names."""
        kept = self._deferred_message
        if self._deferred_error is None or kept is None:
            return False
        named = message.get("episode_ids") or [message.get("episode_id")]
        return kept.get("type") == "start_episode" and kept.get("episode_id") in named

    def _raise_deferred(self) -> None:
        error, self._deferred_error = self._deferred_error, None
        self._deferred_message = None
        if error is not None:
            raise error
