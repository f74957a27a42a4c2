"""The experience format every learner consumes: trajectory fragments.

A :class:`Fragment` is a consecutive piece of one agent's episode. It is the only thing that
crosses from experience sources (the network server today; hosted environments and local-mode
clients later) to a learner, so it carries what any algorithm needs: observations including the
one after the last action (for bootstrapping or as the next state), the action actually taken,
whether the policy chose it, the behaviour log-probability when known, and the weights version
that acted. It needs numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rlserve.errors import DecodeError


@dataclass(slots=True)
class Fragment:
    """``T`` consecutive steps of one agent in one episode.

    Attributes:
        episode_id: The episode the steps belong to.
        agent_id: The agent within the episode (single-agent episodes use ``"agent0"``).
        policy_id: The policy that was asked for actions.
        obs: ``[T + 1, D]`` float32 flattened observations; ``obs[T]`` follows the last action.
        actions: ``[T]`` int64 choice indices (Discrete) or ``[T, A]`` float32 (every other
            action space, in the flat layout of :mod:`rlserve.policy.distributions`).
        rewards: ``[T]`` float32 reward for each action.
        behaviour_logp: ``[T]`` float32 log-probability of each action under the acting policy;
            NaN where it is unknown (actions logged with ``log_action``).
        policy_chosen: ``[T]`` bool, True where the policy chose the action (``get_action``).
        weights_version: ``[T]`` int64 version of the weights that acted.
        terminated: The episode reached a terminal state after the last action.
        truncated: The episode was cut short (time limit) after the last action. When neither
            flag is set the episode goes on in a later fragment; bootstrap from ``obs[T]``.
        infos: ``[T]`` the ``info`` map logged with each step's reward (None for a step
            without one), or None when no step has one. Kept with the data for whoever
            consumes it; PPO does not read it.
    """

    episode_id: str
    agent_id: str
    policy_id: str
    obs: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    behaviour_logp: np.ndarray
    policy_chosen: np.ndarray
    weights_version: np.ndarray
    terminated: bool
    truncated: bool
    infos: list[dict[str, Any] | None] | None = None

    def __len__(self) -> int:
        return int(self.rewards.shape[0])

    def to_wire(self) -> dict[str, Any]:
        """Return the fragment as a map of plain values and arrays for the codec."""
        wire: dict[str, Any] = {
            "episode_id": self.episode_id,
            "agent_id": self.agent_id,
            "policy_id": self.policy_id,
            "obs": self.obs,
            "actions": self.actions,
            "rewards": self.rewards,
            "behaviour_logp": self.behaviour_logp,
            "policy_chosen": self.policy_chosen,
            "weights_version": self.weights_version,
            "terminated": self.terminated,
            "truncated": self.truncated,
        }
        if self.infos is not None:
            wire["infos"] = self.infos
        return wire

    @classmethod
    def from_wire(cls, raw: dict[str, Any]) -> Fragment:
        """Rebuild a fragment from :meth:`to_wire` output, checking that the lengths agree.

        Raises:
            DecodeError: A field is missing or the arrays disagree on ``T``.
        """
        try:
            fragment = cls(
                episode_id=str(raw["episode_id"]),
                agent_id=str(raw["agent_id"]),
                policy_id=str(raw["policy_id"]),
                obs=np.asarray(raw["obs"], dtype=np.float32),
                actions=np.asarray(raw["actions"]),
                rewards=np.asarray(raw["rewards"], dtype=np.float32),
                behaviour_logp=np.asarray(raw["behaviour_logp"], dtype=np.float32),
                policy_chosen=np.asarray(raw["policy_chosen"], dtype=bool),
                weights_version=np.asarray(raw["weights_version"], dtype=np.int64),
                terminated=bool(raw["terminated"]),
                truncated=bool(raw["truncated"]),
                infos=raw.get("infos"),
            )
        except KeyError as exc:
            raise DecodeError(f"fragment is missing the field {exc}") from exc
        steps = len(fragment)
        lengths = {
            "obs": fragment.obs.shape[0] - 1,
            "actions": fragment.actions.shape[0],
            "behaviour_logp": fragment.behaviour_logp.shape[0],
            "policy_chosen": fragment.policy_chosen.shape[0],
            "weights_version": fragment.weights_version.shape[0],
        }
        if fragment.infos is not None:
            if not isinstance(fragment.infos, list):
                raise DecodeError("fragment 'infos' must be a list with one entry per step")
            lengths["infos"] = len(fragment.infos)
        wrong = {k: v for k, v in lengths.items() if v != steps}
        if wrong or steps == 0:
            raise DecodeError(f"fragment of {steps} rewards has mismatched lengths {wrong}")
        return fragment
