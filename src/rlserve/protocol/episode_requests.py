"""The records of the episode calls, and the defaults they share.

``start_episode``, ``get_action``, ``log_action``, ``log_returns`` and ``end_episode``; their
fields are documented once, here and in ``docs/protocol.md``.

Values that are checked against a Gymnasium space (observations, actions) stay undecoded here
(an array, a list or a map): the protocol layer knows nothing about spaces.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

DEFAULT_POLICY_ID = "default"
"""The policy an episode uses unless it names another."""

MAX_SEQ = 2**53
"""Largest episode call sequence number (``seq``): exact in JSON numbers too."""


@dataclass(slots=True)
class StartEpisode:
    """Begin an episode (``type: start_episode``).

    Attributes:
        id: Request id.
        episode_id: The episode's id, or None for the server to assign one.
        training_enabled: False serves actions but keeps the episode out of training.
        policy_id: The policy that acts in this episode.
    """

    id: int
    episode_id: str | None = None
    training_enabled: bool = True
    policy_id: str = DEFAULT_POLICY_ID


@dataclass(slots=True)
class GetAction:
    """Record observations and ask for on-policy actions (``type: get_action``).

    One episode (``episode_id`` + ``observation``) or several at once (``episode_ids`` +
    ``observations``, stacked along the first axis). ``reward`` / ``rewards`` is the reward
    accumulated since each episode's previous action; it is added to anything sent with
    ``log_returns`` and lets a client report a step's reward and ask for the next action in one
    round trip.

    Attributes:
        id: Request id.
        episode_ids: The episodes, in order.
        observations: One observation per episode (stacked array, list, or list of maps).
        rewards: Reward per episode for its previous action, or None (multi-agent form: one
            float64 array of each agent's reward).
        batched: Whether the request used the plural form (the reply mirrors it).
        seqs: Each episode's call sequence number (``seq`` / ``seqs``), or None.
        infos: Each episode's ``info`` map for its previous action (``info`` / ``infos``,
            None where there is none), or None.
    """

    id: int
    episode_ids: list[str]
    observations: Any
    rewards: list[float] | np.ndarray | None = None
    batched: bool = False
    seqs: list[int] | None = None
    infos: list[dict[str, Any] | None] | None = None
    agent_ids: list[str] | None = None
    """Multi-agent form: the agents of the one episode that act (``observations``, ``rewards``
    and ``infos`` then hold one entry per agent)."""
    policy_ids: list[str | None] | None = None
    """Multi-agent form: each agent's policy named explicitly (None: by the mapping)."""


@dataclass(slots=True)
class LogAction:
    """Record an observation and an action taken by someone else (``type: log_action``).

    Attributes:
        id: Request id.
        episode_id: The episode.
        observation: The observation the action was taken in.
        action: The action taken; this is what is trained on.
        reward: Reward for the previous action, as in ``GetAction``.
        seq: The episode's call sequence number, or None.
        info: Info map for the previous action, as in ``GetAction``, or None.
        agent_ids: Multi-agent form: the agents; ``observation`` and ``action`` then hold one
            entry per agent (``observations`` / ``actions`` on the wire), ``rewards`` and
            ``infos`` too.
        rewards: Multi-agent form: each agent's reward for its previous action (float64).
        infos: Multi-agent form: each agent's info for its previous action.
        policy_ids: Multi-agent form: each agent's policy named explicitly (None: mapping).
    """

    id: int
    episode_id: str
    observation: Any
    action: Any
    reward: float | None = None
    seq: int | None = None
    info: dict[str, Any] | None = None
    agent_ids: list[str] | None = None
    rewards: np.ndarray | None = None
    infos: list[dict[str, Any] | None] | None = None
    policy_ids: list[str | None] | None = None


@dataclass(slots=True)
class LogReturns:
    """Add reward to the episode's previous action (``type: log_returns``).

    Attributes:
        id: Request id.
        episode_id: The episode.
        reward: The reward; rewards add up until the next action.
        info: Optional map of extra information, kept with the previous action's step.
        seq: The episode's call sequence number, or None.
        agent_ids: Multi-agent form: the agents rewarded (``rewards``, ``infos`` per agent).
        rewards: Multi-agent form: each agent's reward (float64).
        infos: Multi-agent form: each agent's info, or None.
        done: Multi-agent form: agents finished now, ``True`` when terminated and ``False``
            when truncated (``terminated_agents`` / ``truncated_agents`` on the wire).
    """

    id: int
    episode_id: str
    reward: float
    info: dict[str, Any] | None = None
    seq: int | None = None
    agent_ids: list[str] | None = None
    rewards: np.ndarray | None = None
    infos: list[dict[str, Any] | None] | None = None
    done: dict[str, bool] | None = None


@dataclass(slots=True)
class EndEpisode:
    """Finish an episode (``type: end_episode``).

    Attributes:
        id: Request id.
        episode_id: The episode.
        observation: The final observation.
        truncated: True when the episode was cut short (a time limit), so the learner bootstraps
            from the final observation; False for a true terminal state.
        reward: Reward for the last action, as in ``GetAction``.
        seq: The episode's call sequence number, or None.
        info: Info map for the last action, as in ``GetAction``, or None.
        agent_ids: Multi-agent form: agents with a final observation (``observation`` then
            holds one per agent); every other agent still in the episode ends without one.
        rewards: Multi-agent form: each named agent's reward for its last action (float64).
        infos: Multi-agent form: each named agent's info for its last action.
    """

    id: int
    episode_id: str
    observation: Any
    truncated: bool = False
    reward: float | None = None
    seq: int | None = None
    info: dict[str, Any] | None = None
    agent_ids: list[str] | None = None
    rewards: np.ndarray | None = None
    infos: list[dict[str, Any] | None] | None = None
