"""What the episode table keeps: an episode's record, its status and summary, and its two modes.

An :class:`Episode` is single-agent (its steps in one :class:`AgentTrajectory`) until its first
call that names agents makes it multi-agent (its agents in
:class:`~rlserve.experience.agent_columns.EpisodeAgents`). Each mode's bookkeeping is an
:class:`EpisodeMode` (:mod:`rlserve.experience.single_agent_steps`,
:mod:`rlserve.experience.multi_agent_steps`); the table asks the episode's mode for what both
modes do differently at the end of an episode.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlserve.errors import DecodeError, SpaceError
from rlserve.experience.agent_columns import EpisodeAgents
from rlserve.protocol.fragment import Fragment
from rlserve.protocol.info import merged_info
from rlserve.protocol.values import MAX_ABS_REWARD

SINGLE_AGENT = "agent0"
"""The agent id of a single-agent episode."""


class EpisodeStatus(enum.Enum):
    """Lifecycle of an episode: ACTIVE -> (AWAITING_ACTION <-> ACTIVE) -> ENDED."""

    ACTIVE = "active"
    AWAITING_ACTION = "awaiting_action"
    ENDED = "ended"


@dataclass(slots=True)
class EpisodeSummary:
    """What an episode leaves behind for the metrics once it ends."""

    episode_id: str
    episode_return: float
    length: int
    training_enabled: bool
    reason: str  # "terminated", "truncated" or "idle_timeout"
    policy_returns: dict[str, float] | None = None
    """Multi-agent episodes: the return of each policy (summed over the agents it acted for);
    None for a single-agent episode (its one policy's return is ``episode_return``)."""
    policy_id: str = "default"
    """The policy of a single-agent episode."""
    source: str = field(default="", compare=False)
    """Who ran it, for callbacks: ``env-<i>`` (copy ``i`` of a hosted environment),
    ``env-runner-<r>`` (env-runner process ``r``), or a network client's source name
    (``client-<hash>``, ``session-<n>``); empty where it is not known (a hosted multi-agent
    env's episode, an episode the server closed for silence). Summaries compare without it:
    it is not part of the episode."""


def summary_to_wire(summary: EpisodeSummary, with_policy: bool = False) -> dict[str, Any]:
    """An episode summary in its one wire form (``report_samples``' ``episodes``, protocol §7.10).

    ``episode_id``, ``return``, ``length``, ``reason``, ``policy_returns`` for a multi-agent
    episode, and ``training_enabled: false`` for an episode whose steps are not reported (so
    that the server still counts them as env steps). ``with_policy`` adds ``policy_id`` (a
    report names its policy once for all its summaries; an env-runner's round does not).
    """
    wire: dict[str, Any] = {
        "episode_id": summary.episode_id,
        "return": summary.episode_return,
        "length": summary.length,
        "reason": summary.reason,
    }
    if summary.policy_returns is not None:
        wire["policy_returns"] = summary.policy_returns
    if not summary.training_enabled:
        wire["training_enabled"] = False
    if with_policy:
        wire["policy_id"] = summary.policy_id
    return wire


def summary_from_wire(raw: dict[str, Any], policy_id: str = "default") -> EpisodeSummary:
    """Rebuild an episode's summary from :func:`summary_to_wire` output of our own.

    ``policy_id``: its policy when ``raw`` names none. (A client's report is checked first:
    :func:`rlserve.server.reports.check_summaries`.)

    Raises:
        DecodeError: A field is missing.
    """
    try:
        returns = raw.get("policy_returns")
        return EpisodeSummary(
            episode_id=str(raw["episode_id"]),
            episode_return=float(raw["return"]),
            length=int(raw["length"]),
            training_enabled=raw.get("training_enabled") is not False,
            reason=str(raw.get("reason") or "terminated"),
            policy_returns=None
            if returns is None
            else {str(k): float(v) for k, v in returns.items()},
            policy_id=str(raw.get("policy_id", policy_id)),
        )
    except KeyError as exc:
        raise DecodeError(f"episode summary is missing the field {exc}") from exc


@dataclass(slots=True)
class AgentTrajectory:
    """The unfinished fragment of a single-agent episode: lists grow per step, emptied on each cut.

    (The agents of a multi-agent episode are stored column by column instead:
    :class:`rlserve.experience.agent_columns.EpisodeAgents`.)
    """

    obs: list[np.ndarray] = field(default_factory=list)
    actions: list[Any] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    logp: list[float] = field(default_factory=list)
    chosen: list[bool] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    pending_reward: float = 0.0
    infos: dict[int, dict[str, Any]] = field(default_factory=dict)
    """Step index (within the fragment) -> the info logged for it; only steps that have one."""
    pending_info: dict[str, Any] | None = None
    state_in: np.ndarray | None = None
    """A policy with memory: the recurrent state this fragment's first step read (its
    ``state_in``, :mod:`rlserve.experience.recurrent_states`); None without memory."""


@dataclass(slots=True)
class Episode:
    """One episode's state."""

    episode_id: str
    policy_id: str
    owner: str
    training_enabled: bool
    last_seen: float
    status: EpisodeStatus = EpisodeStatus.ACTIVE
    episode_return: float = 0.0
    length: int = 0
    agent: AgentTrajectory = field(default_factory=AgentTrajectory)
    seq: int = 0
    """Sequence number of the last call applied (0: none, or calls without ``seq``)."""
    seq_call: str = ""
    """The kind of that call (``get_action``, ``log_action``, ``log_returns``)."""
    answer: Any = None
    """What that call answered (the action of a ``get_action``), for a retry of it."""
    agents: EpisodeAgents | None = None
    """The agents of a multi-agent episode (None: a single-agent episode, see ``agent``).
    An episode becomes multi-agent with its first call that names agents."""
    mapped: dict[str, str] | None = None
    """Agent id -> policy id of the agents a mapping function assigned in this episode (it is
    asked once per agent per episode: :func:`~rlserve.experience.agent_groups.assigned`)."""
    state: np.ndarray | None = None
    """A single-agent episode of a policy with memory: ``[S]`` float32, the recurrent state its
    next step reads (None: zeros, no step yet; :mod:`rlserve.experience.recurrent_states`)."""
    frames: np.ndarray | None = None
    """A single-agent episode of a policy with ``frame_stack`` N > 1: ``[N*D]`` float32, its last
    N flattened frames, oldest first (None: no observation yet;
    :mod:`rlserve.experience.frame_stacks`)."""
    agent_frames: dict[str, np.ndarray] | None = None
    """A multi-agent episode with agents of a policy that stacks frames: each such agent's
    frames as ``frames`` holds a single-agent episode's, by agent id (None: none yet)."""


class EpisodeMode(ABC):
    """The bookkeeping of one kind of episode (single- or multi-agent) for an episode table.

    Args:
        fragment_length: Actions per fragment before it is cut and handed on.
        on_fragment: Called with each finished fragment of a training episode.
        clock: Monotonic time source (seconds).
        max_info_bytes: Largest info map of one step once the infos logged for it are merged
            (``max_info_bytes``); None: not checked (an in-process runner's own infos).
    """

    def __init__(
        self,
        fragment_length: int,
        on_fragment: Callable[[Fragment], None],
        clock: Callable[[], float],
        max_info_bytes: int | None = None,
    ):
        self.fragment_length = fragment_length
        self._on_fragment = on_fragment
        self._clock = clock
        self.max_info_bytes = max_info_bytes

    def merged_info(
        self, kept: dict[str, Any] | None, info: dict[str, Any], where: str
    ) -> dict[str, Any]:
        """``info`` merged into the info ``kept`` for the same step so far (later keys win).

        Raises:
            LimitExceededError: The merged map is over ``max_info_bytes`` (the message starts
                with ``where``); see :func:`rlserve.protocol.info.merged_info`.
        """
        return merged_info(kept, info, self.max_info_bytes, where)

    @abstractmethod
    def hand_on_unfinished(self, episode: Episode) -> None:
        """Hand on the steps of an episode that stops without a final observation.

        No observation followed an agent's last action, so that one step cannot be used; the
        steps before it bootstrap from the observation the last action was taken in.
        """

    @abstractmethod
    def policy_returns(self, episode: Episode) -> dict[str, float] | None:
        """The return of each policy of an ending episode, for its :class:`EpisodeSummary`."""


def raise_reward(where: str, pending: float, reward: float) -> None:
    """Raise the error for a reward out of range (or taking the step's reward out of range).

    Raises:
        SpaceError: Always; the message starts with ``where`` and names the value.
    """
    total = pending + reward
    bound = f"-{MAX_ABS_REWARD:g}..{MAX_ABS_REWARD:g}"
    if total == reward or not -MAX_ABS_REWARD <= reward <= MAX_ABS_REWARD:
        raise SpaceError(
            f"{where}: reward {reward!r} is out of range; a reward must be a finite number "
            f"within {bound}"
        )
    raise SpaceError(
        f"{where}: reward {reward!r} makes the rewards logged since the last action add up "
        f"to {total!r}; a step's reward must be within {bound}"
    )
