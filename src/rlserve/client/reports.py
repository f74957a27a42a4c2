"""A local-inference client's ``report_samples``: built, and cut to the server's limits.

What is ready to ship is cut into reports that each fit the server's ``max_frame_bytes`` and
``max_array_elements`` (a fragment is split by steps when needed); a report the server still
finds too large is halved.

A fragment of a policy with memory (``state_in``) is never split: its tail would need the
recurrent state at the cut, which only the acting side knew. It goes whole into the next report
instead, and the client cuts such fragments short enough to fit one report
(:func:`memory_fragment_length`), so nothing is lost.
"""

from __future__ import annotations

import uuid
from collections import deque
from typing import Any

from rlserve.experience.episode_records import EpisodeSummary, summary_to_wire
from rlserve.policy import NumpyPolicy
from rlserve.protocol.fragment import Fragment, report_wire
from rlserve.protocol.limits import Limits
from rlserve.protocol.session_requests import ReportSamples

MESSAGE_OVERHEAD = 1024
"""Bytes reserved per report for its fixed fields (type, ids, map keys)."""

FRAGMENT_OVERHEAD = 512
"""Bytes reserved per fragment for its keys, flags and array headers (plus its id)."""

SUMMARY_BYTES = 256
"""Bytes reserved per episode summary (plus its id)."""


def report_message(
    policy_id: str, fragments: list[Fragment], summaries: list[EpisodeSummary]
) -> dict[str, Any]:
    """A ``report_samples`` of one policy's fragments, with a fresh batch id.

    The server trains on each batch id once, so a report re-sent as it is counts once.
    """
    report = ReportSamples(
        0,
        uuid.uuid4().hex,
        policy_id,
        [report_wire(f) for f in fragments],
        [summary_to_wire(s) for s in summaries],
    )
    return report.to_wire()


def plan_policy_reports(
    fragments: list[Fragment],
    summaries: list[EpisodeSummary],
    default_policy_id: str,
    limits: Limits,
) -> tuple[list[tuple[str, list[Fragment], list[EpisodeSummary]]], list[Fragment]]:
    """:func:`plan_reports` for fragments of several policies: one report carries one policy's.

    The summaries go with the first policy's first report (the default policy's when there are
    no fragments).

    Returns:
        The reports as (policy id, fragments, summaries), in order; and the fragments of which
        not even one step fits in a report (to be dropped).
    """
    by_policy: dict[str, list[Fragment]] = {}
    for fragment in fragments:
        by_policy.setdefault(fragment.policy_id, []).append(fragment)
    if not by_policy:
        by_policy[default_policy_id] = []
    reports: list[tuple[str, list[Fragment], list[EpisodeSummary]]] = []
    dropped: list[Fragment] = []
    for policy_id, own in by_policy.items():
        batches, too_big = plan_reports(
            own,
            summaries,
            limits.max_frame_bytes,
            limits.max_array_elements,
            limits.max_container_len,
        )
        summaries = []
        dropped += too_big
        reports += [(policy_id, *part) for part in batches]
    return reports, dropped


def plan_reports(
    fragments: list[Fragment],
    summaries: list[EpisodeSummary],
    max_frame_bytes: int,
    max_array_elements: int,
    max_items: int,
) -> tuple[list[tuple[list[Fragment], list[EpisodeSummary]]], list[Fragment]]:
    """Cut what is ready into reports that each fit the server's limits.

    The encoded size is estimated from the arrays' bytes plus fixed overheads. A fragment that
    does not fit is split by steps (the head bootstraps from the tail's first observation, as
    at any fragment cut).

    Returns:
        The reports as (fragments, summaries), in order; and the fragments of which not even
        one step fits in a report (to be dropped).
    """
    budget = int(max_frame_bytes * 0.95) - MESSAGE_OVERHEAD
    reports: list[tuple[list[Fragment], list[EpisodeSummary]]] = []
    too_big: list[Fragment] = []
    current: list[Fragment] = []
    ended: list[EpisodeSummary] = []
    used = 0
    queue = deque(fragments)
    while queue:
        fragment = queue.popleft()
        room = budget - used if len(current) < max_items else 0
        fits = _steps_fitting(fragment, room, max_array_elements)
        if fits >= len(fragment):
            current.append(fragment)
            used += _fragment_bytes(fragment, len(fragment))
            continue
        if fits > 0 and fragment.state_in is None:
            head, tail = split_fragment(fragment, fits)
            current.append(head)
            queue.appendleft(tail)
        elif not current:
            too_big.append(fragment)  # not even one step fits in an empty report
            continue
        else:
            queue.appendleft(fragment)
        reports.append((current, []))
        current, used = [], 0
    for summary in summaries:
        size = SUMMARY_BYTES + len(summary.episode_id)
        if used + size > budget or len(ended) >= max_items:
            reports.append((current, ended))
            current, ended, used = [], [], 0
        ended.append(summary)
        used += size
    reports.append((current, ended))
    return [r for r in reports if r[0] or r[1]], too_big


def memory_fragment_length(
    fragment_length: int, policies: dict[str, NumpyPolicy], limits: Limits
) -> int:
    """Steps per fragment (at most ``fragment_length``) that fit in one report.

    Only when a policy has memory: its fragments are never split to fit (see the module
    docstring). Estimated as :func:`plan_reports` does (float32 observations and actions, int64
    choices as wide as two floats, the ``state_in``), with a tenth of the room to spare.
    """
    for policy in policies.values():
        if not policy.state_size:
            continue
        obs_dim = policy.spec.obs_dim
        action_elements = policy.spec.action_distribution().action_width
        budget = int(limits.max_frame_bytes * 0.95) - MESSAGE_OVERHEAD
        overhead = FRAGMENT_OVERHEAD + limits.max_id_length + 4 * (obs_dim + policy.state_size)
        per_step = 4 * obs_dim + 4 * max(2, action_elements) + 4 + 4 + 1 + 8
        by_bytes = int(0.9 * (budget - overhead)) // per_step
        by_elements = min(
            limits.max_array_elements // max(1, obs_dim) - 1,
            limits.max_array_elements // max(1, action_elements),
        )
        fragment_length = max(1, min(fragment_length, by_bytes, by_elements))
    return fragment_length


def _step_bytes(fragment: Fragment) -> int:
    return (
        fragment.obs[0].nbytes
        + fragment.actions[:1].nbytes
        + fragment.rewards.itemsize
        + fragment.behaviour_logp.itemsize
        + fragment.policy_chosen.itemsize
        + fragment.weights_version.itemsize
    )


def _fragment_bytes(fragment: Fragment, steps: int) -> int:
    overhead = FRAGMENT_OVERHEAD + len(fragment.episode_id) + fragment.obs[0].nbytes
    if fragment.state_in is not None:
        overhead += fragment.state_in.nbytes
    return overhead + steps * _step_bytes(fragment)


def _steps_fitting(fragment: Fragment, room: int, max_elements: int) -> int:
    """How many of the fragment's first steps fit in ``room`` bytes and the element limit."""
    per_step = _step_bytes(fragment)
    by_bytes = (room - _fragment_bytes(fragment, 0)) // per_step
    obs_elements = max(1, fragment.obs[0].size)
    action_elements = max(1, fragment.actions[:1].size)
    by_elements = min(max_elements // obs_elements - 1, max_elements // action_elements)
    return max(0, min(len(fragment), by_bytes, by_elements))


def split_fragment(fragment: Fragment, steps: int) -> tuple[Fragment, Fragment]:
    """Cut a fragment after ``steps`` steps; the head ends in the tail's first observation.

    Raises:
        ValueError: The fragment has a ``state_in`` (the tail's is not known here).
    """
    if fragment.state_in is not None:
        raise ValueError("a fragment of a policy with memory (state_in) is never split")
    head = Fragment(
        fragment.episode_id,
        fragment.agent_id,
        fragment.policy_id,
        fragment.obs[: steps + 1],
        fragment.actions[:steps],
        fragment.rewards[:steps],
        fragment.behaviour_logp[:steps],
        fragment.policy_chosen[:steps],
        fragment.weights_version[:steps],
        terminated=False,
        truncated=False,
        infos=None if fragment.infos is None else fragment.infos[:steps],
    )
    tail = Fragment(
        fragment.episode_id,
        fragment.agent_id,
        fragment.policy_id,
        fragment.obs[steps:],
        fragment.actions[steps:],
        fragment.rewards[steps:],
        fragment.behaviour_logp[steps:],
        fragment.policy_chosen[steps:],
        fragment.weights_version[steps:],
        terminated=fragment.terminated,
        truncated=fragment.truncated,
        infos=None if fragment.infos is None else fragment.infos[steps:],
    )
    return head, tail


def halve_report(
    fragments: list[Fragment], summaries: list[EpisodeSummary]
) -> tuple[tuple[list[Fragment], list[EpisodeSummary]], ...] | None:
    """Two smaller reports with the same content, or None when one step cannot be split."""
    if len(fragments) > 1:
        middle = len(fragments) // 2
        return (fragments[:middle], []), (fragments[middle:], summaries)
    if fragments and len(fragments[0]) > 1 and fragments[0].state_in is None:
        head, tail = split_fragment(fragments[0], len(fragments[0]) // 2)
        return ([head], []), ([tail], summaries)
    if fragments and summaries:
        return (fragments, []), ([], summaries)
    return None
