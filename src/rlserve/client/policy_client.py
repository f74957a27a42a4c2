"""``PolicyClient``: RLlib's external-application client calls, over the rlserve protocol.

The calls and their meaning are RLlib's (``start_episode``, ``get_action``, ``log_action``,
``log_returns``, ``end_episode``, ``update_policy_weights``), plus ``truncated=`` on
``end_episode``. In remote inference mode each environment step costs one network round trip:
rewards logged with ``log_returns`` are added up on the client and travel with the next
``get_action``, ``log_action`` or ``end_episode``; ``end_episode`` is pipelined (its error, if
any, is raised by the next call). Observations are checked against the server's space before
they are sent. This module needs numpy, msgpack and gymnasium's spaces; never torch.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from gymnasium import spaces

from rlserve.client.connection import Connection, Timeouts
from rlserve.client.local import LocalConfig, LocalInference
from rlserve.config import TOKEN_ENV
from rlserve.errors import ConfigError, ConnectionLostError, SpaceError
from rlserve.protocol.messages import DEFAULT_POLICY_ID
from rlserve.spaces import check_batch, check_value, from_description


class PolicyClient:
    """Talks to an rlserve server from a simulator that runs its own loop.

    Args:
        address: ``host:port`` of the server's binary port (``http://host:port`` and
            ``tcp://host:port`` are accepted too); ``tls://host:port`` or ``https://host:port``
            connect with TLS and verify the server's certificate and host name (never falling
            back to plain text).
        inference_mode: ``remote``: the server computes actions (one round trip per step).
            ``local``: the client computes them with numpy from weights the server ships and
            sends its experience in batches from a background thread.
        update_interval: Local mode: seconds between background weight refreshes (also done
            as soon as a batch reply shows newer weights); None: only
            :meth:`update_policy_weights`.
        token: The server's token, when it has one; None: the ``RLSERVE_TOKEN`` environment
            variable, if set.
        client_name: A name for the server's logs.
        timeout: Seconds to wait for a reply.
        connect_timeout: Seconds to wait for the connection to open.
        reconnect_timeout: Seconds to keep retrying, with backoff, after the connection breaks.
        check_observations: Check observations against the space before sending (remote
            mode; local mode always checks).
        local: Local mode's batching and buffering (:class:`~rlserve.client.local.LocalConfig`).
        tls_ca: With a TLS address: a PEM CA bundle the server's certificate must chain to (for
            a private or self-signed CA); None: the ``RLSERVE_TLS_CA`` environment variable, else
            the system's trusted CAs.

    Raises:
        ConnectionLostError: The server cannot be reached.
        TLSError: The TLS handshake failed (certificate not trusted, or the server has no TLS).
        AuthenticationError: Wrong token.
        ConfigError: An invalid argument (e.g. ``tls_ca`` with a plain-text address).
    """

    def __init__(
        self,
        address: str,
        inference_mode: str = "remote",
        update_interval: float | None = 10.0,
        *,
        token: str | None = None,
        client_name: str = "python",
        timeout: float = 60.0,
        connect_timeout: float = 10.0,
        reconnect_timeout: float = 30.0,
        check_observations: bool = True,
        local: LocalConfig | None = None,
        tls_ca: str | None = None,
    ):
        if inference_mode not in ("remote", "local"):
            raise ConfigError(f"inference_mode must be 'remote' or 'local', got '{inference_mode}'")
        self.address = address
        self.inference_mode = inference_mode
        self.update_interval = update_interval
        self.check_observations = check_observations
        timeouts = Timeouts(connect=connect_timeout, request=timeout, reconnect=reconnect_timeout)
        if token is None:
            token = os.environ.get(TOKEN_ENV) or None

        def connect() -> Connection:
            return Connection(address, token, client_name, inference_mode, timeouts, tls_ca)

        self._conn = connect()
        self._pending_reward: dict[str, float] = {}
        self._acted: set[str] = set()
        self._welcome(self._open_first())
        self._local: LocalInference | None = None
        if inference_mode == "local":

            def open_another() -> Connection:
                conn = connect()
                conn.open()
                return conn

            self._local = LocalInference(
                self._conn,
                open_another,
                self.observation_space,
                self.action_space,
                update_interval,
                local or LocalConfig(),
                timeouts,
            )

    def _open_first(self) -> dict[str, Any]:
        try:
            return self._conn.open()
        except ConnectionLostError as exc:
            if self._conn.tls or not self._conn.tcp_connected:
                raise
            # Connected, then cut off before the welcome: what a TLS server does to plain text.
            raise ConnectionLostError(
                f"{exc}; if the server was started with --tls-cert, connect with "
                f"tls://{self._conn.host}:{self._conn.port}"
            ) from exc

    def _welcome(self, welcome: dict[str, Any]) -> None:
        if getattr(self, "_instance_id", None) not in (None, welcome.get("instance_id")):
            # The server restarted: the episodes this client had open are gone there.
            self._pending_reward.clear()
            self._acted.clear()
        self._instance_id = welcome.get("instance_id")
        policy = welcome["policies"][DEFAULT_POLICY_ID]
        self.observation_space: spaces.Space[Any] = from_description(policy["observation_space"])
        self.action_space: spaces.Space[Any] = from_description(policy["action_space"])
        self._discrete = isinstance(self.action_space, spaces.Discrete)

    # -- transport with one retry after a reconnect ------------------------------------------

    def _request(self, message: dict[str, Any]) -> dict[str, Any]:
        try:
            return self._conn.request(dict(message))
        except ConnectionLostError:
            self._welcome(self._conn.reconnect())
            return self._conn.request(dict(message))

    def _send_nowait(self, message: dict[str, Any]) -> None:
        try:
            self._conn.send_nowait(dict(message))
        except ConnectionLostError:
            self._welcome(self._conn.reconnect())
            self._conn.send_nowait(dict(message))

    # -- the RLlib calls ---------------------------------------------------------------------

    def start_episode(self, episode_id: str | None = None, training_enabled: bool = True) -> str:
        """Start an episode and return its id.

        Args:
            episode_id: A unique id, or None for the server to assign one.
            training_enabled: False serves actions but keeps the episode out of training.

        Raises:
            EpisodeError: The id is active or was used before.
        """
        if self._local is not None:
            return self._local.start_episode(episode_id, training_enabled)
        reply = self._request(
            {
                "type": "start_episode",
                "episode_id": episode_id,
                "training_enabled": training_enabled,
            }
        )
        return str(reply["episode_id"])

    def get_action(self, episode_id: str | Sequence[str], observation: Any) -> Any:
        """Record an observation and return the policy's action.

        Args:
            episode_id: An episode id; or a list of ids to act in several episodes at once
                (a vector of environments), with ``observation`` a dict keyed by id or a
                stacked array / list in the same order.
            observation: The current observation.

        Returns:
            The action (an int for Discrete, an array for Box). For a list of ids: a dict of
            actions keyed by id when ``observation`` was a dict, else a stacked array.
        """
        if self._local is not None:
            return self._local_get_action(episode_id, observation)
        if isinstance(episode_id, str):
            obs = self._check_one(observation)
            message: dict[str, Any] = {
                "type": "get_action",
                "episode_id": episode_id,
                "observation": obs,
            }
            reward = self._pending_reward.get(episode_id)
            if reward is not None:
                message["reward"] = reward
            reply = self._request(message)
            self._delivered([episode_id])
            return reply["action"]
        ids = list(episode_id)
        keyed = isinstance(observation, Mapping)
        values = [observation[eid] for eid in ids] if keyed else observation
        stacked = self._check_many(values, len(ids))
        rewards = [self._pending_reward.get(eid, 0.0) for eid in ids]
        reply = self._request(
            {"type": "get_action", "episode_ids": ids, "observations": stacked, "rewards": rewards}
        )
        self._delivered(ids)
        actions = reply["actions"]
        if keyed:
            return {eid: self._one_action(actions[i]) for i, eid in enumerate(ids)}
        return actions

    def log_action(self, episode_id: str, observation: Any, action: Any) -> None:
        """Record an observation and the action someone else took (trained on as taken)."""
        if self._local is not None:
            self._local.log_action(episode_id, observation, action)
            return
        message: dict[str, Any] = {
            "type": "log_action",
            "episode_id": episode_id,
            "observation": self._check_one(observation),
            "action": check_value(self.action_space, action, "action"),
        }
        reward = self._pending_reward.get(episode_id)
        if reward is not None:
            message["reward"] = reward
        self._request(message)
        self._delivered([episode_id])

    def log_returns(
        self,
        episode_id: str,
        reward: float,
        info: dict[str, Any] | None = None,
        multiagent_done_dict: dict[str, bool] | None = None,
    ) -> None:
        """Add reward to the episode's previous action (rewards add up until the next action).

        While the episode has had an action, the reward is kept here and sent with the next call
        for the episode (one round trip per step); otherwise, or with ``info``, it is sent now.

        Raises:
            EpisodeError: No action was taken in this episode yet (raised by the server).
            NotImplementedError: ``multiagent_done_dict`` (multi-agent episodes come later).
        """
        if multiagent_done_dict is not None:
            raise NotImplementedError("multi-agent episodes are not available in this version")
        if self._local is not None:
            self._local.log_returns(episode_id, reward)
            return
        if episode_id in self._acted and info is None:
            self._pending_reward[episode_id] = self._pending_reward.get(episode_id, 0.0) + float(
                reward
            )
            return
        message: dict[str, Any] = {
            "type": "log_returns",
            "episode_id": episode_id,
            "reward": float(reward) + self._pending_reward.get(episode_id, 0.0),
        }
        if info is not None:
            message["info"] = info
        self._request(message)
        self._pending_reward.pop(episode_id, None)

    def end_episode(self, episode_id: str, observation: Any, truncated: bool = False) -> None:
        """Finish an episode with its final observation.

        Args:
            episode_id: The episode.
            observation: The final observation.
            truncated: True when a time limit cut the episode short (the learner then
                bootstraps from ``observation``); False for a terminal state.
        """
        if self._local is not None:
            self._local.end_episode(episode_id, observation, truncated)
            return
        message: dict[str, Any] = {
            "type": "end_episode",
            "episode_id": episode_id,
            "observation": self._check_one(observation),
            "truncated": bool(truncated),
        }
        reward = self._pending_reward.pop(episode_id, None)
        if reward is not None:
            message["reward"] = reward
        self._acted.discard(episode_id)
        self._send_nowait(message)

    def update_policy_weights(self) -> None:
        """Fetch the newest weights now (local mode); in remote mode the server always has them."""
        if self._local is not None:
            self._local.update_weights()

    def close(self) -> None:
        """Disconnect.

        Local mode first ships what is buffered; remote mode reads outstanding replies (raising
        a deferred error).
        """
        if self._local is not None:
            self._local.close()
            return
        self._conn.close()

    @property
    def weights_version(self) -> int | None:
        """Version of the weights acting in local mode (None in remote mode)."""
        return None if self._local is None else self._local.policy.version

    @property
    def local(self) -> LocalInference | None:
        """The local-inference engine (buffer and shipping counters), in local mode."""
        return self._local

    def __enter__(self) -> PolicyClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- helpers -----------------------------------------------------------------------------

    def _check_one(self, observation: Any) -> Any:
        if not self.check_observations:
            return _plain(observation)
        value = check_value(self.observation_space, observation, "observation")
        return _plain(value)

    def _check_many(self, values: Any, count: int) -> Any:
        if isinstance(self.observation_space, spaces.Box):
            if self.check_observations:
                check_batch(self.observation_space, values, count, "observations")
            try:
                return np.asarray(values, dtype=self.observation_space.dtype)
            except (TypeError, ValueError) as exc:
                raise SpaceError(f"observations: cannot be read as numbers: {exc}") from exc
        return [self._check_one(v) for v in values]

    def _delivered(self, episode_ids: list[str]) -> None:
        # Only once the server accepted the call: a refused call leaves the pending rewards
        # and the episode's state as they were.
        for episode_id in episode_ids:
            self._pending_reward.pop(episode_id, None)
            self._acted.add(episode_id)

    def _local_get_action(self, episode_id: str | Sequence[str], observation: Any) -> Any:
        assert self._local is not None
        if isinstance(episode_id, str):
            return self._local.get_one_action(episode_id, observation)
        ids = list(episode_id)
        keyed = isinstance(observation, Mapping)
        values = [observation[eid] for eid in ids] if keyed else observation
        actions = self._local.get_action(ids, values)
        if keyed:
            return {eid: self._one_action(actions[i]) for i, eid in enumerate(ids)}
        return actions

    def _one_action(self, action: Any) -> Any:
        return int(action) if self._discrete else action

    @property
    def reconnects(self) -> int:
        """How many times the connection was re-opened."""
        return self._conn.reconnects


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value
