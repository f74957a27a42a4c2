"""The server's metrics in Prometheus form (``GET /metrics``), by the Prometheus conventions.

A slash name becomes ``rlserve_`` + the name with ``_`` for ``/``; a counter (a name of
:data:`~rlserve.server.stats.COUNTERS`) is a Prometheus counter, exposed with the ``_total``
suffix; every other metric is a gauge. Each policy's metrics of a server with several
(``policies/<id>/<name>``) are one family ``rlserve_policy_<name>`` with the label
``policy="<id>"``, apart from the totals (so that ``sum()`` over a family never counts twice).
Units are in the names (``_seconds``, ``_steps``...); docs/metrics.md lists them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from rlserve.server.stats import COUNTERS

PREFIX = "rlserve_"
"""The prefix of every family."""

TEXT_FORMAT = "text/plain; version=0.0.4; charset=utf-8"
"""The media type of ``GET /metrics``: Prometheus's text exposition format 0.0.4."""

POLICY_PREFIX = "policies/"
"""The slash prefix of each policy's own metrics."""


def family_of(name: str) -> tuple[str, str | None, bool]:
    """A slash name's Prometheus family (without ``_total``), policy, and whether a counter.

    >>> family_of("learner/updates")
    ('rlserve_learner_updates', None, True)
    >>> family_of("policies/red/episodes/return_mean")
    ('rlserve_policy_episodes_return_mean', 'red', False)
    """
    policy = None
    if name.startswith(POLICY_PREFIX):
        policy, _, name = name.removeprefix(POLICY_PREFIX).partition("/")
        return PREFIX + "policy_" + name.replace("/", "_"), policy, name in COUNTERS
    return PREFIX + name.replace("/", "_"), policy, name in COUNTERS


def families(snapshot: dict[str, float]) -> list[Metric]:
    """The Prometheus families of a metrics snapshot (names of ``ServerStats.snapshot``)."""
    found: dict[str, CounterMetricFamily | GaugeMetricFamily] = {}
    for name, value in snapshot.items():
        family, policy, counter = family_of(name)
        metric = found.get(family)
        if metric is None:
            shown = name if policy is None else f"{POLICY_PREFIX}<policy>/{name.split('/', 2)[2]}"
            labels = None if policy is None else ["policy"]
            help_text = f"rlserve {shown}"
            metric = found[family] = (
                CounterMetricFamily(family, help_text, labels=labels)
                if counter
                else GaugeMetricFamily(family, help_text, labels=labels)
            )
        metric.add_metric([] if policy is None else [policy], float(value))
    return list(found.values())


class StatsCollector:
    """Exposes a metrics snapshot to a ``prometheus_client`` registry on every scrape.

    Args:
        snapshot: Returns the current metrics (``ServerStats.snapshot``).
    """

    def __init__(self, snapshot: Callable[[], dict[str, float]]):
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        """The families of the current snapshot."""
        yield from families(self._snapshot())
