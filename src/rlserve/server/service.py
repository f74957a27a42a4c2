"""The carrier-independent request handler: dispatch, the flush schedule, and published weights.

Both carriers (binary TCP and HTTP/JSON) decode a request, call :meth:`Service.handle` with a
``respond`` callback, and write whatever it is called with. Most requests are answered at once.
``get_action`` is deferred: its observations are recorded, queued, and answered when the batch is
flushed. A flush is scheduled with ``loop.call_soon`` on the first pending request, so it runs
after every read that was ready in the same event-loop iteration: decisions pending from many
clients at the same moment go through the policy in one forward pass, without adding a wait.

The parts: sessions and ``hello`` (:mod:`~rlserve.server.sessions`), the episode calls
(:mod:`~rlserve.server.single_agent_calls`, :mod:`~rlserve.server.multi_agent_calls`), the
policy slots and the flush (:mod:`~rlserve.server.batching`), local inference
(:mod:`~rlserve.server.local_inference`), a mapping function
(:mod:`~rlserve.server.mapping_function`), and internal errors (:mod:`~rlserve.server.replies`).
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import gymnasium as gym

from rlserve.errors import AuthenticationError, EpisodeError, RLServeError
from rlserve.experience.agent_groups import AgentGrouper
from rlserve.experience.episode_records import EpisodeSummary
from rlserve.experience.episodes import EpisodeTable
from rlserve.experience.frame_stacks import FrameRule
from rlserve.policy import NumpyPolicy
from rlserve.policy.action_mask import LegalMoves
from rlserve.policy.weights import WeightsPackage
from rlserve.protocol.limits import Limits
from rlserve.protocol.mapping import PolicyMapping
from rlserve.protocol.messages import (
    DEFAULT_POLICY_ID,
    EndEpisode,
    GetAction,
    GetWeights,
    Hello,
    LogAction,
    LogReturns,
    MapAgents,
    Ping,
    ReportSamples,
    Request,
    StartEpisode,
)
from rlserve.protocol.replies import EpisodeStarted, ErrorReply, Pong, Welcome
from rlserve.protocol.spaces import describe
from rlserve.server.batching import Batcher, PolicySlot, named_slot
from rlserve.server.client_activity import ClientActivity
from rlserve.server.episode_calls import EpisodeCalls
from rlserve.server.local_inference import LocalInference, SampleSink, weights_reply
from rlserve.server.mapping_function import MappingFn, MappingFunction
from rlserve.server.multi_agent_calls import MultiAgentCalls
from rlserve.server.pacing import LearnerPace
from rlserve.server.replies import Respond, answer_internal_error
from rlserve.server.reports import BatchLedger, FragmentChecker
from rlserve.server.sessions import INFERENCE_MODES, Session, accept_hello
from rlserve.server.single_agent_calls import SingleAgentCalls
from rlserve.server.stats import ServerStats
from rlserve.version import __version__

__all__ = ["PACED", "Service", "Session"]

PACED = (GetAction, LogAction, ReportSamples)
"""Requests whose reply lets a client take its next step: held while the learner is behind
(:mod:`~rlserve.server.pacing`)."""


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
        mapping_fn: RLlib's ``policy_mapping_fn``, asked about the agents no rule of
            ``mapping`` maps (None: the rules alone).
        frame_stacks: Each policy's ``frame_stack`` (missing: 1): its clients send single frames
            of its observation space, its episodes are recorded stacked.
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
        mapping_fn: MappingFn | None = None,
        frame_stacks: dict[str, int] | None = None,
    ):
        self.limits = limits
        self.pace = pace
        self.mapping = mapping if mapping is not None else PolicyMapping([], policies)
        self.mapper = (
            None if mapping_fn is None else MappingFunction(mapping_fn, self.mapping, policies)
        )
        self.multi_agent = bool(self.mapping.rules) or len(policies) > 1 or self.mapper is not None
        """Whether the server was declared multi-agent (a mapping, or several policies); told
        to clients in ``welcome`` so that they read a dict of observations as one per agent."""
        self.grouper = AgentGrouper(self.mapping, policies)
        self._token = token
        self._seed = seed
        self.stats = stats
        self.slots = {
            pid: _slot(pid, obs, act, limits, (frame_stacks or {}).get(pid, 1))
            for pid, (obs, act) in policies.items()
        }
        self.episodes = EpisodeTable(
            fragment_length,
            limits.max_episodes_per_server,
            limits.max_episodes_per_client,
            sink.add,
            max_info_bytes=limits.max_info_bytes,
            max_agents=(limits.max_agents_per_client, limits.max_agents_per_server),
        )
        self.ledger = BatchLedger()
        self.batcher = Batcher(self.episodes, stats)
        calls = (self.slots, self.episodes, self.grouper, limits, stats, self._schedule_flush)
        self._single = SingleAgentCalls(*calls)
        self._agents = MultiAgentCalls(*calls)
        self._agents.mapper = self.mapper
        self._local = LocalInference(self.slots, limits, self.ledger, sink, stats)
        self._flush_scheduled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self.instance_id = uuid.uuid4().hex
        """Random per server start: a reconnecting client sees that the server restarted."""
        self.activity = ClientActivity()
        """Requests per client identity (the dashboard's client table)."""

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
            respond(weights_reply(request, package))
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
                accept_hello(request, session, self._token, self.mapper is not None)
                respond(self.welcome(request.id))
                return False
            if not session.authenticated:
                raise AuthenticationError(
                    "the first message on a connection must be 'hello' with a valid token"
                )
            # Over HTTP the session name is the identity header, a secret: not shown.
            self.activity.saw(session.key, session.name if session.identity_by_hello else "")
            if self.pace is not None and self.pace.enabled and isinstance(request, PACED):
                paced = self.pace.paced(respond)
                return self._dispatch(request, session, paced) or paced.held
            return self._dispatch(request, session, respond)
        except RLServeError as exc:
            self.stats.count_error(exc.code)
            respond(ErrorReply(request.id, exc.code, str(exc)).to_wire())
        except Exception as exc:  # a bug must cost one reply, never the connection or server
            answer_internal_error(
                self.stats,
                exc,
                f"internal error handling '{type(request).__name__}': {exc!r} (a bug; please "
                "report it with the request that caused it)",
                "handle this request",
                "it may be partly applied; the connection stays usable",
                [(request.id, respond)],
            )
        return False

    def _dispatch(self, request: Request, session: Session, respond: Respond) -> bool:
        if isinstance(request, GetAction):
            return self._calls(request).get_action(request, session, respond)
        if isinstance(request, ReportSamples):
            return self._local.report_samples(request, session, respond)
        if isinstance(request, GetWeights):
            return self._local.get_weights(request, respond)
        respond(self._simple(request, session))
        return False

    def _calls(self, request: GetAction | LogAction | LogReturns | EndEpisode) -> EpisodeCalls:
        """The calls of the kind of episode a call is for: multi-agent when it names agents."""
        return self._single if request.agent_ids is None else self._agents

    def _simple(self, request: Request, session: Session) -> dict[str, Any]:
        if isinstance(request, LogReturns):
            return self._calls(request).log_returns(request, session)
        if isinstance(request, LogAction):
            return self._calls(request).log_action(request, session)
        if isinstance(request, EndEpisode):
            return self._calls(request).end_episode(request, session)
        if isinstance(request, StartEpisode):
            return self._start_episode(request, session)
        if isinstance(request, Ping):
            return Pong(request.id).to_wire()
        if isinstance(request, MapAgents):
            return self._agents.map_agents(request, session)
        raise EpisodeError(f"unexpected request {type(request).__name__}")

    def _start_episode(self, request: StartEpisode, session: Session) -> dict[str, Any]:
        policy_id = request.policy_id
        if policy_id == DEFAULT_POLICY_ID and policy_id not in self.slots:
            # Not named: the only policy, or none (then every call must name agents).
            policy_id = next(iter(self.slots)) if len(self.slots) == 1 else ""
        else:
            named_slot(self.slots, policy_id)  # an unknown policy is an error
        if request.episode_id is not None and self.episodes.started_unused(
            request.episode_id, session.key
        ):
            # A retry after a lost reply: the episode is this client's and still unused.
            return EpisodeStarted(request.id, request.episode_id).to_wire()
        episode_id = self.episodes.start(
            request.episode_id, request.training_enabled, policy_id, session.key
        )
        self.stats.episodes_started += 1
        self.stats.episodes_active = len(self.episodes)
        return EpisodeStarted(request.id, episode_id).to_wire()

    def welcome(self, request_id: int | None) -> dict[str, Any]:
        """The ``welcome`` reply: versions, policies and their spaces, modes, limits."""
        return Welcome(
            request_id,
            __version__,
            {
                pid: {
                    "observation_space": describe(slot.observation_space),
                    "action_space": describe(slot.action_space),
                    **({} if slot.frames is None else {"frame_stack": slot.frames.n}),
                }
                for pid, slot in self.slots.items()
            },
            self.mapping.to_wire(),
            self.multi_agent,
            list(INFERENCE_MODES),
            self.instance_id,
            self.limits,
            map_agents=self.mapper is not None,
        ).to_wire()

    # -- batched inference -----------------------------------------------------------------

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
                self.batcher.flush_slot(slot, slot.policy)

    def expire_idle(self, idle_timeout: float) -> list[EpisodeSummary]:
        """Close idle episodes and count them."""
        summaries = self.episodes.expire_idle(idle_timeout)
        for summary in summaries:
            self.stats.record_episode(summary, tell=False)
        if summaries:
            self.stats.tell_timed_out()  # one line that counts this sweep's episodes too
        self.stats.episodes_active = len(self.episodes)
        return summaries


def _slot(
    policy_id: str, obs: gym.Space[Any], act: gym.Space[Any], limits: Limits, frame_stack: int
) -> PolicySlot:
    """A policy's slot; with ``frame_stack`` > 1 local clients report fragments of stacks."""
    frames = FrameRule.of(obs, frame_stack)
    stacked = obs if frames is None else frames.space
    return PolicySlot(
        policy_id,
        obs,
        act,
        FragmentChecker(stacked, act, policy_id, limits),
        legal_moves=LegalMoves.of(obs, act),
        frames=frames,
    )
