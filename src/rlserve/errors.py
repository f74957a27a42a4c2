"""Every exception rlserve raises, in one place.

The hierarchy::

    RLServeError
    ├── ProtocolError            a message or frame breaks the wire protocol
    │   ├── FrameTooLargeError   a frame's length prefix is over the limit
    │   ├── DecodeError          bytes that are not a valid message
    │   └── LimitExceededError   a length, shape, count or id over a named limit
    ├── SpaceError               a value does not fit its Gymnasium space
    │   └── UnsupportedSpaceError  a space the wire or an algorithm cannot carry
    ├── ServerError              the server answered a request with an error
    │   ├── AuthenticationError  missing or wrong token
    │   ├── VersionMismatchError client and server speak different protocol versions
    │   ├── EpisodeError         unknown, reused or finished episode id
    │   │   └── EpisodeLostError the server restarted and forgot the episode: start a new one
    │   └── CapacityError        too many concurrent episodes
    ├── ConnectionLostError      the server cannot be reached or went away
    │   ├── RequestTimeoutError  no reply within the configured timeout
    │   ├── TLSError             the TLS handshake failed (certificate, or no TLS on one side)
    │   └── ClientClosedError    a call on a PolicyClient after its close()
    ├── ConfigError              an invalid configuration value
    ├── CallbackError            a user callback raised (only with callbacks' fail_fast)
    └── EnvError                 a hosted environment returned something unusable, or failed

Every error says what was wrong and how to fix it. ``ServerError`` carries the wire ``code`` and
the request id; the client maps codes back to the subclasses above with :func:`error_for_code`.
Codes without a subclass of their own arrive as a plain ``ServerError``: ``internal`` (a server
bug while handling the request), ``timeout`` (no ``hello`` in time; an HTTP body too slow) and
``forbidden`` (HTTP: a cross-origin request or a foreign ``Host``); see ``docs/protocol.md``.
"""

from __future__ import annotations


class RLServeError(Exception):
    """Base class of every rlserve error."""

    code = "error"


class ProtocolError(RLServeError):
    """A frame or message violates the wire protocol."""

    code = "protocol_error"


class FrameTooLargeError(ProtocolError):
    """A frame's length prefix is larger than the negotiated maximum."""

    code = "frame_too_large"


class DecodeError(ProtocolError):
    """Bytes that cannot be decoded into a message."""

    code = "decode_error"


class LimitExceededError(ProtocolError):
    """A length, shape, element count or id is over its named limit."""

    code = "limit_exceeded"


class SpaceError(RLServeError, ValueError):
    """A value (observation, action) does not fit its declared space."""

    code = "bad_value"


class UnsupportedSpaceError(SpaceError):
    """A Gymnasium space that cannot be described on the wire or used by an algorithm."""

    code = "unsupported_space"


class ServerError(RLServeError):
    """The server rejected a request.

    Attributes:
        code: The machine-readable error code from the wire (see ``docs/protocol.md``).
        request_id: The id of the request that failed, when known.
    """

    code = "server_error"

    def __init__(self, message: str, *, code: str | None = None, request_id: int | None = None):
        super().__init__(message)
        if code is not None:
            self.code = code
        self.request_id = request_id


class AuthenticationError(ServerError):
    """The token is missing or wrong."""

    code = "unauthorized"


class VersionMismatchError(ServerError):
    """Client and server speak different protocol versions."""

    code = "version_mismatch"


class EpisodeError(ServerError):
    """An episode id is unknown, reused, already finished, or used out of order."""

    code = "episode_error"


class EpisodeLostError(EpisodeError):
    """The server restarted since the episode started, so it is gone: start a new episode.

    Also when the client moved to another front-end because the episode's died. Raised by the
    client, without a round trip, for every later call of such an episode. Catch it around one
    episode's loop and start the next episode (``docs/protocol.md``, section 9.9).

    Attributes:
        episode_ids: The lost episodes the call named.
    """

    def __init__(self, message: str, episode_ids: list[str]):
        super().__init__(message)
        self.episode_ids = episode_ids


class CapacityError(ServerError):
    """A per-client or per-server limit on concurrent episodes is reached."""

    code = "capacity"


class ConnectionLostError(RLServeError, ConnectionError):
    """The server cannot be reached, or the connection broke."""


class RequestTimeoutError(ConnectionLostError, TimeoutError):
    """No reply arrived within the configured timeout."""


class TLSError(ConnectionLostError):
    """The TLS handshake failed; nothing was sent in plain text.

    The server's certificate was not accepted, or only one side uses TLS.
    """


class ClientClosedError(ConnectionLostError):
    """A call on a :class:`~rlserve.PolicyClient` after its ``close()``: make a new client.

    A ``ConnectionLostError`` (the client has no connection), of its own class so that a retry
    loop around ``ConnectionLostError`` can tell it apart: retrying cannot help.
    """


class CallbackError(RLServeError):
    """A user callback raised, and the run was told to fail fast (``fail_fast=True``)."""


class ConfigError(RLServeError, ValueError):
    """A configuration value is invalid."""

    key: str | None = None
    """The option (TOML key) at fault, when there is one."""


class EnvError(RLServeError, RuntimeError):
    """A hosted environment broke its API (a malformed step result) or raised while running.

    The message names the environment, the agent (when one is at fault) and how to fix it.
    """


_BY_CODE: dict[str, type[ServerError]] = {
    AuthenticationError.code: AuthenticationError,
    VersionMismatchError.code: VersionMismatchError,
    EpisodeError.code: EpisodeError,
    CapacityError.code: CapacityError,
}


def error_for_code(code: str, message: str, request_id: int | None = None) -> RLServeError:
    """Build the exception a client raises for an ``error`` reply with this ``code``.

    Args:
        code: The wire error code.
        message: The server's explanation.
        request_id: The id of the failed request.

    Returns:
        An instance of the most specific error class for the code.
    """
    if code in (SpaceError.code, UnsupportedSpaceError.code):
        return SpaceError(message)
    cls = _BY_CODE.get(code, ServerError)
    return cls(message, code=code, request_id=request_id)
