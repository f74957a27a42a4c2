"""Protocol version 1's replies: each reply's record, its encoder and the client's decoder.

The server builds every reply here (``to_wire``) and the client reads the fields it uses
through the same records (``from_wire``), so each reply's shape is written once. The reply to a
request carries the request's ``id`` (``None`` in an ``error`` about the connection itself).
The ``action`` reply is on the per-step path of both sides: it is built and read by plain
functions (:func:`action_reply`, :func:`actions_reply`, :func:`action_of`, :func:`actions_of`)
rather than a record. Decoders read what a client needs and ignore fields they do not know, so
a newer server's additions do not break an older client.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlserve.errors import DecodeError
from rlserve.protocol.limits import PROTOCOL_VERSION, Limits


def _map(raw: Any, kind: str) -> dict[str, Any]:
    """``raw`` as a reply map of type ``kind``, or a DecodeError saying what came instead."""
    if not isinstance(raw, dict) or raw.get("type") != kind:
        got = raw.get("type") if isinstance(raw, dict) else type(raw).__name__
        raise DecodeError(f"expected a '{kind}' reply, got {got!r}")
    return raw


@dataclass(frozen=True, slots=True)
class Welcome:
    """The reply to ``hello`` (``type: welcome``): what the server serves and its limits.

    Attributes:
        id: The ``hello``'s id.
        server_version: The server's package version.
        policies: Policy id -> ``{"observation_space": ..., "action_space": ...}``, each a space
            description (:func:`~rlserve.protocol.spaces.describe`).
        mapping: The agent -> policy rules
            (:meth:`~rlserve.protocol.mapping.PolicyMapping.to_wire`).
        multi_agent: Whether the server was declared multi-agent (dict observations are one
            per agent).
        inference_modes: The inference modes offered.
        instance_id: Random per server start: another one after a reconnection means the
            server restarted.
        limits: The server's wire limits.
        protocol_version: The protocol version the server speaks (this package's: a server of
            another version refuses the ``hello``).
        map_agents: The server maps agents that no rule maps with a function of its own: a
            local-inference client asks it with ``map_agents`` (sent only when true).
    """

    id: int | None
    server_version: str
    policies: dict[str, dict[str, Any]]
    mapping: list[list[str]] | None
    multi_agent: bool
    inference_modes: list[str]
    instance_id: str | None
    limits: Limits
    protocol_version: int = PROTOCOL_VERSION
    map_agents: bool = False

    def to_wire(self) -> dict[str, Any]:
        """The reply as a map for the codec."""
        wire: dict[str, Any] = {
            "type": "welcome",
            "id": self.id,
            "protocol_version": self.protocol_version,
            "server_version": self.server_version,
            "policies": self.policies,
            "mapping": self.mapping,
            "multi_agent": self.multi_agent,
            "inference_modes": self.inference_modes,
            "instance_id": self.instance_id,
            "limits": self.limits.to_wire(),
        }
        if self.map_agents:
            wire["map_agents"] = True
        return wire

    @classmethod
    def from_wire(cls, raw: Any) -> Welcome:
        """Read a ``welcome`` (limits the client does not know are ignored).

        Raises:
            DecodeError: Not a ``welcome``, or without a map of policies.
        """
        raw = _map(raw, "welcome")
        policies = raw.get("policies")
        if not isinstance(policies, dict):
            raise DecodeError("a 'welcome' needs the map 'policies'")
        return cls(
            raw.get("id"),
            str(raw.get("server_version", "")),
            policies,
            raw.get("mapping"),
            bool(raw.get("multi_agent", False)),
            list(raw.get("inference_modes") or []),
            raw.get("instance_id"),
            Limits.from_wire(raw.get("limits") or {}),
            map_agents=raw.get("map_agents") is True,
        )


@dataclass(frozen=True, slots=True)
class EpisodeStarted:
    """The reply to ``start_episode`` (``type: episode_started``).

    Attributes:
        id: The request's id.
        episode_id: The episode's id (the client's, or one the server chose).
    """

    id: int
    episode_id: str

    def to_wire(self) -> dict[str, Any]:
        """The reply as a map for the codec."""
        return {"type": "episode_started", "id": self.id, "episode_id": self.episode_id}

    @classmethod
    def from_wire(cls, raw: Any) -> EpisodeStarted:
        """Read an ``episode_started``.

        Raises:
            DecodeError: Not an ``episode_started``.
        """
        raw = _map(raw, "episode_started")
        return cls(raw.get("id", 0), str(raw.get("episode_id")))


@dataclass(frozen=True, slots=True)
class AgentsMapped:
    """The reply to ``map_agents`` (``type: agents_mapped``).

    Attributes:
        id: The request's id.
        policy_ids: The policy of each agent of the request, in its order.
    """

    id: int
    policy_ids: list[str]

    def to_wire(self) -> dict[str, Any]:
        """The reply as a map for the codec."""
        return {"type": "agents_mapped", "id": self.id, "policy_ids": self.policy_ids}

    @classmethod
    def from_wire(cls, raw: Any, count: int) -> AgentsMapped:
        """Read an ``agents_mapped`` answering a request for ``count`` agents.

        Raises:
            DecodeError: Not an ``agents_mapped``, or not one policy id (string) per agent.
        """
        raw = _map(raw, "agents_mapped")
        ids = raw.get("policy_ids")
        if (
            not isinstance(ids, list)
            or len(ids) != count
            or not all(isinstance(p, str) for p in ids)
        ):
            raise DecodeError(f"an 'agents_mapped' needs 'policy_ids': {count} strings")
        return cls(raw.get("id", 0), ids)


@dataclass(frozen=True, slots=True)
class Ok:
    """The reply to ``log_action``, ``log_returns`` and ``end_episode`` (``type: ok``)."""

    id: int

    def to_wire(self) -> dict[str, Any]:
        """The reply as a map for the codec."""
        return {"type": "ok", "id": self.id}


@dataclass(frozen=True, slots=True)
class Pong:
    """The reply to ``ping`` (``type: pong``)."""

    id: int

    def to_wire(self) -> dict[str, Any]:
        """The reply as a map for the codec."""
        return {"type": "pong", "id": self.id}


def action_reply(request_id: int, action: Any) -> dict[str, Any]:
    """The ``action`` reply to a ``get_action`` of one episode (``episode_id``)."""
    return {"type": "action", "id": request_id, "action": action}


def actions_reply(request_id: int, actions: Any) -> dict[str, Any]:
    """The ``action`` reply to a batched or multi-agent ``get_action``: one action each."""
    return {"type": "action", "id": request_id, "actions": actions}


def action_of(reply: dict[str, Any]) -> Any:
    """The action of an :func:`action_reply`, as decoded."""
    return reply["action"]


def actions_of(reply: dict[str, Any]) -> Any:
    """The actions of an :func:`actions_reply`, as decoded (an array or a list)."""
    return reply["actions"]


@dataclass(frozen=True, slots=True)
class WeightsReply:
    """The reply to ``get_weights`` (``type: weights``).

    Attributes:
        id: The request's id.
        policy_id: The policy.
        version: The version of its current weights.
        unchanged: The client holds this version already: no model and no arrays.
        model: The model description (:meth:`~rlserve.policy.ModelSpec.to_wire`), or None
            when unchanged.
        arrays: The weights by name, or None when unchanged.
    """

    id: int
    policy_id: str
    version: int
    unchanged: bool
    model: dict[str, Any] | None = None
    arrays: dict[str, Any] | None = None

    def to_wire(self) -> dict[str, Any]:
        """The reply as a map for the codec."""
        wire: dict[str, Any] = {
            "type": "weights",
            "id": self.id,
            "policy_id": self.policy_id,
            "version": self.version,
            "unchanged": self.unchanged,
        }
        if not self.unchanged:
            wire["model"] = self.model
            wire["arrays"] = self.arrays
        return wire

    @classmethod
    def from_wire(cls, raw: Any) -> WeightsReply:
        """Read a ``weights`` reply.

        Raises:
            DecodeError: Not a ``weights`` reply, or changed weights without model or arrays.
        """
        raw = _map(raw, "weights")
        unchanged = bool(raw.get("unchanged"))
        model, arrays = raw.get("model"), raw.get("arrays")
        if not unchanged and (not isinstance(model, dict) or not isinstance(arrays, dict)):
            raise DecodeError("a 'weights' reply of new weights needs 'model' and 'arrays' maps")
        return cls(
            raw.get("id", 0),
            str(raw.get("policy_id")),
            int(raw["version"]),
            unchanged,
            model,
            arrays,
        )


@dataclass(frozen=True, slots=True)
class SamplesAccepted:
    """The reply to ``report_samples`` (``type: samples_accepted``).

    Attributes:
        id: The request's id.
        batch_id: The batch.
        steps: Steps of the batch handed to the learner.
        duplicate: The batch was accepted before (a re-sent batch; not trained on again).
        dropped_steps: Steps the learner dropped unread because it fell behind; None when
            the batch was answered from memory (a duplicate of an earlier one).
        weights_version: The current weights version of the report's policy; None as
            ``dropped_steps``.
    """

    id: int
    batch_id: str
    steps: int
    duplicate: bool
    dropped_steps: int | None = None
    weights_version: int | None = None

    def to_wire(self) -> dict[str, Any]:
        """The reply as a map for the codec."""
        wire: dict[str, Any] = {
            "type": "samples_accepted",
            "id": self.id,
            "batch_id": self.batch_id,
            "steps": self.steps,
            "duplicate": self.duplicate,
        }
        if self.dropped_steps is not None:
            wire["dropped_steps"] = self.dropped_steps
        if self.weights_version is not None:
            wire["weights_version"] = self.weights_version
        return wire

    @classmethod
    def from_wire(cls, raw: Any) -> SamplesAccepted:
        """Read a ``samples_accepted`` (counts that are not integers read as absent).

        Raises:
            DecodeError: Not a ``samples_accepted``.
        """
        raw = _map(raw, "samples_accepted")
        dropped, version = raw.get("dropped_steps"), raw.get("weights_version")
        return cls(
            raw.get("id", 0),
            str(raw.get("batch_id")),
            int(raw.get("steps", 0)),
            bool(raw.get("duplicate")),
            dropped if isinstance(dropped, int) else None,
            version if isinstance(version, int) else None,
        )


@dataclass(frozen=True, slots=True)
class ErrorReply:
    """A request that failed, or a connection refused (``type: error``).

    Attributes:
        id: The failed request's id; None when it could not be read, or when the error is about
            the connection itself.
        code: A machine-readable code, e.g. ``episode_error`` (see ``docs/protocol.md``).
        message: What was wrong and how to fix it.
    """

    id: int | None
    code: str
    message: str

    def to_wire(self) -> dict[str, Any]:
        """The reply as a map for the codec."""
        return {"type": "error", "id": self.id, "code": self.code, "message": self.message}

    @classmethod
    def of(cls, reply: dict[str, Any]) -> ErrorReply | None:
        """The error a decoded reply is, or None when it is not an ``error``."""
        if reply.get("type") != "error":
            return None
        request_id = reply.get("id")
        return cls(
            request_id if isinstance(request_id, int) else None,
            str(reply.get("code")),
            str(reply.get("message")),
        )
