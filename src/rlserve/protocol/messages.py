"""Protocol version 1's requests: a decoded map to its typed record.

Every message is a map with a ``type`` string. Requests carry an ``id`` (a non-negative integer
chosen by the client); the reply to a request carries the same ``id``, so a client may pipeline
requests on one connection. :func:`parse_request` validates a request and builds its record:
the episode calls' records are in :mod:`rlserve.protocol.episode_requests` (their multi-agent
forms parsed in :mod:`rlserve.protocol.multi_agent_requests`), the others' in
:mod:`rlserve.protocol.session_requests`, the field checks in :mod:`rlserve.protocol.fields`.
This module re-exports the records, so every name it held before the split imports from here.
Each record's ``to_wire`` is its encoder; the replies are in :mod:`rlserve.protocol.replies`.

A field sent as nil (JSON ``null``) is the same as a field left out, for every field of every
request (C# and C++ serialisers write nil for unset members): :func:`parse_request` drops nil
fields before it reads any, so an optional one takes its default and a required one is reported
missing. The space-checked values are the exception: a nil ``observation`` or ``action`` is sent,
and then refused by the space check.
"""

from __future__ import annotations

from typing import Any

from rlserve.errors import DecodeError, LimitExceededError
from rlserve.protocol.episode_requests import (
    DEFAULT_POLICY_ID,
    MAX_SEQ,
    EndEpisode,
    GetAction,
    LogAction,
    LogReturns,
    StartEpisode,
)
from rlserve.protocol.fields import RequestFields, finite_number, float_list
from rlserve.protocol.limits import DEFAULT_LIMITS, Limits
from rlserve.protocol.multi_agent_requests import MULTI_AGENT_PARSERS, MapAgents, parse_map_agents
from rlserve.protocol.session_requests import GetWeights, Hello, Ping, ReportSamples
from rlserve.protocol.values import MAX_ABS_REWARD

__all__ = [
    "DEFAULT_POLICY_ID",
    "MAX_SEQ",
    "REQUEST_TYPES",
    "SPACE_VALUE_FIELDS",
    "EndEpisode",
    "GetAction",
    "GetWeights",
    "Hello",
    "LogAction",
    "LogReturns",
    "MapAgents",
    "Ping",
    "ReportSamples",
    "Request",
    "StartEpisode",
    "finite_number",
    "parse_request",
    "valid_request_id",
    "without_nil",
]

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
    | MapAgents
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
    "map_agents",
)
"""The ``type`` values of requests, in the order ``docs/protocol.md`` lists them."""


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
    kind = raw.get("type")
    if kind == "get_action" or kind == "log_returns":
        lean = _lean_step(raw, kind, limits.max_id_length)
        if lean is not None:
            return lean
    return parse_general(raw, limits)


def parse_general(raw: dict[str, Any], limits: Limits = DEFAULT_LIMITS) -> Request:
    """:func:`parse_request` without its fast path for the common step calls: every field read.

    The reference the fast path is tested against; :func:`parse_request` is what to call.
    """
    raw = without_nil(raw)
    kind = raw.get("type")
    if not isinstance(kind, str):
        raise DecodeError(
            f"a message needs a string 'type'; known types: {', '.join(REQUEST_TYPES)}"
        )
    f = RequestFields(raw, kind, limits)
    request_id = f.int_("id", 0)
    if "agent_ids" in raw and kind in MULTI_AGENT_PARSERS:
        return MULTI_AGENT_PARSERS[kind](f, request_id)
    if kind == "get_action":
        return _parse_get_action(f, request_id)
    if kind == "log_returns":
        info = f.info_opt("info")
        reward = f.float_opt("reward")
        if reward is None:
            raise f.missing("reward")
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
            raise f.wrong("token", "a string", token)
        return Hello(
            request_id,
            f.int_("protocol_version"),
            f.str_("client_name", "client"),
            token,
            f.str_("inference_mode", "remote"),
            f.id_opt("client_id"),
            f.bool_("map_agents", False),
        )
    if kind == "map_agents":
        return parse_map_agents(f, request_id)
    raise DecodeError(f"unknown message type '{kind}'; known types: {', '.join(REQUEST_TYPES)}")


_LEAN_STEP_FIELDS = frozenset({"type", "id", "episode_id", "observation", "reward", "seq", "info"})
"""The fields of the common single-episode ``get_action`` and ``log_returns``."""


def _lean_step(raw: dict[str, Any], kind: str, max_id_length: int) -> GetAction | LogReturns | None:
    """The common single-episode ``get_action`` / ``log_returns``, checked inline, or None.

    Most requests are one of these two (a remote client's every step), and the general parser
    spends a dozen calls on the fields. This accepts only what the general parser accepts and
    builds the same record; anything else (another field, a nil or an int reward, an info map)
    returns None, so the general parser handles it and words any error.
    """
    if not raw.keys() <= _LEAN_STEP_FIELDS or raw.get("info") is not None:
        return None
    request_id = raw.get("id", 0)
    episode_id = raw.get("episode_id")
    reward = raw.get("reward")
    seq = raw.get("seq")
    if (
        type(request_id) is not int
        or request_id < 0
        or type(episode_id) is not str
        or not 0 < len(episode_id) <= max_id_length
        or (seq is not None and (type(seq) is not int or not 1 <= seq <= MAX_SEQ))
    ):
        return None
    if kind == "log_returns":
        if type(reward) is not float or not -MAX_ABS_REWARD <= reward <= MAX_ABS_REWARD:
            return None
        return LogReturns(request_id, episode_id, reward, None, seq)
    if "observation" not in raw or (
        reward is not None
        and (type(reward) is not float or not -MAX_ABS_REWARD <= reward <= MAX_ABS_REWARD)
    ):
        return None
    return GetAction(
        request_id,
        [episode_id],
        [raw["observation"]],
        None if reward is None else [reward],
        batched=False,
        seqs=None if seq is None else [seq],
    )


def without_nil(raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` without its nil fields (nil and absent mean the same), space values excepted.

    Returns ``raw`` itself when it holds no nil field, so the common case copies nothing.
    """
    if all(value is not None for value in raw.values()):
        return raw
    return {k: v for k, v in raw.items() if v is not None or k in SPACE_VALUE_FIELDS}


def _parse_get_action(f: RequestFields, request_id: int) -> GetAction:
    raw = f.raw
    if "episode_ids" in raw:
        ids = raw["episode_ids"]
        if not isinstance(ids, list) or not ids:
            raise f.wrong("episode_ids", "a non-empty list of strings", ids)
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
            reward_list = float_list(f, "rewards", rewards, len(episode_ids))
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


def _map_list(f: RequestFields, name: str, value: Any, required: bool) -> list[dict[str, Any]]:
    if value is None:
        if required:
            raise f.missing(name)
        return []
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise f.wrong(name, "a list of maps", value)
    return value


def valid_request_id(raw: Any) -> int | None:
    """The ``id`` of a raw message if it is a valid request id, else None (for error replies)."""
    request_id = raw.get("id") if isinstance(raw, dict) else None
    if isinstance(request_id, int) and not isinstance(request_id, bool) and request_id >= 0:
        return request_id
    return None
