"""The Prometheus families of the server's metrics: counters, units, the policy label."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from rlserve.server.pacing import LearnerPace
from rlserve.server.prometheus import StatsCollector, family_of
from rlserve.server.stats import COUNTERS, ServerStats

METRICS_DOC = Path(__file__).parents[2] / "docs" / "metrics.md"


def _scrape(stats: ServerStats) -> dict[str, Any]:
    registry = CollectorRegistry(auto_describe=True)
    registry.register(StatsCollector(stats.snapshot))
    text = generate_latest(registry).decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_every_counter_is_a_metric_of_some_server() -> None:
    stats = ServerStats(("red", "blue"))
    stats.configure_policies(("red", "blue"), {"red": "dqn", "blue": "sac"})
    stats.metric_sources.append(LearnerPace(0).metrics)
    names = {re.sub(r"^policies/[a-z]+/", "", name) for name in stats.snapshot()}
    assert names >= COUNTERS, COUNTERS - names


def test_counters_totals_and_the_policy_label() -> None:
    stats = ServerStats(("red", "blue"))
    stats.update_learner("red", {"learner/updates": 3.0, "learner/weights_version": 3.0})
    stats.set_policy_version("red", 3)
    families = _scrape(stats)
    updates = families["rlserve_learner_updates"]
    assert updates.type == "counter"
    assert [s.name for s in updates.samples] == ["rlserve_learner_updates_total"]
    per_policy = families["rlserve_policy_learner_updates"]
    assert per_policy.type == "counter"
    values = {s.labels["policy"]: s.value for s in per_policy.samples}
    assert values == {"red": 3.0, "blue": 0.0}
    version = families["rlserve_policy_weights_version"]
    assert version.type == "gauge"
    assert {s.labels["policy"]: s.value for s in version.samples} == {"red": 3.0, "blue": -1.0}
    assert families["rlserve_server_uptime_seconds"].type == "gauge"
    # A total has no label, so that summing a family over its labels never counts twice.
    assert all(not s.labels for s in updates.samples)


def test_family_names() -> None:
    assert family_of("samples/env_steps") == ("rlserve_samples_env_steps", None, True)
    assert family_of("server/clients") == ("rlserve_server_clients", None, False)
    assert family_of("policies/a.b/learner/approx_kl") == (
        "rlserve_policy_learner_approx_kl",
        "a.b",
        False,
    )


def test_the_doc_marks_exactly_the_counters() -> None:
    text = METRICS_DOC.read_text()
    rows = re.findall(r"^\| `([a-z_<>/0-9]+)` \|.*\| ([^|]*) \| [^|]* \|$", text, re.M)
    marked = {name.replace("policies/<id>/", "") for name, unit in rows if "counter" in unit}
    unmarked = {name for name, unit in rows if "counter" not in unit}
    items = re.findall(r"^- `(learner/[a-z_0-9]+)`:(.*?)(?=^- |^$)", text, re.M | re.S)
    marked |= {name for name, body in items if "counter)" in body}
    assert marked == COUNTERS, marked ^ COUNTERS
    assert not unmarked & COUNTERS
