"""Protocol version 1: messages, codec, framing and limits. No sockets here."""

from rlserve.protocol.limits import DEFAULT_LIMITS, PROTOCOL_VERSION, Limits

__all__ = ["DEFAULT_LIMITS", "PROTOCOL_VERSION", "Limits"]
