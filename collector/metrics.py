"""Prometheus metrics: plain counters on the hot path, everything rendered at scrape time.

The request and event counters are plain ints in dicts, bumped on the event
loop thread only (a prometheus-client Counter takes a lock and does label
bookkeeping on every call); a custom collector turns them into counter
families, `_total` and `_created` samples as before, when /metrics is
scraped. Long-lived components expose `statistics()`, turned into gauges the
same way. The commit histograms are observed from the writer thread, once
per group.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from collector.metrics_share import SharedMetrics

EVENT_OUTCOMES = ("accepted", "duplicate", "rejected", "dropped")
# Counters with one free label: name -> (help, label name)
LABELLED = {
    "collector_events_dropped": ("Events dropped before admission, by reason", "reason"),
    "collector_events_bot": ("Events classified as bot traffic when admitted, by category", "category"),
    "collector_signals_reads": ("Visitor snapshots served, by coverage mode (full or degraded)", "mode"),
    "collector_connections_refused": (
        "Connections refused at once because a cap was reached (total or per_client)",
        "cap",
    ),
    "collector_connection_failures": (
        "Connections ended by an error in the HTTP protocol layer (the server goes on), by exception type",
        "error",
    ),
}


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        created = time.time()
        # (route, status) -> [count, created]; outcome -> [count, created]
        self._requests: dict[tuple[str, int], list[float]] = {}
        self._events: dict[str, list[float]] = {name: [0, created] for name in EVENT_OUTCOMES}
        self._labelled: dict[str, dict[str, list[float]]] = {name: {} for name in LABELLED}
        self.registry.register(_CounterCollector(self))
        self.commit_seconds = Histogram(
            "collector_commit_seconds",
            "Duration of one group-commit transaction including fsync",
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0),
            registry=self.registry,
        )
        self.commit_group_size = Histogram(
            "collector_commit_group_size",
            "Requests committed by one transaction",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
            registry=self.registry,
        )
        self._gauges: list[Callable[[], Iterator[Metric]]] = []
        self.registry.register(_GaugeCollector(self._gauges))
        # node-wide gauges (storage, outbox, meters): the same from every worker
        self._node_gauges: list[Callable[[], Iterator[Metric]]] = []
        self._node_collector = _GaugeCollector(self._node_gauges)
        self.registry.register(self._node_collector)
        self.shared: SharedMetrics | None = None  # set under `serve --workers N`

    def count_request(self, route: str, status: int) -> None:
        """Called on the event loop thread only."""
        entry = self._requests.get((route, status))
        if entry is None:
            self._requests[(route, status)] = [1, time.time()]
        else:
            entry[0] += 1

    def count_events(self, outcome: str, amount: int) -> None:
        if amount:
            self._events[outcome][0] += amount

    def count_labelled(self, name: str, label: str, amount: int = 1) -> None:
        """Bump one of LABELLED's counters; event loop thread only."""
        entry = self._labelled[name].get(label)
        if entry is None:
            self._labelled[name][label] = [amount, time.time()]
        else:
            entry[0] += amount

    def counter_families(self) -> Iterator[CounterMetricFamily]:
        requests = CounterMetricFamily(
            "collector_requests", "HTTP requests answered, by route and status", labels=["route", "status"]
        )
        for (route, status), (count, created) in list(self._requests.items()):
            requests.add_metric([route, str(status)], count, created=created)
        yield requests
        events = CounterMetricFamily(
            "collector_events",
            "Events of requests answered 202, by outcome (accepted, duplicate, rejected, dropped);"
            " a request refused whole counts in collector_requests_total",
            labels=["outcome"],
        )
        for outcome, (count, created) in list(self._events.items()):
            events.add_metric([outcome], count, created=created)
        yield events
        for name, (documentation, label_name) in LABELLED.items():
            family = CounterMetricFamily(name, documentation, labels=[label_name])
            for label, (count, created) in list(self._labelled[name].items()):
                family.add_metric([label], count, created=created)
            yield family

    def on_commit(self, group_size: int, seconds: float) -> None:
        """Called from the writer thread after each commit (prometheus-client is thread-safe)."""
        self.commit_seconds.observe(seconds)
        self.commit_group_size.observe(group_size)

    def add_gauges(self, produce: Callable[[], Iterator[Metric]], *, node: bool = False) -> None:
        """Gauges of this process, or with `node` of the whole node (stated once under --workers)."""
        (self._node_gauges if node else self._gauges).append(produce)

    def process_families(self) -> list[Metric]:
        """Everything this process counts by itself (what a worker shares with the others)."""
        families: list[Metric] = list(self.counter_families())
        families += [*self.commit_seconds.collect(), *self.commit_group_size.collect()]
        for produce in self._gauges:
            families += produce()
        return families

    def render(self) -> bytes:
        if self.shared is None:
            return generate_latest(self.registry)
        try:
            self.shared.publish(self.process_families())
            unwritten = False
        except OSError:  # /tmp full: every worker's last written figures (see gather)
            unwritten = True
        return generate_latest(_Families([*self.shared.gather(unwritten=unwritten), *self._node_collector.collect()]))


class _Families(Collector):
    """A registry's worth of families gathered already (generate_latest takes any collector)."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


class _CounterCollector(Collector):
    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[CounterMetricFamily]:
        return self._metrics.counter_families()


class _GaugeCollector(Collector):
    def __init__(self, producers: list[Callable[[], Iterator[Metric]]]) -> None:
        self._producers = producers

    def collect(self) -> Iterator[Metric]:
        for produce in self._producers:
            yield from produce()


def gauge(name: str, documentation: str, value: float, labels: dict[str, str] | None = None) -> GaugeMetricFamily:
    if not labels:
        return GaugeMetricFamily(name, documentation, value=value)
    family = GaugeMetricFamily(name, documentation, labels=list(labels))
    family.add_metric(list(labels.values()), value)
    return family
