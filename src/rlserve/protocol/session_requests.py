"""The records of the connection and local-inference requests, and their wire encoders.

``hello``, ``ping``, ``get_weights`` and ``report_samples``; their fields are documented once,
here and in ``docs/protocol.md``. Each record's ``to_wire`` writes the map a client sends
(``parse_request`` of it gives the record back), ``id`` last: a connection numbers the request
by setting it in place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlserve.protocol.episode_requests import DEFAULT_POLICY_ID


@dataclass(slots=True)
class Hello:
    """First request on a binary connection (``type: hello``).

    Attributes:
        id: Request id.
        protocol_version: The protocol version the client speaks.
        client_name: A label for logs and metrics.
        token: The server's shared secret, when it has one.
        inference_mode: ``remote`` (the server computes actions) or ``local``.
        client_id: A secret random id the client keeps across reconnects: episodes belong to
            it. None: the connection is the identity.
        map_agents: The client asks the server with ``map_agents`` for agents no mapping rule
            maps (a local-inference client of a server with a mapping function needs it).
    """

    id: int
    protocol_version: int
    client_name: str = "client"
    token: str | None = None
    inference_mode: str = "remote"
    client_id: str | None = None
    map_agents: bool = False

    def to_wire(self) -> dict[str, Any]:
        """The request as a map for the codec.

        ``token`` and ``client_id`` are nil when unset; ``map_agents`` is sent only when true,
        so that a hello without it is as before.
        """
        wire: dict[str, Any] = {
            "type": "hello",
            "protocol_version": self.protocol_version,
            "client_name": self.client_name,
            "token": self.token,
            "inference_mode": self.inference_mode,
            "client_id": self.client_id,
        }
        if self.map_agents:
            wire["map_agents"] = True
        wire["id"] = self.id
        return wire


@dataclass(slots=True)
class Ping:
    """Liveness check (``type: ping``); answered with ``pong``."""

    id: int

    def to_wire(self) -> dict[str, Any]:
        """The request as a map for the codec."""
        return {"type": "ping", "id": self.id}


@dataclass(slots=True)
class GetWeights:
    """Fetch a policy's model and weights for local inference (``type: get_weights``).

    Attributes:
        id: Request id.
        policy_id: The policy.
        have_version: The version the client holds; when it is still current the reply carries
            no arrays (``unchanged: true``).
    """

    id: int
    policy_id: str = DEFAULT_POLICY_ID
    have_version: int | None = None

    def to_wire(self) -> dict[str, Any]:
        """The request as a map for the codec (``have_version`` nil when unset)."""
        return {
            "type": "get_weights",
            "policy_id": self.policy_id,
            "have_version": self.have_version,
            "id": self.id,
        }


@dataclass(slots=True)
class ReportSamples:
    """Experience collected by a local-inference client (``type: report_samples``).

    Attributes:
        id: Request id.
        batch_id: Unique per batch; a batch re-sent after a lost reply is recognised by it and
            not trained on twice.
        policy_id: The policy that acted.
        fragments: Trajectory fragments in their report form
            (:func:`~rlserve.protocol.fragment.report_wire`; checked by the server against the
            policy).
        episodes: Summaries of episodes that ended (``episode_id``, ``return``, ``length``),
            for the episode metrics.
    """

    id: int
    batch_id: str
    policy_id: str
    fragments: list[dict[str, Any]]
    episodes: list[dict[str, Any]]

    def to_wire(self) -> dict[str, Any]:
        """The request as a map for the codec."""
        return {
            "type": "report_samples",
            "batch_id": self.batch_id,
            "policy_id": self.policy_id,
            "fragments": self.fragments,
            "episodes": self.episodes,
            "id": self.id,
        }
