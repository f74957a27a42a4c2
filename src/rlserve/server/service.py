"""The carrier-independent request handler: sessions, episodes and batched inference.

Both carriers (binary TCP and HTTP/JSON) decode a request, call :meth:`Service.handle` with a
``respond`` callback, and write whatever it is called with. Most requests are answered at once.
``get_action`` is deferred: its observations are recorded, queued, and answered when the batch is
flushed. A flush is scheduled with ``loop.call_soon`` on the first pending request, so it runs
after every read that was ready in the same event-loop iteration: decisions pending from many
clients at the same moment go through the policy in one forward pass, without adding a wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import hmac
import itertools
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import gymnasium as gym
import numpy as np

from rlserve.errors import (
    AuthenticationError,
    CapacityError,
    EpisodeError,
    RLServeError,
    ServerError,
    SpaceError,
    VersionMismatchError,
)
from rlserve.experience.agent_columns import AgentTick
from rlserve.experience.agent_groups import AgentGrouper
from rlserve.experience.episode_records import Episode, EpisodeSummary
from rlserve.experience.episodes import EpisodeTable
from rlserve.policy import NumpyPolicy
from rlserve.policy.acting import compute_actions, greedy_in_evaluation
from rlserve.policy.action_layout import actions_to_space, encode_action
from rlserve.policy.weights import WeightsPackage
from rlserve.protocol.episode_requests import (
    DEFAULT_POLICY_ID,
    EndEpisode,
    GetAction,
    LogAction,
    LogReturns,
    StartEpisode,
)
from rlserve.protocol.fragment import Fragment
from rlserve.protocol.limits import PROTOCOL_VERSION, Limits
from rlserve.protocol.mapping import PolicyMapping
from rlserve.protocol.messages import Request, error_reply
from rlserve.protocol.session_requests import GetWeights, Hello, Ping, ReportSamples
from rlserve.protocol.spaces import check_batch, check_one, check_value, describe
from rlserve.protocol.values import check_float32
from rlserve.server.pacing import LearnerPace
from rlserve.server.reports import BatchLedger, FragmentChecker, check_summaries
from rlserve.server.stats import ServerStats
from rlserve.server.throttled_log import SERVER_LOG
from rlserve.version import __version__

Respond = Callable[[dict[str, Any]], None]
"""Callback a carrier passes to write one reply."""

INTERNAL_ERROR = "internal"
"""Error code of a request the server failed to handle because of its own fault."""

INFERENCE_MODES = ("remote", "local")
"""Inference modes this server offers."""

PACED = (GetAction, LogAction, ReportSamples)
"""Requests whose reply lets a client take its next step: held while the learner is behind
(:mod:`~rlserve.server.pacing`)."""

_session_ids = itertools.count(1)


@dataclass(slots=True)
class Session:
    """One client's conversation: a binary connection, or the HTTP carrier as a whole.

    Attributes:
        name: The client's name from ``hello``.
        key: The client identity that owns the episodes this session starts: ``client:<id>``
            for a ``client_id`` (binary ``hello``) or ``X-RLServe-Client`` header (HTTP), else
            one per connection.
        authenticated: Whether ``hello`` (or the HTTP header) presented the right token.
        identity_by_hello: Whether a successful ``hello`` sets ``key`` (binary connections).
            False over HTTP, where the header alone is the identity.
        own_key: The connection's own identity, taken by a ``hello`` without ``client_id``
            (the ``key`` the session was made with).
    """

    name: str = "client"
    key: str = field(default_factory=lambda: f"session-{next(_session_ids)}")
    authenticated: bool = False
    identity_by_hello: bool = True
    own_key: str = ""

    def __post_init__(self) -> None:
        if not self.own_key:
            self.own_key = self.key


@dataclass(slots=True)
class PolicySlot:
    """A policy's spaces and its current numpy weights (None until the learner publishes)."""

    policy_id: str
    observation_space: gym.Space[Any]
    action_space: gym.Space[Any]
    fragment_checker: FragmentChecker
    policy: NumpyPolicy | None = None
    package: WeightsPackage | None = None
    pending: list[_Pending] = field(default_factory=list)
    parts: list[_AgentPart] = field(default_factory=list)
    """Groups of agents of multi-agent ``get_action`` calls waiting for this policy."""
    weight_waiters: list[tuple[GetWeights, Respond]] = field(default_factory=list)
    report_waiters: list[tuple[ReportSamples, Session, Respond]] = field(default_factory=list)


@dataclass(slots=True)
class _Pending:
    request: GetAction
    episodes: list[Episode]
    respond: Respond
    joined: list[tuple[GetAction, Respond]] = field(default_factory=list)
    """Retries of this request (same episodes and seqs) answered with the same actions."""


@dataclass(slots=True)
class _AgentPart:
    """One policy's share of a pending multi-agent ``get_action``."""

    owner: _AgentsPending
    slot: PolicySlot
    group: int
    """The group's index in the call's grouping."""
    idx: np.ndarray
    """Positions of this policy's agents in the call."""
    obs: np.ndarray
    """Their checked, flattened observations ``[k, D]``."""


@dataclass(slots=True)
class _AgentsPending:
    """A multi-agent ``get_action`` waiting for the actions of every policy it involves."""

    request: GetAction
    episode: Episode
    tick: AgentTick
    respond: Respond
    remaining: int
    results: list[tuple[_AgentPart, Any, np.ndarray, Any, int]] = field(default_factory=list)
    """Per part: (part, actions as trained, log-probabilities, actions as sent, version)."""
    joined: list[tuple[GetAction, Respond]] = field(default_factory=list)


def _evaluation_rows(pending: list[_Pending], parts: list[_AgentPart]) -> np.ndarray:
    """Which rows of a slot's forward pass are of evaluation episodes.

    Episodes started with ``training_enabled=False``; in the order
    :meth:`Service._flush_slot` stacks the rows (pending single-agent calls, then agent parts).
    """
    rows = [not ep.training_enabled for item in pending for ep in item.episodes]
    for part in parts:
        rows += [not part.owner.episode.training_enabled] * len(part.idx)
    return np.asarray(rows, dtype=bool)


def identity_key(client_id: str) -> str:
    """The episode-owner key of a client identity (the same on both carriers)."""
    return f"client:{client_id}"


class SampleSink(Protocol):
    """Where finished fragments go (the learner link)."""

    def add(self, fragment: Fragment) -> None:
        """Queue one fragment."""

    def add_batch(
        self,
        fragments: list[Fragment],
        batch_id: str,
        on_done: Callable[[int], None],
        source: str = "",
    ) -> None:
        """Store a reported batch durably; ``on_done(dropped_steps)`` once a learner has it.

        ``source`` is the client identity that reported it (the session's key).

        Raises:
            OSError: It could not be stored; nothing of it was kept.
        """


class Service:
    """Handles every request of protocol v1 for any carrier.

    Args:
        policies: The policies served, by id, with their spaces.
        limits: Wire limits (also sent to clients in ``welcome``).
        token: Shared secret, or None for none.
        fragment_length: Steps per fragment handed to the learner.
        sink: Receives finished training fragments and reported batches.
        stats: Counters for metrics.
        seed: Seed of action sampling.
        mapping: Which policy acts for which agent of a multi-agent episode (None: every agent
            maps to the only policy, when there is one).
        pace: Holds the replies that let a client step on while the learner is too far behind
            (None: never held).
    """

    def __init__(
        self,
        policies: dict[str, tuple[gym.Space[Any], gym.Space[Any]]],
        limits: Limits,
        token: str | None,
        fragment_length: int,
        sink: SampleSink,
        stats: ServerStats,
        seed: int = 0,
        mapping: PolicyMapping | None = None,
        pace: LearnerPace | None = None,
    ):
        self.limits = limits
        self.pace = pace
        self.mapping = mapping if mapping is not None else PolicyMapping([], policies)
        self.multi_agent = bool(self.mapping.rules) or len(policies) > 1
        """Whether the server was declared multi-agent (a mapping, or several policies); told
        to clients in ``welcome`` so that they read a dict of observations as one per agent."""
        self.grouper = AgentGrouper(self.mapping, policies)
        self._token = token
        self._seed = seed
        self.stats = stats
        self.slots = {
            pid: PolicySlot(pid, obs, act, FragmentChecker(obs, act, pid, limits))
            for pid, (obs, act) in policies.items()
        }
        self.episodes = EpisodeTable(
            fragment_length,
            limits.max_episodes_per_server,
            limits.max_episodes_per_client,
            sink.add,
        )
        self._sink = sink
        self.ledger = BatchLedger()
        self._flush_scheduled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self.instance_id = uuid.uuid4().hex
        """Random per server start: a reconnecting client sees that the server restarted."""

    # -- weights ---------------------------------------------------------------------------

    def set_weights(self, policy_id: str, package: WeightsPackage) -> None:
        """Switch a policy to new weights; pending requests use them at the next flush."""
        slot = self.slots[policy_id]
        slot.policy = NumpyPolicy(
            package.spec, package.arrays, package.version, seed=self._seed + package.version
        )
        slot.package = package
        self.stats.set_policy_version(policy_id, package.version)
        if slot.pending or slot.parts:
            self._schedule_flush()
        waiters, slot.weight_waiters = slot.weight_waiters, []
        for request, respond in waiters:
            respond(self._weights_reply(request, package))
        reports, slot.report_waiters = slot.report_waiters, []
        for report, session, respond in reports:
            # Reports that arrived before the first weights (e.g. re-sent right after a
            # restart) are checked now, against the versions this server publishes.
            self.handle(report, session, respond)

    # -- dispatch --------------------------------------------------------------------------

    def handle(self, request: Request, session: Session, respond: Respond) -> bool:
        """Handle one request; return True when ``respond`` will be called later.

        Errors are answered with an ``error`` reply; they never propagate to the carrier.
        """
        try:
            if isinstance(request, Hello):
                respond(self._hello(request, session))
                return False
            if not session.authenticated:
                raise AuthenticationError(
                    "the first message on a connection must be 'hello' with a valid token"
                )
            if self.pace is not None and self.pace.enabled and isinstance(request, PACED):
                paced = self.pace.paced(respond)
                return self._dispatch(request, session, paced) or paced.held
            return self._dispatch(request, session, respond)
        except RLServeError as exc:
            self.stats.count_error(exc.code)
            respond(error_reply(request.id, exc.code, str(exc)))
        except Exception as exc:  # a bug must cost one reply, never the connection or server
            self.stats.count_error(INTERNAL_ERROR)
            SERVER_LOG.warn(
                INTERNAL_ERROR,
                f"internal error handling '{type(request).__name__}': {exc!r} (a bug; please "
                "report it with the request that caused it)",
            )
            with contextlib.suppress(Exception):  # a broken respond cannot be answered
                respond(
                    error_reply(
                        request.id,
                        INTERNAL_ERROR,
                        f"the server failed to handle this request ({type(exc).__name__}: "
                        f"{exc}); it may be partly applied; the connection stays usable",
                    )
                )
        return False

    def _dispatch(self, request: Request, session: Session, respond: Respond) -> bool:
        if isinstance(request, GetAction):
            return self._get_action(request, session, respond)
        if isinstance(request, ReportSamples):
            return self._report_samples(request, session, respond)
        if isinstance(request, GetWeights):
            return self._get_weights(request, respond)
        respond(self._simple(request, session))
        return False

    def _simple(self, request: Request, session: Session) -> dict[str, Any]:
        if isinstance(request, LogReturns):
            if request.agent_ids is not None:
                return self._log_agent_returns(request, session)
            episode = self._episode(request.episode_id, session)
            if not self.episodes.check_seq(episode, request.seq, "log_returns"):
                self.episodes.log_returns(episode, request.reward, request.info)
                self.episodes.record_seq(episode, request.seq, "log_returns")
            return {"type": "ok", "id": request.id}
        if isinstance(request, LogAction):
            return self._log_action(request, session)
        if isinstance(request, EndEpisode):
            return self._end_episode(request, session)
        if isinstance(request, StartEpisode):
            policy_id = request.policy_id
            if policy_id == DEFAULT_POLICY_ID and policy_id not in self.slots:
                # Not named: the only policy, or none (then every call must name agents).
                policy_id = next(iter(self.slots)) if len(self.slots) == 1 else ""
            else:
                self._slot(policy_id)  # an unknown policy is an error
            if request.episode_id is not None and self.episodes.started_unused(
                request.episode_id, session.key
            ):
                # A retry after a lost reply: the episode is this client's and still unused.
                return {
                    "type": "episode_started",
                    "id": request.id,
                    "episode_id": request.episode_id,
                }
            episode_id = self.episodes.start(
                request.episode_id, request.training_enabled, policy_id, session.key
            )
            self.stats.episodes_started += 1
            self.stats.episodes_active = len(self.episodes)
            return {"type": "episode_started", "id": request.id, "episode_id": episode_id}
        if isinstance(request, Ping):
            return {"type": "pong", "id": request.id}
        raise EpisodeError(f"unexpected request {type(request).__name__}")

    def _hello(self, hello: Hello, session: Session) -> dict[str, Any]:
        if hello.protocol_version != PROTOCOL_VERSION:
            raise VersionMismatchError(
                f"client speaks protocol version {hello.protocol_version}, this server speaks "
                f"{PROTOCOL_VERSION}; install an rlserve client of the same protocol version"
            )
        if self._token is not None and not hmac.compare_digest(
            (hello.token or "").encode(), self._token.encode()
        ):
            raise AuthenticationError(
                "wrong or missing token; pass the server's --token value as token= to the client"
            )
        if hello.inference_mode not in INFERENCE_MODES:
            raise VersionMismatchError(
                f"inference mode '{hello.inference_mode}' is not offered by this server; it "
                f"offers {list(INFERENCE_MODES)}"
            )
        session.name = hello.client_name
        if session.identity_by_hello:
            # Every successful hello sets the identity, a later one as the first: its
            # client_id, or without one the connection's own (docs/protocol.md section 3.3).
            client_id = hello.client_id
            session.key = session.own_key if client_id is None else identity_key(client_id)
        session.authenticated = True
        return self.welcome(hello.id)

    def welcome(self, request_id: int | None) -> dict[str, Any]:
        """The ``welcome`` reply: versions, policies and their spaces, modes, limits."""
        return {
            "type": "welcome",
            "id": request_id,
            "protocol_version": PROTOCOL_VERSION,
            "server_version": __version__,
            "policies": {
                pid: {
                    "observation_space": describe(slot.observation_space),
                    "action_space": describe(slot.action_space),
                }
                for pid, slot in self.slots.items()
            },
            "mapping": self.mapping.to_wire(),
            "multi_agent": self.multi_agent,
            "inference_modes": list(INFERENCE_MODES),
            "instance_id": self.instance_id,
            "limits": self.limits.to_wire(),
        }

    def _episode(self, episode_id: str, session: Session) -> Episode:
        return self.episodes.owned(episode_id, session.key)

    # -- actions ---------------------------------------------------------------------------

    def _get_action(self, request: GetAction, session: Session, respond: Respond) -> bool:
        if request.agent_ids is not None:
            return self._get_agent_actions(request, session, respond)
        episodes = [self._episode(eid, session) for eid in request.episode_ids]
        # The others are checked against it; check_observe refuses a multi-agent one.
        slot = self._single_slot(episodes[0], "get_action")
        if any(e.policy_id != slot.policy_id for e in episodes):
            raise EpisodeError("one get_action may only name episodes of the same policy")
        if request.seqs is not None:
            retried = [
                self.episodes.check_seq(e, seq, "get_action")
                for e, seq in zip(episodes, request.seqs, strict=True)
            ]
            if any(retried):
                return self._retry_get_action(request, episodes, retried, slot, respond)
        if request.batched:
            obs = check_batch(
                slot.observation_space, request.observations, len(episodes), "observations"
            )
        else:
            obs = check_one(slot.observation_space, request.observations[0], "observation")
        rewards, infos = request.rewards, request.infos
        # Check every episode before changing any, so a bad batch leaves all of them untouched.
        for i, episode in enumerate(episodes):
            self.episodes.check_observe(episode, None if rewards is None else rewards[i])
        for i, episode in enumerate(episodes):
            self.episodes.observe(
                episode,
                obs[i],
                None if rewards is None else rewards[i],
                None if infos is None else infos[i],
            )
            if request.seqs is not None:
                self.episodes.record_seq(episode, request.seqs[i], "get_action")
        slot.pending.append(_Pending(request, episodes, respond))
        if slot.policy is not None:
            self._schedule_flush()
        return True

    def _retry_get_action(
        self,
        request: GetAction,
        episodes: list[Episode],
        retried: list[bool],
        slot: PolicySlot,
        respond: Respond,
    ) -> bool:
        """Answer a repeated ``get_action`` with the first answer, or join it while pending."""
        if not all(retried):
            raise EpisodeError(
                "get_action 'seqs' mix retries (the episode's last number) and new calls; "
                "re-send a batched call exactly as it was, or number every episode's next call"
            )
        if any(e.answer is None for e in episodes):
            # The call it repeats is still waiting for its actions (record_seq cleared the
            # answer). A pending call without seq is another call: the retry gets its answer.
            for item in slot.pending:
                if len(item.episodes) == len(episodes) and all(
                    a is b for a, b in zip(item.episodes, episodes, strict=True)
                ):
                    item.joined.append((request, respond))
                    return True
            raise EpisodeError(
                "get_action retry names other episodes than the call it repeats, which is still "
                "being answered; re-send a call exactly as it was"
            )
        if request.batched:
            actions = np.asarray([e.answer for e in episodes])
            respond({"type": "action", "id": request.id, "actions": actions})
        else:
            respond({"type": "action", "id": request.id, "action": episodes[0].answer})
        return False

    def _single_slot(self, episode: Episode, call: str) -> PolicySlot:
        """The policy slot of a single-agent call's episode.

        Raises:
            EpisodeError: The episode is multi-agent, or has no policy of its own (a server of
                several policies, started without naming one).
        """
        if episode.agents is not None:
            raise EpisodeError(
                f"{call} for episode '{episode.episode_id}' names no agent, but the episode is "
                "multi-agent (its calls name agents): pass a dict keyed by agent id "
                "(agent_ids on the wire)"
            )
        slot = self.slots.get(episode.policy_id)
        if slot is None:
            raise EpisodeError(
                f"{call} for episode '{episode.episode_id}' names no agent and the episode has "
                f"no policy: this server serves several ({sorted(self.slots)}); name one in "
                "start_episode (policy_id) or name the agents of each call"
            )
        return slot

    # -- multi-agent calls -----------------------------------------------------------------

    def _get_agent_actions(self, request: GetAction, session: Session, respond: Respond) -> bool:
        assert request.agent_ids is not None
        episode = self._episode(request.episode_ids[0], session)
        seq = None if request.seqs is None else request.seqs[0]
        if self.episodes.check_seq(episode, seq, "get_action"):
            return self._retry_agent_actions(request, episode, respond)
        agent_ids = request.agent_ids
        self._check_agent_count(episode, agent_ids)
        grouping = self.grouper.group(agent_ids, request.policy_ids)
        blocks = self.grouper.blocks(
            grouping, agent_ids, request.observations, "get_action 'observations'"
        )
        tick = self.episodes.observe_agents(
            episode,
            agent_ids,
            grouping.policy_ids,
            grouping.groups,
            blocks,
            request.rewards,
            request.infos,
            "get_action",
        )
        self.episodes.record_seq(episode, seq, "get_action")
        pending = _AgentsPending(request, episode, tick, respond, len(grouping.groups))
        if seq is not None:
            # A retry while it is pending joins it. A call without seq leaves the last
            # numbered call's answer for a retry of that one.
            episode.answer = pending
        ready = False
        for g, ((policy_id, idx), block) in enumerate(zip(grouping.groups, blocks, strict=True)):
            slot = self.slots[policy_id]
            slot.parts.append(_AgentPart(pending, slot, g, idx, block))
            ready = ready or slot.policy is not None
        if ready:
            self._schedule_flush()
        return True

    def _check_agent_count(self, episode: Episode, agent_ids: list[str]) -> None:
        known = episode.agents
        held = 0 if known is None else len(known)
        limit = self.limits.max_agents_per_episode
        if held + len(agent_ids) > limit:
            new = sum(1 for a in agent_ids if known is None or a not in known)
            if held + new > limit:
                raise CapacityError(
                    f"episode '{episode.episode_id}' would hold {held + new} agents; the "
                    f"limit is {limit} (max_agents_per_episode): end the episode and start a new "
                    "one, or reuse agent ids"
                )

    def _retry_agent_actions(self, request: GetAction, episode: Episode, respond: Respond) -> bool:
        answer = episode.answer
        if isinstance(answer, _AgentsPending):
            if answer.request.agent_ids != request.agent_ids:
                raise EpisodeError(
                    "get_action retry names other agents than the call it repeats, which is "
                    "still being answered; re-send a call exactly as it was"
                )
            answer.joined.append((request, respond))
            return True
        respond({"type": "action", "id": request.id, "actions": answer})
        return False

    def _deliver_part(
        self, part: _AgentPart, actions: Any, logp: np.ndarray, sent: Any, version: int
    ) -> None:
        """Take one policy's actions for a multi-agent call; answer once every part is in."""
        owner = part.owner
        owner.results.append((part, actions, logp, sent, version))
        owner.remaining -= 1
        if owner.remaining:
            return
        episode = owner.episode
        single = len(owner.results) == 1
        reply_actions: Any = None if single else [None] * len(owner.request.agent_ids or ())
        for part_, trained, logps, env_actions, ver in owner.results:
            self.episodes.act_agents(episode, owner.tick, part_.group, trained, logps, True, ver)
            if single:
                # One policy: its actions in the call's order, one typed array when they are.
                reply_actions = env_actions
            else:
                discrete = isinstance(part_.slot.action_space, gym.spaces.Discrete)
                for j, i in enumerate(part_.idx.tolist()):
                    reply_actions[i] = int(env_actions[j]) if discrete else env_actions[j]
        self.episodes.finish_tick(episode)
        if owner.request.seqs is not None:
            # Kept for a retry of this call; a copy, so the batch's arrays are not kept.
            episode.answer = copy.deepcopy(reply_actions)
        reply = {"type": "action", "id": owner.request.id, "actions": reply_actions}
        owner.respond(reply)
        for joined, respond in owner.joined:
            respond({**reply, "id": joined.id})

    def _log_agent_actions(self, request: LogAction, session: Session) -> dict[str, Any]:
        assert request.agent_ids is not None
        episode = self._episode(request.episode_id, session)
        if self.episodes.check_seq(episode, request.seq, "log_action"):
            return {"type": "ok", "id": request.id}
        agent_ids = request.agent_ids
        self._check_agent_count(episode, agent_ids)
        grouping = self.grouper.group(agent_ids, request.policy_ids)
        blocks = self.grouper.blocks(
            grouping, agent_ids, request.observation, "log_action 'observations'"
        )
        actions = self.grouper.actions(grouping, agent_ids, request.action, "log_action 'actions'")
        tick = self.episodes.observe_agents(
            episode,
            agent_ids,
            grouping.policy_ids,
            grouping.groups,
            blocks,
            request.rewards,
            request.infos,
            "log_action",
        )
        for g, (policy_id, idx) in enumerate(grouping.groups):
            slot = self.slots[policy_id]
            version = slot.policy.version if slot.policy is not None else 0
            positions = idx.tolist()
            self.episodes.act_agents(
                episode,
                tick,
                g,
                np.asarray([actions[i] for i in positions]),
                np.full(len(positions), np.nan, np.float32),
                False,
                version,
            )
        self.episodes.finish_tick(episode)
        self.episodes.record_seq(episode, request.seq, "log_action")
        self.stats.count_actions(len(agent_ids), batch=0)
        return {"type": "ok", "id": request.id}

    def _log_agent_returns(self, request: LogReturns, session: Session) -> dict[str, Any]:
        assert request.agent_ids is not None and request.rewards is not None
        episode = self._episode(request.episode_id, session)
        if not self.episodes.check_seq(episode, request.seq, "log_returns"):
            self.episodes.log_returns_agents(
                episode, request.agent_ids, request.rewards, request.infos, request.done or {}
            )
            self.episodes.record_seq(episode, request.seq, "log_returns")
        return {"type": "ok", "id": request.id}

    def _end_agent_episode(self, request: EndEpisode, session: Session) -> dict[str, Any]:
        assert request.agent_ids is not None
        if self.episodes.ended_by(request.episode_id, session.key, request.seq):
            return {"type": "ok", "id": request.id}  # a retry of the call that ended it
        episode = self._episode(request.episode_id, session)
        self.episodes.check_seq(episode, request.seq, "end_episode")
        rows: list[Any] = []
        if request.agent_ids:
            known = episode.agents
            explicit: list[str | None] = [
                None if known is None else known.policy_of(a) for a in request.agent_ids
            ]
            grouping = self.grouper.group(request.agent_ids, explicit)
            _, rows = self.grouper.observations(
                grouping, request.agent_ids, request.observation, "end_episode 'observations'"
            )
        summary = self.episodes.end_agents(
            episode,
            request.agent_ids,
            rows,
            request.rewards,
            request.infos,
            request.truncated,
            request.seq,
        )
        self.stats.record_episode(summary)
        self.stats.episodes_active = len(self.episodes)
        return {"type": "ok", "id": request.id}

    def _schedule_flush(self) -> None:
        if self._flush_scheduled:
            return
        self._flush_scheduled = True
        loop = self._loop or asyncio.get_running_loop()
        self._loop = loop
        loop.call_soon(self.flush)

    def flush(self) -> None:
        """Answer every pending ``get_action`` with one forward pass per policy."""
        self._flush_scheduled = False
        for slot in self.slots.values():
            if (slot.pending or slot.parts) and slot.policy is not None:
                self._flush_slot(slot, slot.policy)

    def _fail_pending(
        self, pending: list[_Pending], parts: list[_AgentPart], exc: Exception
    ) -> None:
        """Answer every request of a failed forward pass with an ``internal`` error."""
        self.stats.count_error(INTERNAL_ERROR)
        SERVER_LOG.warn(INTERNAL_ERROR, f"internal error computing actions: {exc!r} (a bug)")
        message = (
            f"the server failed to compute this action ({type(exc).__name__}: {exc}); "
            "end these episodes and start new ones"
        )
        owners = {id(part.owner): part.owner for part in parts}.values()
        items: list[_Pending | _AgentsPending] = [*pending, *owners]
        for item in items:
            answers = [(item.request.id, item.respond), *((j.id, r) for j, r in item.joined)]
            for request_id, respond in answers:
                with contextlib.suppress(Exception):
                    respond(error_reply(request_id, INTERNAL_ERROR, message))

    def _flush_slot(self, slot: PolicySlot, policy: NumpyPolicy) -> None:
        pending, slot.pending = slot.pending, []
        parts, slot.parts = slot.parts, []
        blocks = [part.obs for part in parts]
        if pending:
            blocks.insert(
                0, np.stack([ep.agent.obs[-1] for item in pending for ep in item.episodes])
            )
        discrete = isinstance(slot.action_space, gym.spaces.Discrete)
        try:
            obs = blocks[0] if len(blocks) == 1 else np.concatenate(blocks)
            if greedy_in_evaluation(policy):
                out = compute_actions(policy, obs, _evaluation_rows(pending, parts))
            else:
                out = policy.compute_actions(obs)
            env_actions = policy.to_env_actions(out.actions)
            if not discrete:
                # In the space's own form: [N, *shape] arrays, or a list of maps / tuples.
                env_actions = actions_to_space(slot.action_space, env_actions)
        except Exception as exc:  # a bug in inference must not leave its clients waiting
            self._fail_pending(pending, parts, exc)
            return
        offset = 0
        for item in pending:
            count = len(item.episodes)
            for j, episode in enumerate(item.episodes):
                k = offset + j
                action = int(out.actions[k]) if discrete else out.actions[k]
                self.episodes.act(episode, action, float(out.logp[k]), True, policy.version)
                if item.request.seqs is not None:
                    # Kept for a retry of this call; a copy, so the batch's array is not kept.
                    answer = env_actions[k]
                    episode.answer = int(answer) if discrete else copy.deepcopy(answer)
            chunk = env_actions[offset : offset + count]
            offset += count
            reply: dict[str, Any] = {"type": "action", "id": item.request.id}
            if item.request.batched:
                reply["actions"] = chunk
            else:
                reply["action"] = int(chunk[0]) if discrete else chunk[0]
            item.respond(reply)
            for joined, respond in item.joined:
                respond({**reply, "id": joined.id})
        for part in parts:
            count = len(part.idx)
            end = offset + count
            self._deliver_part(
                part,
                out.actions[offset:end],
                out.logp[offset:end],
                env_actions[offset:end],
                policy.version,
            )
            offset = end
        self.stats.count_actions(offset, batch=offset)

    def _log_action(self, request: LogAction, session: Session) -> dict[str, Any]:
        if request.agent_ids is not None:
            return self._log_agent_actions(request, session)
        episode = self._episode(request.episode_id, session)
        if self.episodes.check_seq(episode, request.seq, "log_action"):
            return {"type": "ok", "id": request.id}
        slot = self._single_slot(episode, "log_action")
        obs = check_one(slot.observation_space, request.observation, "observation")
        action = check_value(slot.action_space, request.action, "action")
        if isinstance(slot.action_space, gym.spaces.Discrete):
            action -= int(slot.action_space.start)  # the learner works with choice indices
        else:
            # The flat layout the learner trains on (docs/protocol.md §6.3).
            action = check_float32(encode_action(slot.action_space, action), "log_action 'action'")
        self.episodes.observe(episode, obs[0], request.reward, request.info, "log_action")
        version = slot.policy.version if slot.policy is not None else 0
        self.episodes.act(episode, action, float("nan"), False, version)
        self.episodes.record_seq(episode, request.seq, "log_action")
        self.stats.count_actions(1, batch=0)
        return {"type": "ok", "id": request.id}

    def _end_episode(self, request: EndEpisode, session: Session) -> dict[str, Any]:
        if request.agent_ids is not None:
            return self._end_agent_episode(request, session)
        if self.episodes.ended_by(request.episode_id, session.key, request.seq):
            return {"type": "ok", "id": request.id}  # a retry of the call that ended it
        episode = self._episode(request.episode_id, session)
        self.episodes.check_seq(episode, request.seq, "end_episode")
        slot = self._single_slot(episode, "end_episode")
        obs = check_one(slot.observation_space, request.observation, "observation")
        summary = self.episodes.end(
            episode, obs[0], request.truncated, request.reward, request.seq, request.info
        )
        self.stats.record_episode(summary)
        self.stats.episodes_active = len(self.episodes)
        return {"type": "ok", "id": request.id}

    # -- local inference -------------------------------------------------------------------

    def _slot(self, policy_id: str) -> PolicySlot:
        slot = self.slots.get(policy_id)
        if slot is None:
            raise EpisodeError(
                f"unknown policy '{policy_id}'; this server serves {sorted(self.slots)}"
            )
        return slot

    def _get_weights(self, request: GetWeights, respond: Respond) -> bool:
        slot = self._slot(request.policy_id)
        if slot.package is None:
            # The learner has not published yet: answer as soon as it does.
            slot.weight_waiters.append((request, respond))
            return True
        respond(self._weights_reply(request, slot.package))
        return False

    @staticmethod
    def _weights_reply(request: GetWeights, package: WeightsPackage) -> dict[str, Any]:
        reply: dict[str, Any] = {
            "type": "weights",
            "id": request.id,
            "policy_id": request.policy_id,
            "version": package.version,
            "unchanged": request.have_version == package.version,
        }
        if not reply["unchanged"]:
            reply["model"] = package.spec.to_wire()
            reply["arrays"] = package.arrays
        return reply

    def _report_samples(self, request: ReportSamples, session: Session, respond: Respond) -> bool:
        slot = self._slot(request.policy_id)
        if slot.package is None:
            # Nothing can be checked against published versions yet: wait for the learner.
            slot.report_waiters.append((request, session, respond))
            return True
        state = self.ledger.begin(request, respond)
        if state != "new":
            return state == "waiting"
        try:
            where = f"report_samples '{request.batch_id}'"
            check = slot.fragment_checker.check
            version = slot.package.version
            fragments = [
                check(raw, version, f"{where}.fragments[{i}]")
                for i, raw in enumerate(request.fragments)
            ]
            summaries = check_summaries(
                request.episodes, self.limits, where, request.policy_id, self.slots
            )
        except RLServeError:
            self.ledger.abandon(request.batch_id)
            raise
        except (TypeError, ValueError, OverflowError) as exc:
            self.ledger.abandon(request.batch_id)
            raise SpaceError(f"report_samples '{request.batch_id}': malformed: {exc}") from exc
        steps = sum(len(f) for f in fragments)

        def handed(dropped: int) -> None:
            # The version of this report's policy: a local client compares it with its own.
            served = slot.package.version if slot.package is not None else -1
            self.ledger.finish(request, steps, dropped, served)

        if fragments:
            try:
                self._sink.add_batch(fragments, request.batch_id, handed, session.key)
            except OSError as exc:
                self.ledger.abandon(request.batch_id)
                raise ServerError(
                    f"report_samples '{request.batch_id}': the server cannot store experience "
                    f"now ({exc}); nothing was kept: send the batch again later"
                ) from exc
        # Counted once it is in the experience log: from then on it is never lost, and a
        # re-sent copy is answered as a duplicate, even after a crash.
        self.stats.count_reported(steps)
        for summary in summaries:
            self.stats.record_reported_episode(summary)
        if not fragments:
            handed(0)
        return True

    def expire_idle(self, idle_timeout: float) -> list[EpisodeSummary]:
        """Close idle episodes and count them."""
        summaries = self.episodes.expire_idle(idle_timeout)
        for summary in summaries:
            self.stats.record_episode(summary)
        self.stats.episodes_active = len(self.episodes)
        return summaries
