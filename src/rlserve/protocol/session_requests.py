"""The records of the connection and local-inference requests.

``hello``, ``ping``, ``get_weights`` and ``report_samples``; their fields are documented once,
here and in ``docs/protocol.md``.
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
    """

    id: int
    protocol_version: int
    client_name: str = "client"
    token: str | None = None
    inference_mode: str = "remote"
    client_id: str | None = None


@dataclass(slots=True)
class Ping:
    """Liveness check (``type: ping``); answered with ``pong``."""

    id: int


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


@dataclass(slots=True)
class ReportSamples:
    """Experience collected by a local-inference client (``type: report_samples``).

    Attributes:
        id: Request id.
        batch_id: Unique per batch; a batch re-sent after a lost reply is recognised by it and
            not trained on twice.
        policy_id: The policy that acted.
        fragments: Trajectory fragments (maps; checked by the server against the policy).
        episodes: Summaries of episodes that ended (``episode_id``, ``return``, ``length``),
            for the episode metrics.
    """

    id: int
    batch_id: str
    policy_id: str
    fragments: list[dict[str, Any]]
    episodes: list[dict[str, Any]]
