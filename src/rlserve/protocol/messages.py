"""The typed messages of protocol version 1, and their validation.

Every message is a map with a ``type`` string. Requests carry an ``id`` (a non-negative integer
chosen by the client); the reply to a request carries the same ``id``, so a client may pipeline
requests on one connection. The fields of each message are documented once, here and in
``docs/protocol.md``; the two must agree.

Values that are checked against a Gymnasium space (observations, actions) stay undecoded here
(an array, a list or a map): the protocol layer knows nothing about spaces.

A field sent as nil (JSON ``null``) is the same as a field left out, for every field of every
request (C# and C++ serialisers write nil for unset members): :func:`parse_request` drops nil
fields before it reads any, so an optional one takes its default and a required one is reported
missing. The space-checked values are the exception: a nil ``observation`` or ``action`` is sent,
and then refused by the space check.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlserve.errors import DecodeError, LimitExceededError
from rlserve.protocol.info import check_info_size
from rlserve.protocol.limits import DEFAULT_LIMITS, Limits
from rlserve.protocol.values import MAX_ABS_REWARD, check_reward

DEFAULT_POLICY_ID = "default"
"""The policy an episode uses unless it names another."""

MAX_SEQ = 2**53
"""Largest episode call sequence number (``seq``): exact in JSON numbers too."""


@dataclass(slots=True)
class Hello:
    """First request on a binary connection (``type: hello``).

    Attributes:
        id: Request id.
        protocol_version: The protocol version the client speaks.
        client_name: A label for logs and metrics.
        token: The server's shared secret, when it has one.
        inference_mode: ``remote`` (the server computes actions) or ``local``.
        client_id: A secret random id the client keeps across reconnects: episodes belong to
            it. None: the connection is the identity.
    """

    id: int
    protocol_version: int
    client_name: str = "client"
    token: str | None = None
    inference_mode: str = "remote"
    client_id: str | None = None


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


@dataclass(slots=True)
class Ping:
    """Liveness check (``type: ping``); answered with ``pong``."""

    id: int


@dataclass(slots=True)
class GetWeights:
    """Fetch a policy's model and weights for local inference (``type: get_weights``).

    Attributes:
        id: Request id.
        policy_id: The policy.
        have_version: The version the client holds; when it is still current the reply carries
            no arrays (``unchanged: true``).
    """

    id: int
    policy_id: str = DEFAULT_POLICY_ID
    have_version: int | None = None


@dataclass(slots=True)
class ReportSamples:
    """Experience collected by a local-inference client (``type: report_samples``).

    Attributes:
        id: Request id.
        batch_id: Unique per batch; a batch re-sent after a lost reply is recognised by it and
            not trained on twice.
        policy_id: The policy that acted.
        fragments: Trajectory fragments (maps; checked by the server against the policy).
        episodes: Summaries of episodes that ended (``episode_id``, ``return``, ``length``),
            for the episode metrics.
    """

    id: int
    batch_id: str
    policy_id: str
    fragments: list[dict[str, Any]]
    episodes: list[dict[str, Any]]


Request = (
    Hello
    | StartEpisode
    | GetAction
    | LogAction
    | LogReturns
    | EndEpisode
    | Ping
    | GetWeights
    | ReportSamples
)
"""Any request a client may send."""

SPACE_VALUE_FIELDS = frozenset({"observation", "observations", "action", "actions"})
"""Fields whose value is checked against a space later: a nil there is a value, not absence."""

REQUEST_TYPES = (
    "hello",
    "start_episode",
    "get_action",
    "log_action",
    "log_returns",
    "end_episode",
    "ping",
    "get_weights",
    "report_samples",
)
"""The ``type`` values of requests, in the order ``docs/protocol.md`` lists them."""


@dataclass(slots=True)
class _Fields:
    """Typed accessors over a raw message map that raise a clear DecodeError."""

    raw: dict[str, Any]
    kind: str
    limits: Limits = field(default=DEFAULT_LIMITS)

    def _missing(self, name: str) -> DecodeError:
        return DecodeError(f"'{self.kind}' needs the field '{name}'")

    def _wrong(self, name: str, expected: str, value: Any) -> DecodeError:
        return DecodeError(
            f"'{self.kind}' field '{name}' must be {expected}, got {type(value).__name__}"
        )

    def int_(self, name: str, default: int | None = None) -> int:
        value = self.raw.get(name, default)
        if value is None:
            raise self._missing(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise self._wrong(name, "a non-negative integer", value)
        return value

    def bool_(self, name: str, default: bool) -> bool:
        value = self.raw.get(name, default)
        if not isinstance(value, bool):
            raise self._wrong(name, "true or false", value)
        return value

    def float_opt(self, name: str) -> float | None:
        value = self.raw.get(name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self._wrong(name, "a number", value)
        number = finite_number(value)
        if number is None:
            raise DecodeError(f"'{self.kind}' field '{name}' must be finite, got {value!r}")
        return check_reward(number, f"'{self.kind}' field '{name}'")

    def seq_opt(self, name: str) -> int | None:
        value = self.raw.get(name)
        return None if value is None else self.check_seq(name, value)

    def check_seq(self, name: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_SEQ:
            raise DecodeError(
                f"'{self.kind}' field '{name}' must be an integer from 1 to {MAX_SEQ} (the "
                f"episode's call number), got {value!r}"
            )
        return value

    def id_(self, name: str) -> str:
        value = self.raw.get(name)
        if value is None:
            raise self._missing(name)
        return self.check_id(name, value)

    def id_opt(self, name: str) -> str | None:
        value = self.raw.get(name)
        return None if value is None else self.check_id(name, value)

    def check_id(self, name: str, value: Any) -> str:
        if not isinstance(value, str):
            raise self._wrong(name, "a string", value)
        if not value or len(value) > self.limits.max_id_length:
            raise LimitExceededError(
                f"'{self.kind}' field '{name}' must have 1 to {self.limits.max_id_length} "
                f"characters, got {len(value)}"
            )
        return value

    def str_(self, name: str, default: str) -> str:
        value = self.raw.get(name, default)
        if not isinstance(value, str):
            raise self._wrong(name, "a string", value)
        if len(value) > self.limits.max_id_length:
            raise LimitExceededError(
                f"'{self.kind}' field '{name}' has {len(value)} characters; the limit is "
                f"{self.limits.max_id_length}"
            )
        return value

    def info_opt(self, name: str) -> dict[str, Any] | None:
        return self.check_info(name, self.raw.get(name))

    def check_info(self, name: str, value: Any) -> dict[str, Any] | None:
        if value is None:
            return None
        if not isinstance(value, dict):
            raise self._wrong(name, "a map", value)
        if value:
            check_info_size(value, self.limits.max_info_bytes, f"'{self.kind}' field '{name}'")
        return value

    def present(self, name: str) -> Any:
        if name not in self.raw:
            raise self._missing(name)
        return self.raw[name]


def parse_request(raw: dict[str, Any], limits: Limits = DEFAULT_LIMITS) -> Request:
    """Validate a decoded message map and build its typed request.

    Args:
        raw: The decoded map (from msgpack or JSON).
        limits: Bounds on ids and batch sizes.

    Returns:
        The typed request.

    Raises:
        DecodeError: Unknown type, missing or mistyped field.
        LimitExceededError: An id or batch over its limit.
    """
    raw = without_nil(raw)
    kind = raw.get("type")
    if not isinstance(kind, str):
        raise DecodeError(
            f"a message needs a string 'type'; known types: {', '.join(REQUEST_TYPES)}"
        )
    f = _Fields(raw, kind, limits)
    request_id = f.int_("id", 0)
    if "agent_ids" in raw and kind in _MULTI_AGENT_PARSERS:
        return _MULTI_AGENT_PARSERS[kind](f, request_id)
    if kind == "get_action":
        return _parse_get_action(f, request_id)
    if kind == "log_returns":
        info = f.info_opt("info")
        reward = f.float_opt("reward")
        if reward is None:
            raise f._missing("reward")
        return LogReturns(request_id, f.id_("episode_id"), reward, info, f.seq_opt("seq"))
    if kind == "log_action":
        return LogAction(
            request_id,
            f.id_("episode_id"),
            f.present("observation"),
            f.present("action"),
            f.float_opt("reward"),
            f.seq_opt("seq"),
            f.info_opt("info"),
        )
    if kind == "end_episode":
        return EndEpisode(
            request_id,
            f.id_("episode_id"),
            f.present("observation"),
            f.bool_("truncated", False),
            f.float_opt("reward"),
            f.seq_opt("seq"),
            f.info_opt("info"),
        )
    if kind == "start_episode":
        return StartEpisode(
            request_id,
            f.id_opt("episode_id"),
            f.bool_("training_enabled", True),
            f.id_opt("policy_id") or DEFAULT_POLICY_ID,
        )
    if kind == "ping":
        return Ping(request_id)
    if kind == "get_weights":
        have = raw.get("have_version")
        return GetWeights(
            request_id,
            f.id_opt("policy_id") or DEFAULT_POLICY_ID,
            None if have is None else f.int_("have_version"),
        )
    if kind == "report_samples":
        report = ReportSamples(
            request_id,
            f.id_("batch_id"),
            f.id_opt("policy_id") or DEFAULT_POLICY_ID,
            _map_list(f, "fragments", raw.get("fragments"), required=True),
            _map_list(f, "episodes", raw.get("episodes", []), required=False),
        )
        if not report.fragments and not report.episodes:
            raise DecodeError("'report_samples' needs at least one fragment or episode summary")
        return report
    if kind == "hello":
        token = raw.get("token")
        if token is not None and not isinstance(token, str):
            raise f._wrong("token", "a string", token)
        return Hello(
            request_id,
            f.int_("protocol_version"),
            f.str_("client_name", "client"),
            token,
            f.str_("inference_mode", "remote"),
            f.id_opt("client_id"),
        )
    raise DecodeError(f"unknown message type '{kind}'; known types: {', '.join(REQUEST_TYPES)}")


def without_nil(raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` without its nil fields (nil and absent mean the same), space values excepted.

    Returns ``raw`` itself when it holds no nil field, so the common case copies nothing.
    """
    if all(value is not None for value in raw.values()):
        return raw
    return {k: v for k, v in raw.items() if v is not None or k in SPACE_VALUE_FIELDS}


def _parse_get_action(f: _Fields, request_id: int) -> GetAction:
    raw = f.raw
    if "episode_ids" in raw:
        ids = raw["episode_ids"]
        if not isinstance(ids, list) or not ids:
            raise f._wrong("episode_ids", "a non-empty list of strings", ids)
        if len(ids) > f.limits.max_batch_episodes:
            raise LimitExceededError(
                f"get_action names {len(ids)} episodes; the limit is {f.limits.max_batch_episodes}"
            )
        episode_ids = [f.check_id("episode_ids", eid) for eid in ids]
        if len(set(episode_ids)) != len(episode_ids):
            raise DecodeError("get_action 'episode_ids' names an episode more than once")
        observations = f.present("observations")
        rewards = raw.get("rewards")
        reward_list: list[float] | None = None
        if rewards is not None:
            reward_list = _float_list(f, "rewards", rewards, len(episode_ids))
        seqs = raw.get("seqs")
        seq_list: list[int] | None = None
        if seqs is not None:
            if hasattr(seqs, "tolist"):
                seqs = seqs.tolist()
            if not isinstance(seqs, list) or len(seqs) != len(episode_ids):
                raise DecodeError(
                    f"get_action 'seqs' must be a list of {len(episode_ids)} integers, one per "
                    "episode of 'episode_ids'"
                )
            seq_list = [f.check_seq("seqs", seq) for seq in seqs]
        infos = raw.get("infos")
        info_list: list[dict[str, Any] | None] | None = None
        if infos is not None:
            if not isinstance(infos, list) or len(infos) != len(episode_ids):
                raise DecodeError(
                    f"get_action 'infos' must be a list of {len(episode_ids)} maps or nils, one "
                    "per episode of 'episode_ids'"
                )
            info_list = [f.check_info("infos", info) for info in infos]
        return GetAction(
            request_id,
            episode_ids,
            observations,
            reward_list,
            batched=True,
            seqs=seq_list,
            infos=info_list,
        )
    reward = f.float_opt("reward")
    seq = f.seq_opt("seq")
    info = f.info_opt("info")
    return GetAction(
        request_id,
        [f.id_("episode_id")],
        [f.present("observation")],
        None if reward is None else [reward],
        batched=False,
        seqs=None if seq is None else [seq],
        infos=None if info is None else [info],
    )


def _agent_ids(f: _Fields, name: str = "agent_ids", allow_empty: bool = False) -> list[str]:
    ids = f.raw.get(name)
    if ids is None:
        if allow_empty:
            return []
        raise f._missing(name)
    if not isinstance(ids, list) or (not ids and not allow_empty):
        raise f._wrong(name, "a non-empty list of strings", ids)
    if len(ids) > f.limits.max_agents_per_call:
        raise LimitExceededError(
            f"'{f.kind}' names {len(ids)} agents in '{name}'; the limit is "
            f"{f.limits.max_agents_per_call} (max_agents_per_call)"
        )
    if (
        ids
        and set(map(type, ids)) == _STR_ONLY
        and min(map(len, ids)) >= 1
        and max(map(len, ids)) <= f.limits.max_id_length
    ):
        agent_ids: list[str] = ids  # every id is a string of an allowed length
    else:
        agent_ids = [f.check_id(name, agent_id) for agent_id in ids]
    if len(set(agent_ids)) != len(agent_ids):
        raise DecodeError(f"'{f.kind}' '{name}' names an agent more than once")
    return agent_ids


def _per_agent_rewards(f: _Fields, count: int) -> np.ndarray | None:
    rewards = f.raw.get("rewards")
    if rewards is None:
        return None
    numbers = _checked_numbers(rewards, count)
    if numbers is None:
        numbers = np.asarray(_float_list(f, "rewards", rewards, count), dtype=np.float64)
    return numbers


def _per_agent_infos(f: _Fields, count: int) -> list[dict[str, Any] | None] | None:
    infos = f.raw.get("infos")
    if infos is None:
        return None
    if not isinstance(infos, list) or len(infos) != count:
        raise DecodeError(
            f"'{f.kind}' 'infos' must be a list of {count} maps or nils, one per agent of "
            "'agent_ids'"
        )
    return [f.check_info("infos", info) for info in infos]


def _per_agent_policies(f: _Fields, count: int) -> list[str | None] | None:
    policies = f.raw.get("policy_ids")
    if policies is None:
        return None
    if not isinstance(policies, list) or len(policies) != count:
        raise DecodeError(
            f"'{f.kind}' 'policy_ids' must be a list of {count} policy ids or nils, one per "
            "agent of 'agent_ids'"
        )
    return [None if p is None else f.check_id("policy_ids", p) for p in policies]


def _parse_multi_get_action(f: _Fields, request_id: int) -> GetAction:
    agent_ids = _agent_ids(f)
    seq = f.seq_opt("seq")
    return GetAction(
        request_id,
        [f.id_("episode_id")],
        f.present("observations"),
        _per_agent_rewards(f, len(agent_ids)),
        batched=False,
        seqs=None if seq is None else [seq],
        infos=_per_agent_infos(f, len(agent_ids)),
        agent_ids=agent_ids,
        policy_ids=_per_agent_policies(f, len(agent_ids)),
    )


def _parse_multi_log_action(f: _Fields, request_id: int) -> LogAction:
    agent_ids = _agent_ids(f)
    return LogAction(
        request_id,
        f.id_("episode_id"),
        f.present("observations"),
        f.present("actions"),
        seq=f.seq_opt("seq"),
        agent_ids=agent_ids,
        rewards=_per_agent_rewards(f, len(agent_ids)),
        infos=_per_agent_infos(f, len(agent_ids)),
        policy_ids=_per_agent_policies(f, len(agent_ids)),
    )


def _parse_multi_log_returns(f: _Fields, request_id: int) -> LogReturns:
    agent_ids = _agent_ids(f, allow_empty=True)
    rewards = _per_agent_rewards(f, len(agent_ids))
    if rewards is None:
        if agent_ids:
            raise f._missing("rewards")
        rewards = np.zeros(0)
    done: dict[str, bool] = {}
    for name, terminated in (("terminated_agents", True), ("truncated_agents", False)):
        for agent_id in _agent_ids(f, name, allow_empty=True):
            if agent_id in done:
                raise DecodeError(
                    f"'log_returns' marks agent '{agent_id}' both terminated and truncated"
                )
            done[agent_id] = terminated
    if not agent_ids and not done:
        raise DecodeError(
            "'log_returns' with 'agent_ids' needs at least one agent: a reward, or one in "
            "'terminated_agents' / 'truncated_agents'"
        )
    return LogReturns(
        request_id,
        f.id_("episode_id"),
        0.0,
        seq=f.seq_opt("seq"),
        agent_ids=agent_ids,
        rewards=rewards,
        infos=_per_agent_infos(f, len(agent_ids)),
        done=done,
    )


def _parse_multi_end_episode(f: _Fields, request_id: int) -> EndEpisode:
    agent_ids = _agent_ids(f, allow_empty=True)
    observations = f.raw.get("observations", [])
    if not agent_ids:
        observations = []
    elif "observations" not in f.raw:
        raise f._missing("observations")
    return EndEpisode(
        request_id,
        f.id_("episode_id"),
        observations,
        f.bool_("truncated", False),
        seq=f.seq_opt("seq"),
        agent_ids=agent_ids,
        rewards=_per_agent_rewards(f, len(agent_ids)),
        infos=_per_agent_infos(f, len(agent_ids)),
    )


_MULTI_AGENT_PARSERS: dict[str, Callable[[_Fields, int], Request]] = {
    "get_action": _parse_multi_get_action,
    "log_action": _parse_multi_log_action,
    "log_returns": _parse_multi_log_returns,
    "end_episode": _parse_multi_end_episode,
}
"""Parsers of the multi-agent forms (a request with ``agent_ids``)."""


def _map_list(f: _Fields, name: str, value: Any, required: bool) -> list[dict[str, Any]]:
    if value is None:
        if required:
            raise f._missing(name)
        return []
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise f._wrong(name, "a list of maps", value)
    return value


_STR_ONLY = {str}
_PLAIN_NUMBERS = frozenset({float, int})


def _checked_numbers(value: Any, count: int) -> np.ndarray | None:
    """``value`` as ``[count]`` float64 when it is all finite numbers within the reward bound.

    The common case, checked with a few vectorised operations; None otherwise, and
    :func:`_float_list` then reports what is wrong.
    """
    if isinstance(value, np.ndarray):
        if value.shape != (count,) or value.dtype.kind not in "fiu":
            return None
        numbers = value.astype(np.float64)
    elif isinstance(value, list) and len(value) == count:
        if not set(map(type, value)) <= _PLAIN_NUMBERS:  # bools and numpy scalars excepted
            return None
        try:
            numbers = np.array(value, dtype=np.float64)
        except OverflowError:
            return None
    else:
        return None
    if not (np.abs(numbers) <= MAX_ABS_REWARD).all():  # False for NaN and infinities
        return None
    return numbers


def _float_list(f: _Fields, name: str, value: Any, count: int) -> list[float]:
    numbers = _checked_numbers(value, count)
    if numbers is not None:
        return list(numbers.tolist())
    if hasattr(value, "tolist"):
        value = value.tolist()
    if not isinstance(value, list) or len(value) != count:
        raise DecodeError(f"{f.kind} '{name}' must be a list of {count} numbers")
    out = []
    for item in value:
        number = finite_number(item)
        if number is None:
            raise DecodeError(f"{f.kind} '{name}' must hold finite numbers, got {item!r}")
        out.append(check_reward(number, f"{f.kind} '{name}'"))
    return out


def finite_number(value: Any) -> float | None:
    """``value`` as a finite float, or None (not a number, a bool, NaN, infinite, too large)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def valid_request_id(raw: Any) -> int | None:
    """The ``id`` of a raw message if it is a valid request id, else None (for error replies)."""
    request_id = raw.get("id") if isinstance(raw, dict) else None
    if isinstance(request_id, int) and not isinstance(request_id, bool) and request_id >= 0:
        return request_id
    return None


def error_reply(request_id: int | None, code: str, message: str) -> dict[str, Any]:
    """Build an ``error`` reply.

    Args:
        request_id: The failed request's id (None when it could not be read).
        code: A machine-readable code, e.g. ``episode_error`` (see ``docs/protocol.md``).
        message: What was wrong and how to fix it.
    """
    return {"type": "error", "id": request_id, "code": code, "message": message}
