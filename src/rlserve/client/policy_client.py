"""``PolicyClient``: RLlib's external-application client calls, over the rlserve protocol.

The calls and their meaning are RLlib's (``start_episode``, ``get_action``, ``log_action``,
``log_returns``, ``end_episode``, ``update_policy_weights``), plus ``truncated=`` on
``end_episode``. In remote inference mode each environment step costs one network round trip:
rewards (and ``info`` maps) logged with ``log_returns`` are added up on the client and travel with
the next ``get_action``, ``log_action`` or ``end_episode`` of the episode; ``end_episode`` is
pipelined (its error, if any, is raised by the next call, naming the episode it ended).
Observations are checked against the server's space before they are sent. This module needs
numpy, msgpack and gymnasium's spaces; never torch.

Every episode call carries the episode's next sequence number ``seq`` and every ``hello`` the
client's random ``client_id``, so a call re-sent after a lost reply or a timeout is answered with
its first answer and never applied twice (see ``docs/protocol.md``, "Exactly-once calls").
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from gymnasium import spaces

from rlserve.client.connection import Connection, Timeouts
from rlserve.client.local import LocalConfig, LocalInference
from rlserve.config.fields import TOKEN_ENV
from rlserve.errors import (
    ConfigError,
    ConnectionLostError,
    EpisodeError,
    EpisodeLostError,
    RLServeError,
    SpaceError,
    TLSError,
)
from rlserve.experience.agent_values import PolicyTable, plain_value
from rlserve.policy.action_layout import action_from_wire
from rlserve.protocol.episode_requests import DEFAULT_POLICY_ID
from rlserve.protocol.info import check_info_size, wire_info
from rlserve.protocol.mapping import ALL_AGENTS
from rlserve.protocol.spaces import check_batch, check_value
from rlserve.protocol.values import MAX_ABS_REWARD

logger = logging.getLogger("rlserve.client")

ENDED_SEQS_KEPT = 4096
"""Ended episodes whose last call number is kept (in case the server refuses the end)."""

EPISODES_TRACKED = 100_000
"""Open (and lost) episode ids a remote-mode client remembers, oldest forgotten first."""


class PolicyClient:
    """Talks to an rlserve server from a simulator that runs its own loop.

    Args:
        address: ``host:port`` of the server's binary port (``http://host:port`` and
            ``tcp://host:port`` are accepted too; the client speaks the binary carrier whatever
            the scheme, and an HTTP-only port gets a :class:`ConfigError` naming the binary
            port); ``tls://host:port`` or ``https://host:port`` connect with TLS and verify the
            server's certificate and host name (never falling back to plain text).
        inference_mode: ``local`` (the default, as in RLlib): the client computes actions with
            numpy from weights the server ships and sends its experience in batches from a
            background thread. ``remote``: the server computes actions (one round trip per
            step).
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
        seed: Local mode: seed of this client's action sampling (a ``SeedSequence`` entropy;
            each policy swap spawns a child stream), for reproducible runs; None: fresh
            entropy, so every client samples differently. Remote mode: unused (the server
            samples).
        client_id: This client's identity on the server (its episodes belong to it): a
            secret; None: a random ``uuid4().hex``. Pass the same value to continue one
            client's episodes from another ``PolicyClient`` (or over HTTP as the
            ``X-RLServe-Client`` header).
        multiagent: Whether a dict passed as an observation is one observation per agent id
            (multi-agent episodes, see :meth:`get_action`); None: as the server declares (it
            does when it has an agent -> policy mapping or several policies).
        policy_ids: Agent id -> policy id choices of this client, winning over the server's
            mapping (e.g. ``{"player_2": "frozen_opponent"}``).

    Retries: a call whose connection breaks, or that gets no reply within ``timeout`` (the
    server is alive but slow, e.g. still waiting for its learner's first weights), is re-sent on
    a fresh connection, with backoff, until it is answered or ``reconnect_timeout`` seconds have
    passed since its first failure; then the last error is raised. So a call raises
    :class:`~rlserve.errors.RequestTimeoutError` or
    :class:`~rlserve.errors.ConnectionLostError` after at most about ``reconnect_timeout + 2 *
    timeout`` seconds. Re-sending is safe because every call is idempotent on the server:
    episode calls carry a per-episode sequence number (a retry gets the first answer, a pending
    ``get_action`` is joined), ``start_episode`` always names its id (a retry of an unused
    episode is answered as started), and a pipelined ``end_episode`` whose reply was lost is
    re-sent before the next call. If the server restarted (its episodes are gone), nothing is
    replayed and every later call of an episode this client had open raises
    :class:`~rlserve.errors.EpisodeLostError` (an ``EpisodeError``) without a round trip: catch
    it around an episode's loop and start a new episode (local mode keeps its episodes, as they
    live in the client).

    Threads: one client may be shared by several threads. Each call holds the client's lock
    for its duration (calls are serialised, never interleaved on the connection); run one
    client per thread for parallel round trips.

    Raises:
        ConnectionLostError: The server cannot be reached.
        TLSError: The TLS handshake failed (certificate not trusted, or the server has no TLS).
        AuthenticationError: Wrong token.
        ConfigError: An invalid argument (e.g. ``tls_ca`` with a plain-text address).
    """

    def __init__(
        self,
        address: str,
        inference_mode: str = "local",
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
        seed: int | None = None,
        client_id: str | None = None,
        multiagent: bool | None = None,
        policy_ids: Mapping[str, str] | None = None,
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
        self._timeouts = timeouts
        self._multiagent_choice = multiagent
        self._policy_choices = dict(policy_ids or {})
        # Multi-agent episodes: per episode, the rewards and infos logged for each agent since
        # its previous action, the agents that acted, and the agents that are done.
        self._agent_rewards: dict[str, dict[str, float]] = {}
        self._agent_infos: dict[str, dict[str, dict[str, Any]]] = {}
        self._agents_acted: dict[str, set[str]] = {}
        self._agents_done: dict[str, set[str]] = {}
        self._ended_by_all: OrderedDict[str, None] = OrderedDict()
        # The client identity: a secret random id, the same on every (re)connection.
        self.client_id = client_id or uuid.uuid4().hex
        client_id = self.client_id

        def connect() -> Connection:
            return Connection(
                address, token, client_name, inference_mode, timeouts, tls_ca, client_id
            )

        self._lock = threading.RLock()
        self._conn = connect()
        self._pending_reward: dict[str, float] = {}
        self._pending_info: dict[str, dict[str, Any]] = {}
        self._acted: set[str] = set()
        # Remote mode: episodes this client started and has not ended, and those a server
        # restart took away (their calls raise EpisodeLostError).
        self._open: OrderedDict[str, None] = OrderedDict()
        self._lost: OrderedDict[str, None] = OrderedDict()
        self._seq: dict[str, int] = {}
        # The end_episode seq of recently ended episodes: calls after the end take the next
        # number; if the server refuses the end, the episode goes on with the end's number.
        self._ended_seq: OrderedDict[str, int] = OrderedDict()
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
                self.policies,
                update_interval,
                local or LocalConfig(),
                timeouts,
                seed,
            )

    def _open_first(self) -> dict[str, Any]:
        try:
            return self._conn.open()
        except TLSError:
            raise  # it already says which side speaks TLS
        except ConnectionLostError as exc:
            if self._conn.tls or not self._conn.tcp_connected:
                raise
            # Connected, then cut off before the welcome: what a TLS server does to plain text.
            raise ConnectionLostError(
                f"{exc}; if the server was started with --tls-cert, connect with "
                f"tls://{self._conn.host}:{self._conn.port}"
            ) from exc

    def _welcome(self, welcome: dict[str, Any]) -> bool:
        """Take the server's ``welcome``; True when it is a restarted server."""
        restarted = getattr(self, "_instance_id", None) not in (None, welcome.get("instance_id"))
        if restarted:
            # The server restarted: the episodes this client had open are gone there.
            for episode_id in [*self._open, *self._seq]:
                _remember(self._lost, episode_id)
            self._open.clear()
            self._pending_reward.clear()
            self._pending_info.clear()
            self._acted.clear()
            self._seq.clear()
            self._ended_seq.clear()
            for per_episode in (
                self._agent_rewards,
                self._agent_infos,
                self._agents_acted,
                self._agents_done,
            ):
                per_episode.clear()
        self._instance_id = welcome.get("instance_id")
        self.policies = PolicyTable(welcome, self._policy_choices)
        """The server's policies (spaces by id) and agent -> policy mapping."""
        self.multiagent = (
            self.policies.multi_agent
            if self._multiagent_choice is None
            else bool(self._multiagent_choice)
        )
        """Whether dict observations are read as one per agent (multi-agent episodes)."""
        served = self.policies.policies
        policy = served.get(DEFAULT_POLICY_ID) or next(iter(served.values()))
        self.observation_space: spaces.Space[Any] = policy.observation_space
        self.action_space: spaces.Space[Any] = policy.action_space
        self._discrete = isinstance(self.action_space, spaces.Discrete)
        return restarted

    # -- transport: re-send idempotent calls after a lost reply or a timeout -----------------

    def _request(self, message: dict[str, Any]) -> dict[str, Any]:
        reply = self._call(message, wait=True)
        assert reply is not None
        return reply

    def _send_nowait(self, message: dict[str, Any]) -> None:
        self._call(message, wait=False)

    def _call(self, message: dict[str, Any], wait: bool) -> dict[str, Any] | None:
        """Send ``message`` (and re-send pipelined calls a broken connection lost) until done.

        Every message this client sends is idempotent on the server (see the class docstring),
        so re-sending after a lost reply never applies a call twice.
        """
        deadline: float | None = None
        replay: list[dict[str, Any]] = []
        while True:
            try:
                while replay:
                    try:
                        self._conn.request(dict(replay[0]))
                    except ConnectionLostError:
                        raise
                    except RLServeError:
                        self._undo_refused(replay[0])
                        raise
                    replay.pop(0)
                self._conn.failed_message = None
                if wait:
                    return self._conn.request(dict(message))
                self._conn.send_nowait(dict(message))
                return None
            except ConnectionLostError:  # RequestTimeoutError included
                replay = self._conn.take_unanswered() + replay
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self._timeouts.reconnect
                if now >= deadline:
                    raise
                if self._welcome(self._conn.reconnect(deadline)):
                    if replay:
                        logger.warning(
                            "rlserve: the server restarted; %d unanswered call(s) for its ended "
                            "episodes are not re-sent",
                            len(replay),
                        )
                        replay = []
                    self._check_not_lost(_episodes_of(message))
            except RLServeError:
                # A pipelined end_episode the server refused leaves its episode open.
                if self._conn.failed_message is not None:
                    self._undo_refused(self._conn.failed_message)
                raise

    def _undo_refused(self, message: dict[str, Any]) -> None:
        """An ``end_episode`` was refused: the episode goes on, its next call takes the number."""
        if message.get("type") != "end_episode":
            return
        episode_id, seq = message["episode_id"], int(message["seq"])
        if self._ended_seq.get(episode_id) == seq:
            del self._ended_seq[episode_id]
            _remember(self._open, episode_id)
            if seq > 1:
                self._seq[episode_id] = seq - 1
                self._acted.add(episode_id)

    def _check_not_lost(self, episode_ids: list[str]) -> None:
        lost = [eid for eid in episode_ids if eid in self._lost]
        if lost:
            names = ", ".join(f"'{eid}'" for eid in lost)
            raise EpisodeLostError(
                f"episode {names} is lost: the server restarted since it started and no longer "
                "knows it; start a new episode (reset your environment) and carry on",
                lost,
            )

    def _next_seq(self, episode_id: str) -> int:
        last = self._seq.get(episode_id)
        if last is None:
            last = self._ended_seq.get(episode_id, 0)
        return last + 1

    # -- the RLlib calls ---------------------------------------------------------------------

    def start_episode(
        self,
        episode_id: str | None = None,
        training_enabled: bool = True,
        *,
        policy_id: str | None = None,
    ) -> str:
        """Start an episode and return its id.

        Args:
            episode_id: A unique id, or None for a random one (``uuid4().hex``, chosen by the
                client so that a retried start is recognised).
            training_enabled: False serves actions but keeps the episode out of training.
            policy_id: The policy of a single-agent episode on a server of several policies
                (None: ``default``, or the server's only policy). Multi-agent episodes find
                each agent's policy through the mapping instead.

        Raises:
            EpisodeError: The id is active or was used before.
        """
        with self._lock:
            if policy_id is not None and policy_id not in self.policies.policies:
                raise EpisodeError(
                    f"start_episode names the policy '{policy_id}', which the server does not "
                    f"serve; it serves {sorted(self.policies.policies)}"
                )
            if self._local is not None:
                return self._local.start_episode(episode_id, training_enabled, policy_id)
            message: dict[str, Any] = {
                "type": "start_episode",
                "episode_id": episode_id or uuid.uuid4().hex,
                "training_enabled": training_enabled,
            }
            if policy_id is not None:
                message["policy_id"] = policy_id
            reply = self._request(message)
            started = str(reply["episode_id"])
            _remember(self._open, started)
            self._lost.pop(started, None)
            return started

    def get_action(self, episode_id: str | Sequence[str], observation: Any) -> Any:
        """Record an observation and return the policy's action.

        Args:
            episode_id: An episode id; or a list of ids to act in several episodes at once
                (a vector of environments), with ``observation`` a dict keyed by id or a
                stacked array / list in the same order.
            observation: The current observation. In a multi-agent episode (see the
                ``multiagent`` argument), a dict of observations keyed by agent id, for exactly
                the agents that act now: agents join with their first observation and act at
                their own pace; each agent's observation is checked against its policy's space.

        Returns:
            The action in the space's own form (an int for Discrete, an array of the space's
            shape and dtype for Box, MultiDiscrete and MultiBinary, a dict for Dict, a tuple for
            Tuple). For a list of ids: a dict of actions keyed by id when ``observation`` was a
            dict, else a stacked array (a list for Dict and Tuple spaces). In a multi-agent
            episode: a dict of actions keyed by agent id, for exactly the agents observed.
        """
        with self._lock:
            if self.multiagent and isinstance(episode_id, str):
                if not isinstance(observation, Mapping):
                    raise SpaceError(
                        f"get_action for episode '{episode_id}': a multi-agent episode takes a "
                        "dict of observations keyed by agent id, got "
                        f"{type(observation).__name__}"
                    )
                if self._local is not None:
                    return self._local.get_agent_actions(episode_id, observation)
                return self._get_agent_actions(episode_id, observation)
            if self._local is not None:
                return self._local_get_action(episode_id, observation)
            if isinstance(episode_id, str):
                self._check_not_lost([episode_id])
                seq = self._next_seq(episode_id)
                message: dict[str, Any] = {
                    "type": "get_action",
                    "episode_id": episode_id,
                    "observation": self._check_one(observation),
                    "seq": seq,
                }
                self._attach_pending(episode_id, message)
                reply = self._request(message)
                self._delivered([episode_id], [seq])
                return self._one_action(reply["action"])
            ids = list(episode_id)
            self._check_not_lost(ids)
            keyed = isinstance(observation, Mapping)
            values = [observation[eid] for eid in ids] if keyed else observation
            stacked = self._check_many(values, len(ids))
            rewards = [self._pending_reward.get(eid, 0.0) for eid in ids]
            seqs = [self._next_seq(eid) for eid in ids]
            batch: dict[str, Any] = {
                "type": "get_action",
                "episode_ids": ids,
                "observations": stacked,
                "rewards": rewards,
                "seqs": seqs,
            }
            if any(eid in self._pending_info for eid in ids):
                batch["infos"] = [self._pending_info.get(eid) for eid in ids]
            reply = self._request(batch)
            self._delivered(ids, seqs)
            actions = reply["actions"]
            if keyed:
                return {eid: self._one_action(actions[i]) for i, eid in enumerate(ids)}
            # Dict and Tuple actions arrive as a list (one per episode), the others stacked.
            if isinstance(actions, np.ndarray):
                return actions
            return [self._one_action(a) for a in actions]

    def log_action(self, episode_id: str, observation: Any, action: Any) -> None:
        """Record an observation and the action someone else took (trained on as taken).

        In a multi-agent episode both are dicts keyed by agent id, with the same keys.
        """
        with self._lock:
            if self.multiagent:
                if not isinstance(observation, Mapping) or not isinstance(action, Mapping):
                    raise SpaceError(
                        f"log_action for episode '{episode_id}': a multi-agent episode takes "
                        "dicts of observations and actions keyed by agent id"
                    )
                if set(observation) != set(action):
                    raise SpaceError(
                        f"log_action for episode '{episode_id}': the observation and action "
                        f"dicts name different agents ({sorted(observation)} vs "
                        f"{sorted(action)})"
                    )
                if self._local is not None:
                    self._local.log_agent_actions(episode_id, observation, action)
                    return
                self._log_agent_actions(episode_id, observation, action)
                return
            if self._local is not None:
                self._local.log_action(episode_id, observation, action)
                return
            self._check_not_lost([episode_id])
            seq = self._next_seq(episode_id)
            message: dict[str, Any] = {
                "type": "log_action",
                "episode_id": episode_id,
                "observation": self._check_one(observation),
                "action": check_value(self.action_space, action, "action"),
                "seq": seq,
            }
            self._attach_pending(episode_id, message)
            self._request(message)
            self._delivered([episode_id], [seq])

    def log_returns(
        self,
        episode_id: str,
        reward: float | Mapping[str, float],
        info: dict[str, Any] | None = None,
        multiagent_done_dict: Mapping[str, bool] | None = None,
        multiagent_truncated_dict: Mapping[str, bool] | None = None,
    ) -> None:
        """Add reward to the episode's previous action (rewards add up until the next action).

        Remote mode: the reward and ``info`` of an episode this client started are kept here
        and travel with the episode's next call (no round trip of their own); for any other id
        they are sent at once (so an unknown id is reported by this call). A reward before the
        episode's first action counts in its return and belongs to no step.

        Multi-agent episodes: ``reward`` is a dict keyed by agent id, each reward belonging to
        that agent's previous action (an agent that has not acted may only get 0); ``info`` a
        dict of info maps keyed by agent id. ``multiagent_done_dict`` marks agents done
        (terminated): their trajectories go to their policies, and they may not act again;
        ``"__all__": True`` ends the whole episode (every agent terminated; a later
        ``end_episode`` of it is then a no-op). ``multiagent_truncated_dict`` marks agents cut
        short instead (their last step is dropped and the rest bootstraps from it); with
        ``"__all__"`` it ends the episode truncated. A call that marks agents done costs one
        round trip; rewards alone travel with the next call.

        Args:
            episode_id: The episode.
            reward: A finite number; with the rewards logged since the previous action, within
                -1e9..1e9. Multi-agent: a dict of such numbers keyed by agent id.
            info: The environment's info map for this step (recorded with the step and kept
                with the episode's data); several before the next action merge, later keys
                replacing earlier ones. Keys are strings (int, float, bool and None keys are
                turned into their JSON text); values are numbers, strings, booleans, None,
                lists, dicts, bytes or numeric numpy arrays, at most the server's
                ``max_info_bytes`` encoded. Multi-agent: a dict of such maps keyed by agent id.
            multiagent_done_dict: Multi-agent: agent id -> done; ``"__all__"`` ends the episode.
            multiagent_truncated_dict: Multi-agent: agent id -> cut short (time limit).

        Raises:
            SpaceError: The reward is not a finite number in range, or ``info`` holds a value
                that cannot travel (the error names its key).
            LimitExceededError: ``info`` is over ``max_info_bytes``.
            EpisodeLostError: The server restarted since the episode started.
            EpisodeError: Multi-agent: a reward or done mark names an agent that has not acted
                or is done.
        """
        if self.multiagent or multiagent_done_dict is not None:
            with self._lock:
                if not self.multiagent:
                    raise ConfigError(
                        "log_returns got a multiagent_done_dict, but this client's episodes are "
                        "single-agent: the server declares no agent mapping; pass "
                        "PolicyClient(..., multiagent=True) or give the server a [mapping]"
                    )
                if self._local is not None:
                    self._local.log_agent_returns(
                        episode_id,
                        _agent_rewards(episode_id, reward),
                        self._agent_info(episode_id, info),
                        _done_marks(multiagent_done_dict, multiagent_truncated_dict),
                    )
                    return
                self._log_agent_returns(
                    episode_id,
                    _agent_rewards(episode_id, reward),
                    self._agent_info(episode_id, info),
                    _done_marks(multiagent_done_dict, multiagent_truncated_dict),
                )
            return
        if not isinstance(reward, int | float | np.number) or isinstance(reward, bool):
            raise SpaceError(
                f"log_returns for episode '{episode_id}': reward must be a number, got "
                f"{type(reward).__name__} (a dict of rewards is for multi-agent episodes: "
                "PolicyClient(..., multiagent=True))"
            )
        where = f"log_returns for episode '{episode_id}'"
        value = _reward_number(reward, where)
        plain = None
        if info:
            plain = wire_info(info, where)
            check_info_size(plain, self._conn.limits.max_info_bytes, where)
        with self._lock:
            if self._local is not None:
                self._local.log_returns(episode_id, value, plain)
                return
            self._check_not_lost([episode_id])
            total = self._pending_reward.get(episode_id, 0.0) + value
            if not -MAX_ABS_REWARD <= total <= MAX_ABS_REWARD:
                raise SpaceError(
                    f"{where}: reward {value!r} makes the rewards logged since the last action "
                    f"add up to {total!r}; a step's reward must be within "
                    f"-{MAX_ABS_REWARD:g}..{MAX_ABS_REWARD:g}"
                )
            pending = self._pending_info.get(episode_id)
            merged = plain if pending is None or not plain else {**pending, **plain}
            if episode_id not in self._open:
                # Not started by this client object (another with the same client_id, or an
                # unknown id): send it now, so that an unknown id is reported by this call.
                seq = self._next_seq(episode_id)
                message: dict[str, Any] = {
                    "type": "log_returns",
                    "episode_id": episode_id,
                    "reward": total,
                    "seq": seq,
                }
                if merged is not None:
                    message["info"] = merged
                self._request(message)
                self._pending_reward.pop(episode_id, None)
                self._pending_info.pop(episode_id, None)
                self._seq[episode_id] = seq
                return
            self._pending_reward[episode_id] = total
            if merged is not None:
                self._pending_info[episode_id] = merged

    def end_episode(self, episode_id: str, observation: Any, truncated: bool = False) -> None:
        """Finish an episode with its final observation.

        Args:
            episode_id: The episode.
            observation: The final observation.
            truncated: True when a time limit cut the episode short (the learner then
                bootstraps from ``observation``); False for a terminal state.

        Multi-agent episodes: ``observation`` is a dict of final observations keyed by agent
        id (any subset of the agents, or empty); every agent not yet done ends with the
        episode, those without a final observation as in ``multiagent_done_dict``.
        """
        with self._lock:
            if self.multiagent:
                finals = {} if observation is None else observation
                if not isinstance(finals, Mapping):
                    raise SpaceError(
                        f"end_episode for episode '{episode_id}': a multi-agent episode takes a "
                        "dict of final observations keyed by agent id (or an empty dict)"
                    )
                if self._local is not None:
                    self._local.end_agent_episode(episode_id, finals, truncated)
                    return
                self._end_agent_episode(episode_id, finals, truncated)
                return
            if self._local is not None:
                self._local.end_episode(episode_id, observation, truncated)
                return
            self._check_not_lost([episode_id])
            message: dict[str, Any] = {
                "type": "end_episode",
                "episode_id": episode_id,
                "observation": self._check_one(observation),
                "truncated": bool(truncated),
                "seq": self._next_seq(episode_id),
            }
            self._attach_pending(episode_id, message)
            self._send_nowait(message)
            # Pipelined: its error, if any, is raised by the next call; the episode is over here.
            self._pending_reward.pop(episode_id, None)
            self._pending_info.pop(episode_id, None)
            self._open.pop(episode_id, None)
            self._acted.discard(episode_id)
            self._seq.pop(episode_id, None)
            self._ended_seq[episode_id] = message["seq"]
            if len(self._ended_seq) > ENDED_SEQS_KEPT:
                self._ended_seq.popitem(last=False)

    def update_policy_weights(self) -> None:
        """Fetch the newest weights now (local mode); in remote mode the server always has them."""
        with self._lock:
            if self._local is not None:
                self._local.update_weights()

    def close(self, timeout: float = 30.0) -> None:
        """Disconnect.

        Local mode first ships what is buffered, for up to ``timeout`` seconds (what is left
        then is logged and lost), and stops its threads; remote mode reads outstanding replies
        (raising a deferred error).
        """
        with self._lock:
            if self._local is not None:
                self._local.close(timeout)
                return
            if self._conn.unanswered:
                # Settles a pipelined end_episode, re-sending it if the connection broke.
                self._request({"type": "ping"})
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

    # -- multi-agent episodes, remote mode ----------------------------------------------------

    def _agent_info(
        self, episode_id: str, info: Mapping[str, Any] | None
    ) -> dict[str, dict[str, Any]]:
        """Per-agent info maps, made plain and checked against ``max_info_bytes``."""
        if not info:
            return {}
        if not isinstance(info, Mapping):
            raise SpaceError(
                f"log_returns for episode '{episode_id}': info of a multi-agent episode is a "
                "dict of info maps keyed by agent id"
            )
        out = {}
        for agent_id, agent_info in info.items():
            if not agent_info:
                continue
            where = f"log_returns for episode '{episode_id}', agent '{agent_id}'"
            if not isinstance(agent_info, Mapping):
                raise SpaceError(f"{where}: info must be a map, got {type(agent_info).__name__}")
            plain = wire_info(dict(agent_info), where)
            check_info_size(plain, self._conn.limits.max_info_bytes, where)
            out[str(agent_id)] = plain
        return out

    def _check_agents_usable(self, episode_id: str, agent_ids: Any, call: str) -> None:
        done = self._agents_done.get(episode_id)
        if done and not done.isdisjoint(agent_ids):
            for agent_id in agent_ids:
                if agent_id in done:
                    policy = self.policies.policy_of(agent_id).policy_id
                    raise EpisodeError(
                        f"{call} for episode '{episode_id}': agent '{agent_id}' (policy "
                        f"'{policy}') is done (marked in multiagent_done_dict) and cannot act "
                        "again; use a new agent id for a new agent"
                    )

    def _agent_extras(self, episode_id: str, agent_ids: list[str], message: dict[str, Any]) -> None:
        """Attach the rewards and infos logged for these agents since their previous action."""
        rewards = self._agent_rewards.get(episode_id)
        if rewards:
            # One typed array on the wire: the server checks it with a few numpy operations.
            if _same_keys(rewards, agent_ids):
                listed = np.fromiter(rewards.values(), np.float64, len(agent_ids))
            else:
                listed = np.array([rewards.get(a, 0.0) for a in agent_ids], dtype=np.float64)
            if listed.any():
                message["rewards"] = listed
        infos = self._agent_infos.get(episode_id)
        if infos and any(a in infos for a in agent_ids):
            message["infos"] = [infos.get(a) for a in agent_ids]
        explicit = self.policies.explicit_ids(agent_ids)
        if explicit is not None:
            message["policy_ids"] = explicit

    def _agents_delivered(self, episode_id: str, agent_ids: list[str], seq: int) -> None:
        rewards = self._agent_rewards.get(episode_id)
        infos = self._agent_infos.get(episode_id)
        if rewards or infos:
            delivered: set[str] | None = None
            for pending in (rewards, infos):
                if not pending:
                    continue
                if _same_keys(pending, agent_ids):
                    pending.clear()
                    continue
                if delivered is None:
                    delivered = set(agent_ids)
                if pending.keys() <= delivered:
                    pending.clear()  # the common case: every agent logged for has acted now
                else:
                    for agent_id in agent_ids:
                        pending.pop(agent_id, None)
        acted = self._agents_acted.get(episode_id)
        if acted is None:
            self._agents_acted[episode_id] = set(agent_ids)
        elif len(acted) < len(agent_ids) or not acted.issuperset(agent_ids):
            acted.update(agent_ids)
        self._seq[episode_id] = seq

    def _get_agent_actions(self, episode_id: str, observation: Mapping[str, Any]) -> dict[str, Any]:
        agent_ids, reply = self._agent_step("get_action", episode_id, observation, None)
        return self.policies.actions(agent_ids, reply["actions"])

    def _log_agent_actions(
        self, episode_id: str, observation: Mapping[str, Any], action: Mapping[str, Any]
    ) -> None:
        self._agent_step("log_action", episode_id, observation, action)

    def _agent_step(
        self,
        call: str,
        episode_id: str,
        observation: Mapping[str, Any],
        action: Mapping[str, Any] | None,
    ) -> tuple[list[str], dict[str, Any]]:
        """Send one multi-agent ``get_action`` or ``log_action``; return its agents and reply."""
        self._check_not_lost([episode_id])
        agent_ids = _agent_keys(observation)
        if not agent_ids:
            raise SpaceError(
                f"{call} for episode '{episode_id}': the observation dict names no agent; "
                "pass the observations of the agents that act now"
            )
        self._check_agents_usable(episode_id, agent_ids, call)
        seq = self._next_seq(episode_id)
        message: dict[str, Any] = {
            "type": call,
            "episode_id": episode_id,
            "agent_ids": agent_ids,
            "observations": self.policies.observations(
                agent_ids, list(observation.values()), self.check_observations
            ),
            "seq": seq,
        }
        if action is not None:
            message["actions"] = self.policies.taken_actions(agent_ids, action)
        self._agent_extras(episode_id, agent_ids, message)
        reply = self._request(message)
        self._agents_delivered(episode_id, agent_ids, seq)
        return agent_ids, reply

    def _log_agent_returns(
        self,
        episode_id: str,
        rewards: dict[str, float],
        infos: dict[str, dict[str, Any]],
        done: dict[str, bool],
    ) -> None:
        if episode_id in self._ended_by_all:
            raise EpisodeError(
                f"log_returns for episode '{episode_id}', which '__all__' ended; start a new "
                "episode"
            )
        self._check_not_lost([episode_id])
        all_done = done.pop(ALL_AGENTS, None)
        acted = self._agents_acted.get(episode_id, set())
        self._check_agents_usable(episode_id, [*rewards, *infos, *done], "log_returns")
        pending = self._agent_rewards.setdefault(episode_id, {})
        # The common case, one reward dict per tick for agents that acted: nothing to refuse
        # (each value was checked) and nothing pending to add to.
        fresh = not pending and (episode_id not in self._open or acted.issuperset(rewards))
        for agent_id, value in () if fresh else rewards.items():
            if value and agent_id not in acted and episode_id in self._open:
                policy = self.policies.policy_of(agent_id).policy_id
                raise EpisodeError(
                    f"log_returns for episode '{episode_id}': a reward for agent '{agent_id}' "
                    f"(policy '{policy}'), which has not acted in this episode; a reward "
                    "belongs to the agent's previous action"
                )
            total = pending.get(agent_id, 0.0) + value
            if not -MAX_ABS_REWARD <= total <= MAX_ABS_REWARD:
                raise SpaceError(
                    f"log_returns for episode '{episode_id}', agent '{agent_id}': reward "
                    f"{value!r} makes the rewards logged since its last action add up to "
                    f"{total!r}; a step's reward must be within "
                    f"-{MAX_ABS_REWARD:g}..{MAX_ABS_REWARD:g}"
                )
        for agent_id in done:
            if agent_id not in acted and episode_id in self._open:
                raise EpisodeError(
                    f"log_returns for episode '{episode_id}' marks agent '{agent_id}' done, but "
                    "it has not acted in this episode; mark only agents that acted"
                )
        if fresh:
            # Kept whole (zeros too: every agent in it has acted), so that the next get_action
            # with the same agents sends the values as they are.
            self._agent_rewards[episode_id] = rewards
        else:
            for agent_id, value in rewards.items():
                if value:
                    pending[agent_id] = pending.get(agent_id, 0.0) + value
        if infos:
            kept = self._agent_infos.setdefault(episode_id, {})
            for agent_id, info in infos.items():
                kept[agent_id] = {**kept[agent_id], **info} if agent_id in kept else info
        if episode_id not in self._open or done or all_done is not None:
            # Finishing agents (or an episode another client object started): send it now.
            self._flush_agent_returns(episode_id, done)
        if all_done is not None:
            truncated = not all_done
            self._end_agent_episode(episode_id, {}, truncated)
            _remember(self._ended_by_all, episode_id)

    def _flush_agent_returns(self, episode_id: str, done: dict[str, bool]) -> None:
        """Send every pending reward and info of the episode, and the done marks, now."""
        pending = self._agent_rewards.get(episode_id, {})
        infos = self._agent_infos.get(episode_id, {})
        agent_ids = sorted({a for a, v in pending.items() if v} | set(infos))
        if not agent_ids and not done:
            return
        seq = self._next_seq(episode_id)
        message: dict[str, Any] = {
            "type": "log_returns",
            "episode_id": episode_id,
            "agent_ids": agent_ids,
            "rewards": [pending.get(a, 0.0) for a in agent_ids],
            "seq": seq,
        }
        if infos:
            message["infos"] = [infos.get(a) for a in agent_ids]
        terminated = [a for a, t in done.items() if t]
        truncated = [a for a, t in done.items() if not t]
        if terminated:
            message["terminated_agents"] = terminated
        if truncated:
            message["truncated_agents"] = truncated
        self._request(message)
        self._agent_rewards.pop(episode_id, None)
        self._agent_infos.pop(episode_id, None)
        self._seq[episode_id] = seq
        self._agents_done.setdefault(episode_id, set()).update(done)

    def _end_agent_episode(
        self, episode_id: str, observation: Mapping[str, Any], truncated: bool
    ) -> None:
        if episode_id in self._ended_by_all:
            return  # '__all__' ended it already (RLlib's clients call end_episode after it)
        self._check_not_lost([episode_id])
        agent_ids = [str(a) for a in observation]
        done = self._agents_done.get(episode_id, set())
        agent_ids = [a for a in agent_ids if a not in done]
        pending = self._agent_rewards.get(episode_id, {})
        infos = self._agent_infos.get(episode_id, {})
        named = set(agent_ids)
        if any(v and a not in named for a, v in pending.items()) or any(
            a not in named for a in infos
        ):
            # Rewards of agents without a final observation go first, on their own.
            self._flush_agent_returns(episode_id, {})
        message: dict[str, Any] = {
            "type": "end_episode",
            "episode_id": episode_id,
            "agent_ids": agent_ids,
            "truncated": bool(truncated),
            "seq": self._next_seq(episode_id),
        }
        if agent_ids:
            message["observations"] = self.policies.observations(
                agent_ids, [observation[a] for a in agent_ids], self.check_observations
            )
            self._agent_extras(episode_id, agent_ids, message)
        self._send_nowait(message)
        # Pipelined: its error, if any, is raised by the next call; the episode is over here.
        for per_episode in (
            self._agent_rewards,
            self._agent_infos,
            self._agents_acted,
            self._agents_done,
        ):
            per_episode.pop(episode_id, None)
        self._open.pop(episode_id, None)
        self._seq.pop(episode_id, None)
        self._ended_seq[episode_id] = message["seq"]
        if len(self._ended_seq) > ENDED_SEQS_KEPT:
            self._ended_seq.popitem(last=False)

    # -- helpers -----------------------------------------------------------------------------

    def _check_one(self, observation: Any) -> Any:
        if not self.check_observations:
            return plain_value(observation)
        value = check_value(self.observation_space, observation, "observation")
        return plain_value(value)

    def _check_many(self, values: Any, count: int) -> Any:
        if isinstance(self.observation_space, spaces.Box):
            if self.check_observations:
                check_batch(self.observation_space, values, count, "observations")
            try:
                return np.asarray(values, dtype=self.observation_space.dtype)
            except (TypeError, ValueError) as exc:
                raise SpaceError(f"observations: cannot be read as numbers: {exc}") from exc
        return [self._check_one(v) for v in values]

    def _attach_pending(self, episode_id: str, message: dict[str, Any]) -> None:
        """Add the reward and info logged since the episode's last action to ``message``."""
        reward = self._pending_reward.get(episode_id)
        if reward is not None:
            message["reward"] = reward
        info = self._pending_info.get(episode_id)
        if info is not None:
            message["info"] = info

    def _delivered(self, episode_ids: list[str], seqs: list[int]) -> None:
        # Only once the server accepted the call: a refused call leaves the pending rewards,
        # the episode's state and its next seq as they were.
        for episode_id, seq in zip(episode_ids, seqs, strict=True):
            self._pending_reward.pop(episode_id, None)
            self._pending_info.pop(episode_id, None)
            self._acted.add(episode_id)
            self._seq[episode_id] = seq

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
        return int(action) if self._discrete else action_from_wire(self.action_space, action)

    @property
    def reconnects(self) -> int:
        """How many times the connection was re-opened."""
        return self._conn.reconnects


def _reward_number(reward: Any, where: str) -> float:
    """``reward`` as a float, refused at once when it is not a finite number in range."""
    if isinstance(reward, bool) or not isinstance(reward, int | float | np.number):
        raise SpaceError(f"{where}: reward must be a number, got {type(reward).__name__}")
    try:
        value = float(reward)
    except OverflowError:
        value = float("inf")
    if not -MAX_ABS_REWARD <= value <= MAX_ABS_REWARD:  # False for NaN
        raise SpaceError(
            f"{where}: reward {reward!r} is out of range; a reward must be a finite number "
            f"within -{MAX_ABS_REWARD:g}..{MAX_ABS_REWARD:g}"
        )
    return value


_STR_ONLY = {str}
_PLAIN_FLOATS = {float}
_NUMBER_TYPES = {float, int, np.float64, np.float32, np.int64, np.int32}
"""Reward types checked together (bool is not among them: it is not a reward)."""


def _same_keys(values: dict[str, Any], agent_ids: list[str]) -> bool:
    """Whether a dict is keyed by exactly these agents, in this order (checked in C)."""
    return len(values) == len(agent_ids) and list(values) == agent_ids


def _agent_keys(values: Mapping[Any, Any]) -> list[str]:
    """The keys of a dict keyed by agent id, as strings."""
    keys = list(values)
    if set(map(type, keys)) <= _STR_ONLY:
        return keys
    return [str(a) for a in keys]


def _agent_rewards(episode_id: str, reward: Any) -> dict[str, float]:
    """A multi-agent reward dict with each value checked."""
    if not isinstance(reward, Mapping):
        raise SpaceError(
            f"log_returns for episode '{episode_id}': a multi-agent episode takes a dict of "
            f"rewards keyed by agent id, got {type(reward).__name__}"
        )
    kinds = set(map(type, reward.values()))
    if kinds <= _NUMBER_TYPES and set(map(type, reward)) <= _STR_ONLY:
        # Numbers keyed by strings (the common case): checked together.
        try:
            values = np.fromiter(reward.values(), np.float64, len(reward))
        except OverflowError:
            values = np.array([np.inf])  # an int too large for a float: reported below
        if (np.abs(values) <= MAX_ABS_REWARD).all():  # False for NaN and infinities
            if kinds <= _PLAIN_FLOATS:
                return dict(reward)
            return dict(zip(reward, values.tolist(), strict=True))
    return {
        str(agent_id): _reward_number(
            value, f"log_returns for episode '{episode_id}', agent '{agent_id}'"
        )
        for agent_id, value in reward.items()
    }


def _done_marks(
    done: Mapping[str, bool] | None, truncated: Mapping[str, bool] | None
) -> dict[str, bool]:
    """Agent id -> True (terminated) or False (truncated); ``__all__`` kept as given."""
    marks: dict[str, bool] = {}
    for agent_id, flag in (truncated or {}).items():
        if flag:
            marks[str(agent_id)] = False
    for agent_id, flag in (done or {}).items():
        if flag and str(agent_id) not in marks:
            marks[str(agent_id)] = True
    return marks


def _episodes_of(message: dict[str, Any]) -> list[str]:
    """The episode ids an episode call names (none for other calls)."""
    if message.get("type") == "start_episode":
        return []
    if "episode_ids" in message:
        return list(message["episode_ids"])
    episode_id = message.get("episode_id")
    return [episode_id] if isinstance(episode_id, str) else []


def _remember(ids: OrderedDict[str, None], episode_id: str) -> None:
    ids[episode_id] = None
    ids.move_to_end(episode_id)
    if len(ids) > EPISODES_TRACKED:
        ids.popitem(last=False)
