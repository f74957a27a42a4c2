"""Batched inference: per-policy slots, the ``get_action`` calls waiting in them, and the flush.

Each policy served has a :class:`PolicySlot`: its spaces, its current numpy weights, and the
``get_action`` calls waiting for them. A single-agent call waits whole (:class:`Pending`); a
multi-agent call waits as one :class:`AgentPart` per policy its agents map to, and is answered
when the last part has its actions (:class:`AgentsPending`). :class:`Batcher` answers everything
waiting in a slot with one forward pass: the single-agent calls' rows first, then the parts'.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from rlserve.errors import EpisodeError
from rlserve.experience.agent_columns import AgentTick
from rlserve.experience.episode_records import Episode
from rlserve.experience.episodes import EpisodeTable
from rlserve.experience.frame_stacks import FrameRule
from rlserve.experience.recurrent_states import advance, advance_rows, read_rows, read_states
from rlserve.policy import NumpyPolicy
from rlserve.policy.acting import compute_actions, greedy_in_evaluation
from rlserve.policy.action_mask import LegalMoves
from rlserve.policy.distributions import actions_to_space
from rlserve.policy.numpy_policy import PolicyOutput
from rlserve.policy.weights import WeightsPackage
from rlserve.protocol.messages import GetAction, GetWeights, ReportSamples
from rlserve.protocol.replies import action_reply, actions_reply
from rlserve.server.replies import Respond, answer_internal_error
from rlserve.server.reports import FragmentChecker
from rlserve.server.sessions import Session
from rlserve.server.stats import ServerStats


@dataclass(slots=True)
class PolicySlot:
    """A policy's spaces and its current numpy weights (None until the learner publishes)."""

    policy_id: str
    observation_space: gym.Space[Any]
    action_space: gym.Space[Any]
    fragment_checker: FragmentChecker
    policy: NumpyPolicy | None = None
    package: WeightsPackage | None = None
    pending: list[Pending] = field(default_factory=list)
    parts: list[AgentPart] = field(default_factory=list)
    """Groups of agents of multi-agent ``get_action`` calls waiting for this policy."""
    weight_waiters: list[tuple[GetWeights, Respond]] = field(default_factory=list)
    report_waiters: list[tuple[ReportSamples, Session, Respond]] = field(default_factory=list)
    legal_moves: LegalMoves | None = None
    """The policy's legal-move mask: observations with no legal move are refused per call."""
    frames: FrameRule | None = None
    """The policy's frame stacking (``frame_stack`` > 1): clients send single frames of
    ``observation_space``, its episodes record and act on stacks."""


@dataclass(slots=True)
class Pending:
    """A single-agent ``get_action`` waiting for its actions (one per episode it names)."""

    request: GetAction
    episodes: list[Episode]
    respond: Respond
    joined: list[tuple[GetAction, Respond]] = field(default_factory=list)
    """Retries of this request (same episodes and seqs) answered with the same actions."""


@dataclass(slots=True)
class AgentPart:
    """One policy's share of a pending multi-agent ``get_action``."""

    owner: AgentsPending
    slot: PolicySlot
    group: int
    """The group's index in the call's grouping."""
    idx: np.ndarray
    """Positions of this policy's agents in the call."""
    obs: np.ndarray
    """Their checked, flattened observations ``[k, D]``."""


@dataclass(slots=True)
class AgentsPending:
    """A multi-agent ``get_action`` waiting for the actions of every policy it involves."""

    request: GetAction
    episode: Episode
    tick: AgentTick
    respond: Respond
    remaining: int
    results: list[tuple[AgentPart, Any, np.ndarray, Any, int]] = field(default_factory=list)
    """Per part: (part, actions as trained, log-probabilities, actions as sent, version)."""
    joined: list[tuple[GetAction, Respond]] = field(default_factory=list)


def named_slot(slots: dict[str, PolicySlot], policy_id: str) -> PolicySlot:
    """The slot of a policy a request names.

    Raises:
        EpisodeError: This server does not serve that policy.
    """
    slot = slots.get(policy_id)
    if slot is None:
        raise EpisodeError(f"unknown policy '{policy_id}'; this server serves {sorted(slots)}")
    return slot


def _evaluation_rows(pending: list[Pending], parts: list[AgentPart]) -> np.ndarray:
    """Which rows of a slot's forward pass are of evaluation episodes.

    Episodes started with ``training_enabled=False``; in the order :meth:`Batcher.flush_slot`
    stacks the rows (pending single-agent calls, then agent parts).
    """
    rows = [not ep.training_enabled for item in pending for ep in item.episodes]
    for part in parts:
        rows += [not part.owner.episode.training_enabled] * len(part.idx)
    return np.asarray(rows, dtype=bool)


def _read_states(pending: list[Pending], parts: list[AgentPart], state_size: int) -> np.ndarray:
    """The recurrent state each row of a slot's forward pass reads, in the rows' order."""
    blocks = []
    if pending:
        blocks.append(read_states([ep for item in pending for ep in item.episodes], state_size))
    for part in parts:
        columns, rows = part.owner.tick.parts[part.group]
        blocks.append(read_rows(columns, rows, state_size))
    return blocks[0] if len(blocks) == 1 else np.concatenate(blocks)


def _advance_states(
    pending: list[Pending],
    parts: list[AgentPart],
    read: np.ndarray,
    next_states: Any,
    single_rows: int,
) -> None:
    """Write each row's next state back to its episode (the single-agent rows recorded)."""
    if pending:
        episodes = [ep for item in pending for ep in item.episodes]
        advance(episodes, read[:single_rows], next_states[:single_rows])
    offset = single_rows
    for part in parts:
        columns, rows = part.owner.tick.parts[part.group]
        advance_rows(columns, rows, next_states[offset : offset + len(rows)])
        offset += len(rows)


class Batcher:
    """Answers the ``get_action`` calls waiting in a slot with one forward pass.

    Args:
        episodes: Records each action taken in its episode.
        stats: Counts the actions and the batch size.
    """

    def __init__(self, episodes: EpisodeTable, stats: ServerStats):
        self.episodes = episodes
        self.stats = stats

    def flush_slot(self, slot: PolicySlot, policy: NumpyPolicy) -> None:
        """Compute the actions of everything waiting in ``slot`` with ``policy``; answer it."""
        pending, slot.pending = slot.pending, []
        parts, slot.parts = slot.parts, []
        blocks = [part.obs for part in parts]
        if pending:
            # np.array on the rows is one C call; np.stack is a dozen Python ones.
            blocks.insert(
                0, np.array([ep.agent.obs[-1] for item in pending for ep in item.episodes])
            )
        discrete = isinstance(slot.action_space, gym.spaces.Discrete)
        state = None
        try:
            obs = blocks[0] if len(blocks) == 1 else np.concatenate(blocks)
            if policy.state_size:
                state = _read_states(pending, parts, policy.state_size)
            if greedy_in_evaluation(policy):
                out = compute_actions(policy, obs, _evaluation_rows(pending, parts), state)
            elif state is None:
                out = policy.compute_actions(obs)
            else:
                out = policy.compute_actions(obs, True, state)
            env_actions = policy.to_env_actions(out.actions)
            if not discrete:
                # In the space's own form: [N, *shape] arrays, or a list of maps / tuples.
                env_actions = actions_to_space(slot.action_space, env_actions)
        except Exception as exc:  # a bug in inference must not leave its clients waiting
            self._fail(pending, parts, exc)
            return
        offset = 0
        if pending:
            offset = self._answer_pending(pending, out, env_actions, discrete, policy.version)
        if state is not None:
            # After the single-agent steps are recorded (each fragment's first keeps its state).
            _advance_states(pending, parts, state, out.state, offset)
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

    def _answer_pending(
        self,
        pending: list[Pending],
        out: PolicyOutput,
        env_actions: Any,
        discrete: bool,
        version: int,
    ) -> int:
        """Record and send the actions of the single-agent calls (the first rows); their count."""
        act = self.episodes.act
        # Plain Python numbers once for the whole batch, not a numpy scalar per row.
        logps = out.logp.tolist()
        actions = out.actions.tolist() if discrete else out.actions
        sent = env_actions.tolist() if discrete else env_actions
        offset = 0
        for item in pending:
            request = item.request
            keep = request.seqs is not None
            for episode in item.episodes:
                act(episode, actions[offset], logps[offset], True, version)
                if keep:
                    # Kept for a retry of this call; a copy, so the batch's array is not kept.
                    episode.answer = sent[offset] if discrete else copy.deepcopy(sent[offset])
                offset += 1
            if request.batched:
                start = offset - len(item.episodes)
                chunk = env_actions[start:offset]
                reply = actions_reply(request.id, chunk)
            else:
                reply = action_reply(request.id, sent[offset - 1])
            item.respond(reply)
            for joined, respond in item.joined:
                respond({**reply, "id": joined.id})
        return offset

    def _deliver_part(
        self, part: AgentPart, actions: Any, logp: np.ndarray, sent: Any, version: int
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
        reply = actions_reply(owner.request.id, reply_actions)
        owner.respond(reply)
        for joined, respond in owner.joined:
            respond({**reply, "id": joined.id})

    def _fail(self, pending: list[Pending], parts: list[AgentPart], exc: Exception) -> None:
        """Answer every request of a failed forward pass with an ``internal`` error."""
        owners = {id(part.owner): part.owner for part in parts}.values()
        answers: list[tuple[int | None, Respond]] = []
        items: list[Pending | AgentsPending] = [*pending, *owners]
        for item in items:
            answers += [(item.request.id, item.respond), *((j.id, r) for j, r in item.joined)]
        answer_internal_error(
            self.stats,
            exc,
            f"internal error computing actions: {exc!r} (a bug)",
            "compute this action",
            "end these episodes and start new ones",
            answers,
        )
