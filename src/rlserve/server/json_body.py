"""JSON bodies of the HTTP carrier: parsed off the event loop, and held to the decode limits.

``json.loads`` holds the GIL for the whole parse (about 0.75 s for 12 MB of floats), so a worker
thread would not help: a body of ``OFF_LOOP_BODY_BYTES`` or more is parsed in a separate worker
process (started on first use), and small bodies inline.

A parsed body is carried on as msgpack and decoded with the binary carrier's checked decode
(:func:`rlserve.protocol.codec.decode`), so JSON gets the same decode-time limits: entries per
object or array (``max_container_len``), objects and arrays in all (``max_containers_per_frame``),
array sizes; nesting is bounded by the JSON parser (about 1000 levels). The worker checks them
before it answers and returns only msgpack bytes: a body over the limits is refused in the
worker, and the event loop never unpickles a big object graph (15 MB of ``[]`` used to cost it
2.5 s). Integers beyond the 64 bits msgpack carries are read as doubles (infinite past their range),
as JSON numbers are in most parsers.
"""

from __future__ import annotations

import asyncio
import json
import math
import multiprocessing
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, cast

import msgpack
import numpy as np

from rlserve.errors import DecodeError, LimitExceededError
from rlserve.protocol.codec import decode, pack_array
from rlserve.protocol.limits import Limits

OFF_LOOP_BODY_BYTES = 256 * 1024
"""Bodies at least this large are parsed in the worker process (smaller: ~15 ms inline)."""

_FRAGMENT_ARRAYS = (
    "obs",
    "actions",
    "rewards",
    "behaviour_logp",
    "policy_chosen",
    "weights_version",
)

_executor: ProcessPoolExecutor | None = None


def _pool() -> ProcessPoolExecutor:
    global _executor
    if _executor is None:
        # spawn: the serving process runs threads (learner link) and an event loop; fork is unsafe.
        _executor = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
    return _executor


def shutdown() -> None:
    """Stop the worker process, if one was started."""
    global _executor
    if _executor is not None:
        _executor.shutdown(wait=False, cancel_futures=True)
        _executor = None


async def parse_body(body: bytes, arrays_for_obs: bool, limits: Limits) -> dict[str, Any]:
    """Parse a request body; large ones in the worker process.

    Args:
        body: The raw body.
        arrays_for_obs: Turn ``observation(s)`` lists into arrays (every space is a Box).
        limits: The decode limits (as for a binary frame).

    Raises:
        DecodeError: Not JSON, nested too deeply, or not a JSON object.
        LimitExceededError: Over a decode limit, e.g. an array over ``max_container_len``.
    """
    if len(body) < OFF_LOOP_BODY_BYTES:
        return _decode(_packed_body(body, arrays_for_obs), limits)
    loop = asyncio.get_running_loop()
    try:
        packed = await loop.run_in_executor(_pool(), _checked_body, body, arrays_for_obs, limits)
    except BrokenProcessPool:
        shutdown()  # the worker died (e.g. killed): start a new one next time
        packed = await loop.run_in_executor(_pool(), _checked_body, body, arrays_for_obs, limits)
    return _decode(packed, limits)


def _checked_body(body: bytes, arrays_for_obs: bool, limits: Limits) -> bytes:
    """In the worker: the body as msgpack, refused here when over the decode limits."""
    packed = _packed_body(body, arrays_for_obs)
    _decode(packed, limits)
    return packed


def _decode(packed: bytes, limits: Limits) -> dict[str, Any]:
    """The checked decode of a body carried as msgpack; its limit errors worded for JSON."""
    try:
        return decode(packed, limits)
    except LimitExceededError as exc:
        raise LimitExceededError(_in_json_terms(str(exc), limits)) from None


def _in_json_terms(message: str, limits: Limits) -> str:
    # The codec words its errors for msgpack, where numbers may travel as ndarray values; a
    # JSON client sends objects and arrays (its numeric arrays are already ndarrays here).
    if "max_containers_per_frame" in message:
        return (
            f"the body holds more than {limits.max_containers_per_frame} JSON objects and arrays "
            "in all, over the limit max_containers_per_frame; nest fewer objects and arrays, or "
            "split the message"
        )
    for msgpack_words, json_words in (
        ("a msgpack array", "a JSON array"),
        ("a msgpack map", "a JSON object"),
        ("send numbers as an ndarray extension value or split", "send less or split"),
    ):
        message = message.replace(msgpack_words, json_words)
    return message


def _packed_body(body: bytes, arrays_for_obs: bool) -> bytes:
    """JSON body -> message map as msgpack, the big numeric lists already arrays."""
    value = _parse_body(body, arrays_for_obs)
    try:
        return cast(bytes, msgpack.Packer(default=_json_default, use_bin_type=True).pack(value))
    except ValueError as exc:  # a string with a lone surrogate (\ud800), or msgpack's depth limit
        raise DecodeError(f"body cannot be read as a message: {exc}") from exc


def _json_default(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return pack_array(value)
    if isinstance(value, int):  # beyond 64 bits: read as a double, like most JSON parsers
        try:
            return float(value)
        except OverflowError:
            return math.inf if value > 0 else -math.inf
    raise TypeError(f"cannot carry a {type(value).__name__} from a JSON body")


def _parse_body(body: bytes, arrays_for_obs: bool) -> dict[str, Any]:
    """JSON body -> message map, with the big numeric lists already turned into arrays."""
    try:
        value = json.loads(body)
    except RecursionError as exc:
        raise DecodeError("body is not valid JSON: nested too deeply") from exc
    except (ValueError, UnicodeDecodeError) as exc:
        raise DecodeError(f"body is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise DecodeError("the body must be a JSON object of the message's fields")
    if arrays_for_obs:
        _to_arrays(value, ("observation", "observations"))
    fragments = value.get("fragments")
    if isinstance(fragments, list):
        for fragment in fragments:
            if isinstance(fragment, dict):
                _to_arrays(fragment, _FRAGMENT_ARRAYS)
    return value


def _to_arrays(message: dict[str, Any], names: Iterable[str]) -> None:
    for name in names:
        value = message.get(name)
        if isinstance(value, list) and value:
            try:
                array = np.asarray(value)
            except (ValueError, TypeError, RecursionError):
                continue  # left as it is: the request's checks name the problem
            if array.dtype.kind in "biuf":
                message[name] = array
