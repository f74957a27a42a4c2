"""The records of the episode calls, their wire encoders, and the defaults they share.

``start_episode``, ``get_action``, ``log_action``, ``log_returns`` and ``end_episode``; their
fields are documented once, here and in ``docs/protocol.md``. Each record's ``to_wire`` writes
the map a client sends (``parse_request`` of it gives the record back); the single-episode
``get_action`` of a client's every step is written by :func:`get_action_wire`, which skips the
record. ``id`` goes last: a connection numbers the request by setting it in place.

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


def _ending(
    wire: dict[str, Any],
    request_id: int,
    seq: int | None,
    reward: float | None = None,
    info: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``wire`` with the optional fields of a single-episode call, and the id, added."""
    if seq is not None:
        wire["seq"] = seq
    if reward is not None:
        wire["reward"] = reward
    if info is not None:
        wire["info"] = info
    wire["id"] = request_id
    return wire


def _agents_ending(
    wire: dict[str, Any],
    request_id: int,
    rewards: Any,
    infos: list[dict[str, Any] | None] | None,
    policy_ids: list[str | None] | None = None,
) -> dict[str, Any]:
    """``wire`` with the optional per-agent fields of a multi-agent call, and the id, added."""
    if rewards is not None:
        wire["rewards"] = rewards
    if infos is not None:
        wire["infos"] = infos
    if policy_ids is not None:
        wire["policy_ids"] = policy_ids
    wire["id"] = request_id
    return wire


def get_action_wire(
    request_id: int,
    episode_id: str,
    observation: Any,
    seq: int | None = None,
    reward: float | None = None,
    info: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``get_action`` of one episode: what :meth:`GetAction.to_wire` writes for it."""
    # _ending's work, written out: this runs on every step of a remote client.
    wire = {"type": "get_action", "episode_id": episode_id, "observation": observation}
    if seq is not None:
        wire["seq"] = seq
    if reward is not None:
        wire["reward"] = reward
    if info is not None:
        wire["info"] = info
    wire["id"] = request_id
    return wire


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

    def to_wire(self) -> dict[str, Any]:
        """The request as a map for the codec (the default policy is not named)."""
        wire: dict[str, Any] = {"type": "start_episode"}
        if self.episode_id is not None:
            wire["episode_id"] = self.episode_id
        wire["training_enabled"] = self.training_enabled
        if self.policy_id != DEFAULT_POLICY_ID:
            wire["policy_id"] = self.policy_id
        wire["id"] = self.id
        return wire


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

    def to_wire(self) -> dict[str, Any]:
        """The request as a map for the codec, in the form it was parsed from."""
        seq = None if self.seqs is None else self.seqs[0]
        if self.agent_ids is not None:
            wire = {
                "type": "get_action",
                "episode_id": self.episode_ids[0],
                "agent_ids": self.agent_ids,
                "observations": self.observations,
            }
            if seq is not None:
                wire["seq"] = seq
            return _agents_ending(wire, self.id, self.rewards, self.infos, self.policy_ids)
        if not self.batched:
            return get_action_wire(
                self.id,
                self.episode_ids[0],
                self.observations[0],
                seq,
                None if self.rewards is None else self.rewards[0],
                None if self.infos is None else self.infos[0],
            )
        wire = {
            "type": "get_action",
            "episode_ids": self.episode_ids,
            "observations": self.observations,
        }
        if self.rewards is not None:
            wire["rewards"] = self.rewards
        if self.seqs is not None:
            wire["seqs"] = self.seqs
        if self.infos is not None:
            wire["infos"] = self.infos
        wire["id"] = self.id
        return wire


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

    def to_wire(self) -> dict[str, Any]:
        """The request as a map for the codec, in the form it was parsed from."""
        if self.agent_ids is None:
            wire = {
                "type": "log_action",
                "episode_id": self.episode_id,
                "observation": self.observation,
                "action": self.action,
            }
            return _ending(wire, self.id, self.seq, self.reward, self.info)
        wire = {
            "type": "log_action",
            "episode_id": self.episode_id,
            "agent_ids": self.agent_ids,
            "observations": self.observation,
        }
        if self.seq is not None:
            wire["seq"] = self.seq
        wire["actions"] = self.action
        return _agents_ending(wire, self.id, self.rewards, self.infos, self.policy_ids)


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

    def to_wire(self) -> dict[str, Any]:
        """The request as a map for the codec, in the form it was parsed from.

        The multi-agent ``rewards`` travel as a list of numbers.
        """
        if self.agent_ids is None:
            wire = {"type": "log_returns", "episode_id": self.episode_id, "reward": self.reward}
            return _ending(wire, self.id, self.seq, info=self.info)
        wire = {
            "type": "log_returns",
            "episode_id": self.episode_id,
            "agent_ids": self.agent_ids,
            "rewards": [] if self.rewards is None else self.rewards.tolist(),
        }
        if self.seq is not None:
            wire["seq"] = self.seq
        if self.infos is not None:
            wire["infos"] = self.infos
        done = self.done or {}
        terminated = [agent_id for agent_id, ended in done.items() if ended]
        truncated = [agent_id for agent_id, ended in done.items() if not ended]
        if terminated:
            wire["terminated_agents"] = terminated
        if truncated:
            wire["truncated_agents"] = truncated
        wire["id"] = self.id
        return wire


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

    def to_wire(self) -> dict[str, Any]:
        """The request as a map for the codec, in the form it was parsed from.

        The multi-agent form sends ``observations`` only when it names agents.
        """
        if self.agent_ids is None:
            wire = {
                "type": "end_episode",
                "episode_id": self.episode_id,
                "observation": self.observation,
                "truncated": self.truncated,
            }
            return _ending(wire, self.id, self.seq, self.reward, self.info)
        wire = {
            "type": "end_episode",
            "episode_id": self.episode_id,
            "agent_ids": self.agent_ids,
            "truncated": self.truncated,
        }
        if self.seq is not None:
            wire["seq"] = self.seq
        if not self.agent_ids:
            wire["id"] = self.id
            return wire
        wire["observations"] = self.observation
        return _agents_ending(wire, self.id, self.rewards, self.infos)
