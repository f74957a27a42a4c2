"""``PolicyClient``: RLlib's external-application client calls, over the rlserve protocol.

The calls and their meaning are RLlib's (``start_episode``, ``get_action``, ``log_action``,
``log_returns``, ``end_episode``, ``update_policy_weights``), plus ``truncated=`` on
``end_episode``. This module is the front door: it checks the arguments and hands each call to
the inference engine chosen when the client is made (:mod:`rlserve.client.engine`): remote
(:mod:`rlserve.client.remote`, one round trip per step) or local (:mod:`rlserve.client.local`,
numpy actions, experience shipped in batches). The client needs numpy, msgpack and gymnasium's
spaces; never torch.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from gymnasium import spaces

from rlserve.client.arguments import (
    agent_infos,
    agent_rewards,
    check_timings,
    done_marks,
    episode_ids,
    step_returns,
)
from rlserve.client.connection import Connection, Timeouts
from rlserve.client.engine import Engine, ServerView
from rlserve.client.local import LocalConfig, LocalInference
from rlserve.client.remote import RemoteEngine
from rlserve.config.fields import TOKEN_ENV
from rlserve.errors import (
    ClientClosedError,
    ConfigError,
    ConnectionLostError,
    EpisodeError,
    SpaceError,
    TLSError,
)
from rlserve.experience.agent_values import PolicyTable
from rlserve.protocol.replies import Welcome
from rlserve.protocol.values import MAX_ABS_REWARD


class PolicyClient:
    """Talks to an rlserve server from a simulator that runs its own loop.

    Args:
        address: ``host:port`` of the server's binary port (``http://host:port`` and
            ``tcp://host:port`` are accepted too; the client speaks the binary carrier whatever
            the scheme, and an HTTP-only port gets a :class:`ConfigError` naming the binary
            port); ``tls://host:port`` or ``https://host:port`` connect with TLS and verify the
            server's certificate and host name (never falling back to plain text). Or several
            serving front-ends of one run: a list of addresses, or one string of addresses
            separated by commas (each checked up front; ``token``, ``tls_ca`` and
            ``client_id`` apply to all). The client connects to the first that answers, in
            order, and moves to another when its own is lost (see "Front-ends" below).
        inference_mode: ``local`` (the default, as in RLlib): the client computes actions with
            numpy from weights the server ships and sends its experience in batches from a
            background thread. ``remote``: the server acts (one round trip per step).
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
    ``get_action`` is joined), ``start_episode`` always names its id, and a pipelined call whose
    reply was lost is re-sent before the next call. If the server restarted (its episodes are
    gone), only pipelined starts are re-sent, and every later call of an episode this client had
    open raises :class:`~rlserve.errors.EpisodeLostError` (an ``EpisodeError``) without a round
    trip: catch it around an episode's loop and start a new one (local mode keeps its episodes).

    Front-ends: with several addresses, a lost connection dials its own front-end again for a
    second, then the others in turn (round-robin), within ``reconnect_timeout``; the log says
    which front-end it moved to. To the client another front-end is like a restarted server:
    remote-mode episodes started on the lost one raise
    :class:`~rlserve.errors.EpisodeLostError` (naming both front-ends), and new episodes run on
    the new one; local mode loses nothing: the batches the lost front-end did not acknowledge
    are re-sent, with their batch ids, to the new one, and its weights are fetched. Every
    front-end must serve the policies and spaces of the first one reached (else
    :class:`ConfigError`: it belongs to another run).

    Threads: one client may be shared by several threads. Each call holds the client's lock
    for its duration (calls are serialised, never interleaved on the connection); run one
    client per thread for parallel round trips.

    Raises:
        ConnectionLostError: The server cannot be reached.
        TLSError: The TLS handshake failed (certificate not trusted, or the server has no TLS).
        AuthenticationError: Wrong token.
        ConfigError: An invalid argument (e.g. ``tls_ca`` with a plain-text address, or a bad
            address in a list).
    """

    def __init__(
        self,
        address: str | Sequence[str],
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
        check_timings(
            update_interval=update_interval,
            timeout=timeout,
            connect_timeout=connect_timeout,
            reconnect_timeout=reconnect_timeout,
        )
        self.address = address
        self.inference_mode = inference_mode
        self.update_interval = update_interval
        self.check_observations = check_observations
        timeouts = Timeouts(connect=connect_timeout, request=timeout, reconnect=reconnect_timeout)
        if token is None:
            token = os.environ.get(TOKEN_ENV) or None
        # The client identity: a secret random id, the same on every (re)connection.
        self.client_id = client_id or uuid.uuid4().hex
        client_id = self.client_id

        def connect() -> Connection:
            return Connection(
                address, token, client_name, inference_mode, timeouts, tls_ca, client_id
            )

        self._lock = threading.RLock()
        self._closed = False
        self._conn = connect()
        self._view = ServerView(self._open_first(), policy_ids or {}, multiagent)
        self._local: LocalInference | None = None
        self._engine: Engine
        if inference_mode == "remote":
            self._engine = RemoteEngine(self._conn, timeouts, self._view, check_observations)
        else:

            def open_another() -> Connection:
                conn = connect()
                conn.open()
                return conn

            self._local = self._engine = LocalInference(
                self._conn,
                open_another,
                self._view,
                update_interval,
                local or LocalConfig(),
                timeouts,
                seed,
                on_close=self._mark_closed,  # also when client.local.close() closes it
            )

    def _open_first(self) -> Welcome:
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

    @property
    def policies(self) -> PolicyTable:
        """The server's policies (spaces by id) and agent -> policy mapping."""
        return self._view.policies

    @property
    def multiagent(self) -> bool:
        """Whether dict observations are read as one per agent (multi-agent episodes)."""
        return self._view.multiagent

    @property
    def observation_space(self) -> spaces.Space[Any]:
        """The observation space of the server's default policy."""
        return self._view.observation_space

    @property
    def action_space(self) -> spaces.Space[Any]:
        """The action space of the server's default policy."""
        return self._view.action_space

    # -- the RLlib calls ---------------------------------------------------------------------

    def start_episode(
        self,
        episode_id: str | None = None,
        training_enabled: bool = True,
        *,
        policy_id: str | None = None,
    ) -> str:
        """Start an episode and return its id.

        Remote mode pipelines a random id's start (no round trip of its own); only a server limit
        can refuse it, a ``CapacityError`` the next call raises, naming the start.

        Args:
            episode_id: A unique id, or None for a random one (``uuid4().hex``, chosen by the
                client so that a retried start is recognised).
            training_enabled: False serves actions but keeps the episode out of training.
            policy_id: The policy of a single-agent episode on a server of several policies
                (None: ``default``, or the server's only policy). Multi-agent episodes find
                each agent's policy through the mapping instead.

        Raises:
            EpisodeError: The id is active or was used before.
            CapacityError: This client holds its limit of open episodes.
        """
        if episode_id is not None and (not isinstance(episode_id, str) or not episode_id):
            raise EpisodeError(
                f"start_episode: episode_id must be a non-empty string (or None for a random "
                f"one), got {episode_id!r} ({type(episode_id).__name__})"
            )
        with self._lock:
            if self._closed:
                raise self._closed_error("start_episode")
            if policy_id is not None and policy_id not in self._view.policies.policies:
                raise EpisodeError(
                    f"start_episode names the policy '{policy_id}', which the server does not "
                    f"serve; it serves {sorted(self._view.policies.policies)}"
                )
            return self._engine.start_episode(episode_id, training_enabled, policy_id)

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
            if self._closed:
                raise self._closed_error("get_action")
            if isinstance(episode_id, str):
                if not self._view.multiagent:
                    return self._engine.get_one_action(episode_id, observation)
                if not isinstance(observation, Mapping):
                    raise SpaceError(
                        f"get_action for episode '{episode_id}': a multi-agent episode takes a "
                        "dict of observations keyed by agent id, got "
                        f"{type(observation).__name__}"
                    )
                return self._engine.get_agent_actions(episode_id, observation)
            ids = episode_ids(episode_id, "get_action")
            keyed = isinstance(observation, Mapping)
            if keyed:
                missing = [eid for eid in ids if eid not in observation]
                if missing:
                    raise SpaceError(
                        f"get_action for episodes {ids}: the observation dict has no entry for "
                        f"{missing}; key it by the same ids"
                    )
            values = [observation[eid] for eid in ids] if keyed else observation
            return self._engine.get_actions(ids, values, keyed)

    def log_action(self, episode_id: str, observation: Any, action: Any) -> None:
        """Record an observation and the action someone else took (trained on as taken).

        In a multi-agent episode both are dicts keyed by agent id, with the same keys.
        """
        with self._lock:
            if self._closed:
                raise self._closed_error("log_action")
            if not self._view.multiagent:
                self._engine.log_action(episode_id, observation, action)
                return
            if not isinstance(observation, Mapping) or not isinstance(action, Mapping):
                raise SpaceError(
                    f"log_action for episode '{episode_id}': a multi-agent episode takes "
                    "dicts of observations and actions keyed by agent id"
                )
            if set(observation) != set(action):
                raise SpaceError(
                    f"log_action for episode '{episode_id}': the observation and action "
                    f"dicts name different agents ({sorted(observation)} vs {sorted(action)})"
                )
            self._engine.log_agent_actions(episode_id, observation, action)

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
        if self._view.multiagent or multiagent_done_dict is not None:
            with self._lock:
                if self._closed:
                    raise self._closed_error("log_returns")
                if not self._view.multiagent:
                    raise ConfigError(
                        "log_returns got a multiagent_done_dict, but this client's episodes are "
                        "single-agent: the server declares no agent mapping; pass "
                        "PolicyClient(..., multiagent=True) or give the server a [mapping]"
                    )
                self._engine.log_agent_returns(
                    episode_id,
                    agent_rewards(episode_id, reward),
                    agent_infos(episode_id, info, self._conn.limits.max_info_bytes),
                    done_marks(multiagent_done_dict, multiagent_truncated_dict),
                )
            return
        if info or type(reward) is not float or not -MAX_ABS_REWARD <= reward <= MAX_ABS_REWARD:
            reward, info = step_returns(episode_id, reward, info, self._conn.limits.max_info_bytes)
        else:
            info = None  # an empty map is no map
        with self._lock:
            if self._closed:
                raise self._closed_error("log_returns")
            self._engine.log_returns(episode_id, reward, info)

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
            if self._closed:
                raise self._closed_error("end_episode")
            if not self._view.multiagent:
                self._engine.end_episode(episode_id, observation, truncated)
                return
            finals = {} if observation is None else observation
            if not isinstance(finals, Mapping):
                raise SpaceError(
                    f"end_episode for episode '{episode_id}': a multi-agent episode takes a "
                    "dict of final observations keyed by agent id (or an empty dict)"
                )
            self._engine.end_agent_episode(episode_id, finals, truncated)

    def update_policy_weights(self) -> None:
        """Fetch the newest weights now (local mode); in remote mode the server always has them."""
        with self._lock:
            if self._closed:
                raise self._closed_error("update_policy_weights")
            self._engine.update_weights()

    def close(self, timeout: float = 30.0) -> None:
        """Disconnect (what leaving ``with PolicyClient(...) as client:`` does).

        Local mode first ships what is buffered, for up to ``timeout`` seconds (what is left
        then is named in a warning and lost), and stops its threads; a local-mode client never
        closed does this when the interpreter exits, within
        :data:`~rlserve.client.exit_flush.EXIT_FLUSH_TIMEOUT`. Remote mode reads outstanding
        replies (raising a deferred error).

        From another thread, a call blocked on a full buffer returns first; one in flight (a
        request, a weights fetch) is waited for, within its own timeouts. Every call after it
        raises :class:`~rlserve.errors.ClientClosedError`; a second ``close()`` does nothing.
        """
        self._closed = True  # calls from now on are refused
        # A call of another thread blocked on a full buffer holds the lock: let it return.
        self._engine.stop_waiting()
        with self._lock:
            self._engine.close(timeout)

    def _closed_error(self, call: str) -> ClientClosedError:
        return ClientClosedError(
            f"{call}: this PolicyClient was closed (close(), or the end of its 'with' block); "
            "make a new PolicyClient to go on"
        )

    def _mark_closed(self) -> None:
        self._closed = True

    @property
    def weights_version(self) -> int | None:
        """Version of the weights acting in local mode (None in remote mode)."""
        return self._engine.weights_version

    @property
    def local(self) -> LocalInference | None:
        """The local-inference engine (buffer and shipping counters), in local mode."""
        return self._local

    @property
    def front_end(self) -> str:
        """``host:port`` of the front-end in use (local mode: the one weights come from)."""
        return self._conn.front_end

    @property
    def reconnects(self) -> int:
        """How many times the connection was re-opened."""
        return self._conn.reconnects

    def __enter__(self) -> PolicyClient:
        """The client itself: ``with PolicyClient(...) as client:`` closes it at the end."""
        return self

    def __exit__(self, *exc: object) -> None:
        """:meth:`close` (local mode: ship what is buffered) when the block ends."""
        self.close()
