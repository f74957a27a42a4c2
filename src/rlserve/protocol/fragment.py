"""The experience format every learner consumes: trajectory fragments.

A :class:`Fragment` is a consecutive piece of one agent's episode. It is the only thing that
crosses from experience sources (the network server today; hosted environments and local-mode
clients later) to a learner, so it carries what any algorithm needs: observations including the
one after the last action (for bootstrapping or as the next state), the action actually taken,
whether the policy chose it, the behaviour log-probability when known, and the weights version
that acted. It needs numpy only.

A fragment has two wire forms: the whole record (:meth:`Fragment.to_wire`, between a server and
its learner processes and in the experience log), and the *report form* a local-inference client
sends in ``report_samples`` (:func:`report_wire`): without ``agent_id`` and ``policy_id``, which
the report names once. :func:`read_report` reads a report form back, checking what needs no
space: the id, that the fields are there and numeric, and that they agree on the step count. The
server then checks the values against the policy's spaces.

A fragment of a policy with memory (``use_lstm``) also carries ``state_in``, the acting policy's
recurrent state before its first step (:mod:`rlserve.policy.memory`): a learner replays the
fragment's observations from it, so a fragment cut mid-episode needs no earlier steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rlserve.errors import DecodeError, LimitExceededError, SpaceError
from rlserve.protocol.info import check_info_size
from rlserve.protocol.limits import Limits


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
        state_in: ``[S]`` float32, the acting policy's recurrent state before step 0 (the
            ``state`` that step's ``compute_actions`` received: zeros at an episode's start),
            for a policy with memory; None (absent on the wire) without.
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
    state_in: np.ndarray | None = None

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
        if self.state_in is not None:
            wire["state_in"] = self.state_in
        return wire

    @classmethod
    def from_wire(cls, raw: dict[str, Any]) -> Fragment:
        """Rebuild a fragment from :meth:`to_wire` output, checking that the lengths agree.

        Raises:
            DecodeError: A field is missing, the arrays disagree on ``T``, or ``state_in`` is
                not a 1-D array of finite numbers.
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
                state_in=None if raw.get("state_in") is None else _state_in(raw["state_in"]),
            )
        except KeyError as exc:
            raise DecodeError(f"fragment is missing the field {exc}") from exc
        except SpaceError as exc:
            raise DecodeError(f"fragment {exc}") from exc
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


def report_wire(fragment: Fragment) -> dict[str, Any]:
    """A fragment in the report form of ``report_samples`` (no ``agent_id``, ``policy_id``)."""
    wire = fragment.to_wire()
    del wire["agent_id"], wire["policy_id"]
    return wire


@dataclass(slots=True)
class ReportedFragment:
    """A fragment's report form as read by :func:`read_report`, its values not yet checked.

    Attributes:
        episode_id: The episode.
        steps: ``T``, the number of rewards; every per-step field has ``T`` entries.
        obs: The observations as sent (numbers; their shape is the space's business).
        actions: The actions as sent (numbers).
        rewards: ``[T]`` rewards as sent.
        behaviour_logp: ``[T]`` log-probabilities as sent.
        policy_chosen: ``[T]`` bool.
        weights_version: ``[T]`` integers as sent.
        terminated: The episode ended after the last step.
        truncated: The episode was cut short after the last step (never both).
        infos: ``[T]`` info maps or nils, or None.
        state_in: ``[S]`` float32 finite recurrent state before the first step, or None; its
            length is the policy's business (``state_size``).
    """

    episode_id: str
    steps: int
    obs: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    behaviour_logp: np.ndarray
    policy_chosen: np.ndarray
    weights_version: np.ndarray
    terminated: bool
    truncated: bool
    infos: list[dict[str, Any] | None] | None
    state_in: np.ndarray | None = None


def _state_in(raw: Any, where: str = "") -> np.ndarray:
    """A wire ``state_in`` as a float32 array, checked 1-D, numeric and finite.

    Raises:
        SpaceError: It is not, naming the fix.
    """
    try:
        array = np.asarray(raw)
    except (TypeError, ValueError) as exc:
        raise SpaceError(f"{where}'state_in' is not an array: {exc}") from exc
    if array.dtype == object or array.dtype.kind not in "biuf" or array.ndim != 1:
        raise SpaceError(
            f"{where}'state_in' must be a 1-D array of numbers (the recurrent state before the "
            f"fragment's first step), got {array.dtype} of shape {list(array.shape)}"
        )
    state = array.astype(np.float32)
    if not np.isfinite(state).all():
        raise SpaceError(
            f"{where}'state_in' holds a value that is not finite; send the state the policy "
            "returned (zeros at an episode's start)"
        )
    return state


def _array(raw: dict[str, Any], name: str, where: str) -> np.ndarray:
    if name not in raw:
        raise SpaceError(f"{where}: missing '{name}'")
    try:
        array = np.asarray(raw[name])
    except (TypeError, ValueError) as exc:
        raise SpaceError(f"{where}: '{name}' is not an array: {exc}") from exc
    if array.dtype == object or array.dtype.kind not in "biuf":
        raise SpaceError(f"{where}: '{name}' must hold numbers, got {array.dtype}")
    return array


def read_report(raw: dict[str, Any], limits: Limits, where: str) -> ReportedFragment:
    """Read one fragment map of a ``report_samples`` (:func:`report_wire`'s form).

    Args:
        raw: The decoded fragment map.
        limits: Bounds on the id's length and each info map's size.
        where: The fragment, for messages (``report_samples 'b1'.fragments[0]``).

    Raises:
        SpaceError: A field is missing, not numeric, or of the wrong length or type.
        LimitExceededError: The episode id or an info map over its limit.
    """
    episode_id = raw.get("episode_id")
    if not isinstance(episode_id, str) or not episode_id:
        raise SpaceError(f"{where}: 'episode_id' must be a non-empty string")
    if len(episode_id) > limits.max_id_length:
        raise LimitExceededError(
            f"{where}: 'episode_id' has {len(episode_id)} characters; the limit is "
            f"{limits.max_id_length}"
        )
    rewards = _array(raw, "rewards", where)
    steps = rewards.shape[0] if rewards.ndim == 1 else -1
    if steps < 1:
        raise SpaceError(f"{where}: 'rewards' must be a non-empty 1-D array")
    obs = _array(raw, "obs", where)
    actions = _array(raw, "actions", where)
    chosen = _array(raw, "policy_chosen", where)
    if chosen.shape != (steps,):
        raise SpaceError(f"{where}: 'policy_chosen' must have shape ({steps},)")
    logp = _array(raw, "behaviour_logp", where)
    if logp.shape != (steps,):
        raise SpaceError(
            f"{where}: 'behaviour_logp' must have shape ({steps},) and be finite where the "
            "policy chose the action (NaN marks a logged action)"
        )
    versions = _array(raw, "weights_version", where)
    if versions.shape != (steps,) or versions.dtype.kind not in "iu":
        raise SpaceError(f"{where}: 'weights_version' must be ({steps},) integers")
    terminated, truncated = raw.get("terminated"), raw.get("truncated")
    if not isinstance(terminated, bool) or not isinstance(truncated, bool):
        raise SpaceError(f"{where}: 'terminated' and 'truncated' must be true or false")
    if terminated and truncated:
        raise SpaceError(f"{where}: a fragment cannot be both terminated and truncated")
    return ReportedFragment(
        episode_id,
        steps,
        obs,
        actions,
        rewards,
        logp,
        chosen.astype(bool, copy=False),
        versions,
        terminated,
        truncated,
        _read_infos(raw.get("infos"), steps, limits, where),
        None if raw.get("state_in") is None else _state_in(raw["state_in"], f"{where}: "),
    )


def _read_infos(
    infos: Any, steps: int, limits: Limits, where: str
) -> list[dict[str, Any] | None] | None:
    if infos is None:
        return None
    if not isinstance(infos, list) or len(infos) != steps:
        raise SpaceError(f"{where}: 'infos' must be a list of {steps} maps or nils, one per step")
    for i, info in enumerate(infos):
        if info is None:
            continue
        if not isinstance(info, dict):
            raise SpaceError(f"{where}: 'infos'[{i}] must be a map or nil")
        if info:
            check_info_size(info, limits.max_info_bytes, f"{where}.infos[{i}]")
    return infos
