"""JSON bodies of the HTTP carrier, parsed without blocking the event loop.

``json.loads`` holds the GIL for the whole parse (about 0.75 s for 12 MB of floats), so a worker
thread would not help: a body of ``OFF_LOOP_BODY_BYTES`` or more is parsed in a separate worker
process (started on first use), and small bodies inline. The worker returns plain values and
numpy arrays that it built itself; nothing the network sent is unpickled (the pickle stream is
produced by our own process from parsed JSON).
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import numpy as np

from rlserve.errors import DecodeError

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


async def parse_body(body: bytes, arrays_for_obs: bool) -> dict[str, Any]:
    """Parse a request body; large ones in the worker process.

    Args:
        body: The raw body.
        arrays_for_obs: Turn ``observation(s)`` lists into arrays (every space is a Box).

    Raises:
        DecodeError: Not JSON, nested too deeply, or not a JSON object.
    """
    if len(body) < OFF_LOOP_BODY_BYTES:
        return _parse_body(body, arrays_for_obs)
    loop = asyncio.get_running_loop()
    try:
        return await loop.run_in_executor(_pool(), _parse_body, body, arrays_for_obs)
    except BrokenProcessPool:
        shutdown()  # the worker died (e.g. killed): start a new one next time
        return await loop.run_in_executor(_pool(), _parse_body, body, arrays_for_obs)


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
