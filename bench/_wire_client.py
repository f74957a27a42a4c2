"""A client of the binary protocol with no layers: how much of a remote step is the client's code?

``bench/remote_inference.py --client wire`` runs its client loop with :class:`WireClient`
instead of :class:`rlserve.PolicyClient`, against the same real ``rlserve serve``. Per step it
sends the very frame the echo limit's client sends (:class:`_loopback_limit.EchoClient`, byte
for byte the frame ``PolicyClient`` sends for a single-episode ``get_action``) and reads the
``action`` reply; unlike the echo client it also speaks the rest of the protocol a real
episode needs (``docs/protocol.md`` sections 3.3 and 7): ``hello`` once, ``start_episode`` and
``end_episode`` pipelined (sent without waiting, their replies read on the way to the next
``get_action``'s), ``seq`` on every call. No observation check, no re-send after a lost
connection, no bookkeeping beyond the episode's ``seq`` and pending reward: the least a correct
client can do per step in Python, so that the figures of ``PolicyClient`` can be read against
it in the same run.
"""

from __future__ import annotations

import uuid
from typing import Any

from _loopback_limit import EchoClient, float32_ext


class WireClient(EchoClient):
    """The benchmark loop's four calls over the binary protocol, nothing more.

    Args:
        address: ``host:port`` of an ``rlserve serve`` binary port (no token, no TLS).
        index: Names the client in the server's logs.
    """

    def __init__(self, address: str, index: int = 0):
        super().__init__(address, index)
        self._unanswered: set[int] = set()
        welcome = self._request(
            {"type": "hello", "protocol_version": 1, "client_name": f"wire-{index}"}
        )
        if welcome.get("type") != "welcome":
            raise RuntimeError(f"the server refused the hello: {welcome!r}")

    def start_episode(self, training_enabled: bool = True) -> str:
        """Send ``start_episode`` with a fresh id; its reply is read before the next call's."""
        episode_id = uuid.uuid4().hex
        message = {"type": "start_episode", "episode_id": episode_id}
        message["training_enabled"] = training_enabled
        self._send(message)
        self._seq[episode_id] = 0
        return episode_id

    def get_action(self, episode_id: str, observation: Any) -> int:
        """The echo client's ``get_action`` frame, its reply read past pipelined ones."""
        return int(self._request(self._get_action_message(episode_id, observation))["action"])

    def end_episode(self, episode_id: str, observation: Any, truncated: bool = False) -> None:
        """Send ``end_episode`` with the pending reward; its reply is read before the next."""
        message = {
            "type": "end_episode",
            "episode_id": episode_id,
            "observation": float32_ext(observation),
            "truncated": truncated,
            "seq": self._seq.pop(episode_id) + 1,
        }
        reward = self._reward.pop(episode_id, None)
        if reward is not None:
            message["reward"] = reward
        self._send(message)

    def close(self) -> None:
        """Read the last pipelined replies, then close."""
        while self._unanswered:
            self._answer(self._read_frame())
        super().close()

    def _send(self, message: dict[str, Any]) -> int:
        request_id = super()._send(message)
        self._unanswered.add(request_id)
        return request_id

    def _request(self, message: dict[str, Any]) -> dict[str, Any]:
        request_id = self._send(message)
        while True:
            reply = self._read_frame()
            if self._answer(reply) == request_id:
                return reply

    def _answer(self, reply: dict[str, Any]) -> int:
        """Check one reply (an ``error`` is raised); the id of the request it answers."""
        if reply.get("type") == "error":
            raise RuntimeError(f"the server answered {reply!r}")
        request_id = int(reply["id"])
        self._unanswered.discard(request_id)
        return request_id
