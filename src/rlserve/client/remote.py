"""Remote inference: the server computes every action, one round trip per environment step.

Rewards (and ``info`` maps) logged with ``log_returns`` are added up here and travel with the
next ``get_action``, ``log_action`` or ``end_episode`` of the episode; ``end_episode`` and
``start_episode`` with a random id are pipelined (an error, if any, is raised by the next call,
naming the call and episode it belongs to), so an episode costs one round trip per step and
none at its start or end.
Observations are checked against the server's space before they are sent. The calls are sent
by a :class:`~rlserve.client.remote_session.RemoteSession`; multi-agent episodes are
:class:`~rlserve.client.remote_agents.RemoteAgents`' business.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

import numpy as np
from gymnasium import spaces

from rlserve.client.connection import Connection, Timeouts
from rlserve.client.engine import ServerView
from rlserve.client.observation_check import ObservationCheck
from rlserve.client.remote_agents import RemoteAgents
from rlserve.client.remote_session import RemoteSession
from rlserve.errors import SpaceError
from rlserve.protocol.episode_requests import (
    DEFAULT_POLICY_ID,
    EndEpisode,
    GetAction,
    LogAction,
    LogReturns,
    StartEpisode,
    get_action_wire,
)
from rlserve.protocol.info import merged_info
from rlserve.protocol.replies import EpisodeStarted, action_of, actions_of
from rlserve.protocol.spaces import check_batch, check_value
from rlserve.protocol.values import MAX_ABS_REWARD


class RemoteEngine:
    """The remote-mode :class:`~rlserve.client.engine.Engine` behind :class:`~rlserve.PolicyClient`.

    Args:
        conn: The client's open connection.
        timeouts: Connection timeouts (``reconnect``: how long a call is re-sent).
        view: The server's welcome, shared with the client.
        check_observations: Check observations against the space before sending.
    """

    def __init__(
        self, conn: Connection, timeouts: Timeouts, view: ServerView, check_observations: bool
    ):
        self._view = view
        self._check_observations = check_observations
        self._observation_check = ObservationCheck(view.observation_space, check_observations)
        # Per episode: the reward and info logged since its last action, sent with the next.
        self._pending_reward: dict[str, float] = {}
        self._pending_info: dict[str, dict[str, Any]] = {}
        self._session = RemoteSession(conn, timeouts, view, self._forget, self._drop)
        self._agents = RemoteAgents(self._session, view, check_observations)

    def _forget(self) -> None:
        """The server restarted: drop what was kept for its episodes."""
        self._pending_reward.clear()
        self._pending_info.clear()
        self._agents.forget()

    def _drop(self, episode_id: str) -> None:
        """``episode_id`` never opened on the server: drop what was kept for it."""
        self._pending_reward.pop(episode_id, None)
        self._pending_info.pop(episode_id, None)
        self._agents.drop(episode_id)

    def start_episode(
        self, episode_id: str | None, training_enabled: bool, policy_id: str | None = None
    ) -> str:
        """Start an episode on the server (a random id for None, so a retry is recognised).

        A random id is started pipelined, without waiting for the reply: a fresh ``uuid4`` is
        never taken, and this client's episode limit is checked here (the episodes it holds
        against the welcome's ``max_episodes_per_client``), so only a server limit can refuse
        it (the server-wide one, or the per-client one when other client objects share this
        ``client_id``), and that error is raised by the next call that waits for a reply. A
        chosen id, or a start at this client's limit, waits for the reply and raises here.
        """
        chosen = episode_id or uuid.uuid4().hex
        start = StartEpisode(
            0, chosen, training_enabled, DEFAULT_POLICY_ID if policy_id is None else policy_id
        )
        session = self._session
        room = session.conn.limits.max_episodes_per_client - len(session.open)
        if episode_id is None and room > 1:
            session.send_nowait(start.to_wire(), settle=False)
            session.started(chosen)
            return chosen
        started = EpisodeStarted.from_wire(session.request(start.to_wire())).episode_id
        session.started(started)
        return started

    def get_one_action(self, episode_id: str, observation: Any) -> Any:
        """One ``get_action`` round trip, with the reward and info logged since the last."""
        session = self._session
        if episode_id in session.lost:
            session.check_not_lost([episode_id])
        seq = session.next_seq(episode_id)
        message = get_action_wire(
            0,
            episode_id,
            self._check_one(observation),
            seq,
            self._pending_reward.get(episode_id),
            self._pending_info.get(episode_id),
        )
        reply = session.request(message)
        # Delivered (as in _delivered, without its lists): the pending reward and info went.
        self._pending_reward.pop(episode_id, None)
        self._pending_info.pop(episode_id, None)
        session.seq[episode_id] = seq
        return self._view.action(action_of(reply))

    def get_actions(self, episode_ids: list[str], observations: Any, keyed: bool) -> Any:
        """One batched ``get_action`` round trip for several episodes."""
        session = self._session
        session.check_not_lost(episode_ids)
        stacked = self._check_many(observations, len(episode_ids))
        rewards = [self._pending_reward.get(eid, 0.0) for eid in episode_ids]
        seqs = [session.next_seq(eid) for eid in episode_ids]
        infos = None
        if any(eid in self._pending_info for eid in episode_ids):
            infos = [self._pending_info.get(eid) for eid in episode_ids]
        batch = GetAction(0, episode_ids, stacked, rewards, True, seqs, infos)
        reply = session.request(batch.to_wire())
        self._delivered(episode_ids, seqs)
        actions = actions_of(reply)
        if keyed:
            return self._view.by_episode(episode_ids, actions)
        # Dict and Tuple actions arrive as a list (one per episode), the others stacked.
        if isinstance(actions, np.ndarray):
            return actions
        return [self._view.action(a) for a in actions]

    def log_action(self, episode_id: str, observation: Any, action: Any) -> None:
        """One ``log_action`` round trip, with the reward and info logged since the last."""
        session = self._session
        if episode_id in session.lost:
            session.check_not_lost([episode_id])
        seq = session.next_seq(episode_id)
        message = LogAction(
            0,
            episode_id,
            self._check_one(observation),
            check_value(self._view.action_space, action, "action"),
            self._pending_reward.get(episode_id),
            seq,
            self._pending_info.get(episode_id),
        )
        session.request(message.to_wire())
        self._delivered([episode_id], [seq])

    def log_returns(
        self, episode_id: str, reward: float, info: dict[str, Any] | None = None
    ) -> None:
        """Keep the reward and info for the episode's next call.

        An episode this client did not start (another client object with the same
        ``client_id``, or an unknown id) gets them at once, so that this call reports an
        unknown id.
        """
        session = self._session
        if episode_id in session.lost:
            session.check_not_lost([episode_id])
        total = self._pending_reward.get(episode_id, 0.0) + reward
        if not -MAX_ABS_REWARD <= total <= MAX_ABS_REWARD:
            raise SpaceError(
                f"log_returns for episode '{episode_id}': reward {reward!r} makes the rewards "
                f"logged since the last action add up to {total!r}; a step's reward must be "
                f"within -{MAX_ABS_REWARD:g}..{MAX_ABS_REWARD:g}"
            )
        pending = self._pending_info.get(episode_id)
        merged = (
            pending
            if info is None
            else merged_info(
                pending,
                info,
                session.conn.limits.max_info_bytes,
                f"log_returns for episode '{episode_id}'",
            )
        )
        if episode_id not in session.open:
            seq = session.next_seq(episode_id)
            session.request(LogReturns(0, episode_id, total, merged, seq).to_wire())
            self._pending_reward.pop(episode_id, None)
            self._pending_info.pop(episode_id, None)
            session.seq[episode_id] = seq
            return
        self._pending_reward[episode_id] = total
        if merged is not None:
            self._pending_info[episode_id] = merged

    def end_episode(self, episode_id: str, observation: Any, truncated: bool) -> None:
        """Send ``end_episode`` pipelined: the episode is over here, its error comes later."""
        session = self._session
        if episode_id in session.lost:
            session.check_not_lost([episode_id])
        seq = session.next_seq(episode_id)
        end = EndEpisode(
            0,
            episode_id,
            self._check_one(observation),
            bool(truncated),
            self._pending_reward.get(episode_id),
            seq,
            self._pending_info.get(episode_id),
        )
        session.send_nowait(end.to_wire())
        self._pending_reward.pop(episode_id, None)
        self._pending_info.pop(episode_id, None)
        session.ended(episode_id, seq)

    def get_agent_actions(self, episode_id: str, observation: Any) -> dict[str, Any]:
        """See :meth:`RemoteAgents.get_actions`."""
        return self._agents.get_actions(episode_id, observation)

    def log_agent_actions(self, episode_id: str, observation: Any, action: Any) -> None:
        """See :meth:`RemoteAgents.log_actions`."""
        self._agents.log_actions(episode_id, observation, action)

    def log_agent_returns(
        self,
        episode_id: str,
        rewards: dict[str, float],
        infos: dict[str, dict[str, Any]],
        done: dict[str, bool],
    ) -> None:
        """See :meth:`RemoteAgents.log_returns`."""
        self._agents.log_returns(episode_id, rewards, infos, done)

    def end_agent_episode(
        self, episode_id: str, observation: Mapping[str, Any], truncated: bool
    ) -> None:
        """See :meth:`RemoteAgents.end_episode`."""
        self._agents.end_episode(episode_id, observation, truncated)

    def update_weights(self) -> None:
        """Nothing to fetch: the server acts with its newest weights."""

    def stop_waiting(self) -> None:
        """Nothing waits for room here: a call waits for its reply, bounded by the timeouts."""

    def close(self, timeout: float) -> None:
        """Read outstanding replies (raising a deferred error) and disconnect.

        ``timeout`` is unused: the connection's request timeout bounds the wait.
        """
        self._session.close()

    @property
    def weights_version(self) -> int | None:
        """None: the weights act on the server."""
        return None

    # -- helpers -----------------------------------------------------------------------------

    def _check_one(self, observation: Any) -> Any:
        check = self._observation_check
        if check.space is not self._view.observation_space:
            check = self._new_observation_check()
        return check(observation)

    def _new_observation_check(self) -> ObservationCheck:
        """A check for the space of the latest welcome (a restarted server may declare another)."""
        self._observation_check = ObservationCheck(
            self._view.observation_space, self._check_observations
        )
        return self._observation_check

    def _check_many(self, values: Any, count: int) -> Any:
        space = self._view.observation_space
        if isinstance(space, spaces.Box):
            if self._check_observations:
                check_batch(space, values, count, "observations")
            try:
                return np.asarray(values, dtype=space.dtype)
            except (TypeError, ValueError) as exc:
                raise SpaceError(f"observations: cannot be read as numbers: {exc}") from exc
        return [self._check_one(v) for v in values]

    def _delivered(self, episode_ids: list[str], seqs: list[int]) -> None:
        # Only once the server accepted the call: a refused call leaves the pending rewards,
        # the episode's state and its next seq as they were.
        seq_of = self._session.seq
        for episode_id, seq in zip(episode_ids, seqs, strict=True):
            self._pending_reward.pop(episode_id, None)
            self._pending_info.pop(episode_id, None)
            seq_of[episode_id] = seq
