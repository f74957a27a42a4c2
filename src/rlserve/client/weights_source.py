"""A local-inference client's weights connection: weights fetched, and agents mapped, re-sent.

:class:`WeightsSource` owns the connection the refresher thread and the caller's thread share
(its lock), and turns ``weights`` replies into :class:`~rlserve.policy.NumpyPolicy` objects. Each
policy it builds samples from its own child of the client's ``SeedSequence``. After a move to
another server (a restart, or another front-end: another ``instance_id``) the whole set of
weights is fetched, since two servers may both be at one version with other weights.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from rlserve.client.connection import Connection, Timeouts
from rlserve.errors import ConnectionLostError
from rlserve.policy import ModelSpec, NumpyPolicy
from rlserve.protocol.multi_agent_requests import MapAgents
from rlserve.protocol.replies import AgentsMapped, WeightsReply
from rlserve.protocol.session_requests import GetWeights

T = TypeVar("T")


class WeightsSource:
    """Fetches a local-inference client's weights (and asks ``map_agents``) on one connection.

    Args:
        conn: The open weights connection.
        timeouts: How long a call is re-sent while the connection is lost (``reconnect``).
        seed: Entropy of the client's sampling ``SeedSequence``; None: fresh entropy.
    """

    def __init__(self, conn: Connection, timeouts: Timeouts, seed: int | None) -> None:
        self.conn = conn
        self.lock = threading.Lock()
        """Held around every use of the connection (the refresher and the caller share it)."""
        self._timeouts = timeouts
        self._seeds = np.random.SeedSequence(seed)
        self._served_by: dict[str, Any] = {}
        """Policy id -> the ``instance_id`` of the server its acting weights came from."""

    def fetch(self, policy_id: str, current: NumpyPolicy | None) -> NumpyPolicy:
        """The newest weights of ``policy_id``: ``current`` itself when they have not changed.

        Raises:
            ConnectionLostError: The connection broke.
            ServerError: The server refused the request.
        """
        with self.lock:
            welcome = self.conn.welcome
            instance = welcome.instance_id if welcome is not None else None
            have = None if current is None else current.version
            if self._served_by.get(policy_id) != instance:
                have = None  # another server (restarted, or another front-end): the whole set
            raw = self.conn.request(GetWeights(0, policy_id, have).to_wire())
        reply = WeightsReply.from_wire(raw)
        if reply.unchanged and current is not None:
            return current
        self._served_by[policy_id] = instance
        assert reply.model is not None and reply.arrays is not None
        with self.lock:
            # Each swapped-in policy samples from its own child of this client's stream.
            child = self._seeds.spawn(1)[0]
        spec = ModelSpec.from_wire(reply.model)
        arrays = {str(k): np.asarray(v) for k, v in reply.arrays.items()}
        seed = int(child.generate_state(1, np.uint64)[0])
        return NumpyPolicy(spec, arrays, reply.version, seed=seed)

    def fetch_retrying(self, policy_id: str, current: NumpyPolicy | None) -> NumpyPolicy:
        """:meth:`fetch`, re-sent after a lost reply or a timeout within the reconnect timeout.

        ``get_weights`` is safe to repeat (e.g. while the server waits for its first weights).
        """
        return self._retrying(lambda: self.fetch(policy_id, current))

    def map_agents(self, episode_id: str, agent_ids: list[str]) -> list[str]:
        """Ask the server's mapping function which policy acts for new agents of an episode.

        ``map_agents`` is safe to repeat, so it is re-sent like ``get_weights``.
        """

        def ask() -> list[str]:
            with self.lock:
                raw = self.conn.request(MapAgents(0, episode_id, agent_ids).to_wire())
            return AgentsMapped.from_wire(raw, len(agent_ids)).policy_ids

        return self._retrying(ask)

    def _retrying(self, call: Callable[[], T]) -> T:
        """``call()`` on the connection, again after a reconnection while it is lost."""
        deadline: float | None = None
        while True:
            try:
                return call()
            except ConnectionLostError:
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self._timeouts.reconnect
                if now >= deadline:
                    raise
                with self.lock:
                    self.conn.reconnect(deadline)
