"""Sessions: who a client is, and the ``hello`` that admits it (version, token, identity).

A session is one client's conversation: a binary connection, or the HTTP carrier as a whole.
Every request but ``hello`` needs an authenticated session. The episodes a session starts belong
to its identity (:attr:`Session.key`), so a client that reconnects with the same ``client_id``
keeps them (docs/protocol.md section 3.3).
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
from dataclasses import dataclass, field

from rlserve.errors import AuthenticationError, VersionMismatchError
from rlserve.protocol.limits import PROTOCOL_VERSION
from rlserve.protocol.messages import Hello
from rlserve.server.throttled_log import SERVER_LOG

INFERENCE_MODES = ("remote", "local")
"""Inference modes this server offers."""

_session_ids = itertools.count(1)


@dataclass(slots=True)
class Session:
    """One client's conversation: a binary connection, or the HTTP carrier as a whole.

    Attributes:
        name: The client's name from ``hello``.
        key: The client identity that owns the episodes this session starts: ``client:<id>``
            for a ``client_id`` (binary ``hello``) or ``X-RLServe-Client`` header (HTTP), else
            one per connection.
        authenticated: Whether ``hello`` (or the HTTP header) presented the right token.
        identity_by_hello: Whether a successful ``hello`` sets ``key`` (binary connections).
            False over HTTP, where the header alone is the identity.
        own_key: The connection's own identity, taken by a ``hello`` without ``client_id``
            (the ``key`` the session was made with).
    """

    name: str = "client"
    key: str = field(default_factory=lambda: f"session-{next(_session_ids)}")
    authenticated: bool = False
    identity_by_hello: bool = True
    own_key: str = ""

    def __post_init__(self) -> None:
        if not self.own_key:
            self.own_key = self.key


def identity_key(client_id: str) -> str:
    """The episode-owner key of a client identity (the same on both carriers)."""
    return f"client:{client_id}"


def source_name(owner: str) -> str:
    """The public name of an episode owner / session key (a client's secret id hashed)."""
    if owner.startswith("client:"):
        return "client-" + hashlib.blake2b(owner.encode(), digest_size=8).hexdigest()
    return owner


def accept_hello(
    hello: Hello, session: Session, token: str | None, needs_map_agents: bool = False
) -> None:
    """Check a ``hello`` and admit its session: name, identity, authenticated.

    Args:
        hello: The client's ``hello``.
        session: The session it arrived on; changed only when the ``hello`` is accepted.
        token: The server's shared secret, or None for none.
        needs_map_agents: The server maps agents with a function: a local-inference client
            must say in its ``hello`` that it asks with ``map_agents``.

    Raises:
        VersionMismatchError: Another protocol version, an inference mode not offered, or a
            local-inference client that cannot ask ``map_agents`` of a server that needs it.
        AuthenticationError: A wrong or missing token.
    """
    if hello.protocol_version != PROTOCOL_VERSION:
        raise VersionMismatchError(
            f"client speaks protocol version {hello.protocol_version}, this server speaks "
            f"{PROTOCOL_VERSION}; install an rlserve client of the same protocol version"
        )
    if token is not None and not hmac.compare_digest((hello.token or "").encode(), token.encode()):
        raise AuthenticationError(
            "wrong or missing token; pass the server's --token value (PolicyClient(token=...), "
            "the token field of hello)"
        )
    if hello.inference_mode not in INFERENCE_MODES:
        raise VersionMismatchError(
            f"inference mode '{hello.inference_mode}' is not offered by this server; it "
            f"offers {list(INFERENCE_MODES)}"
        )
    if needs_map_agents and hello.inference_mode == "local" and not hello.map_agents:
        raise VersionMismatchError(
            "this server maps agents with a policy_mapping_fn, which a local-inference client "
            "must ask about with 'map_agents' (docs/protocol.md section 7.12), and this client "
            "does not say it can (hello 'map_agents': true); upgrade the client, connect with "
            "inference_mode='remote', or give the server mapping rules instead"
        )
    if token is None and hello.token:
        # The client believes it authenticates; nothing here checks it.
        SERVER_LOG.warn(
            "hello:token_unused",
            "a client sent a token, but this server has none and admits any client that reaches "
            "it; start the server with --token (or RLSERVE_TOKEN) to require it",
        )
    session.name = hello.client_name
    if session.identity_by_hello:
        # Every successful hello sets the identity, a later one as the first: its
        # client_id, or without one the connection's own (docs/protocol.md section 3.3).
        client_id = hello.client_id
        session.key = session.own_key if client_id is None else identity_key(client_id)
    session.authenticated = True
