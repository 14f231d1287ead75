"""Prometheus metrics: counters updated on the hot path, the rest read at scrape time.

Long-lived components expose `statistics()`; a custom collector turns those
into gauges when /metrics is scraped, so the hot path pays for nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "collector_requests",
            "HTTP requests answered, by route and status",
            ["route", "status"],
            registry=self.registry,
        )
        self.events = Counter(
            "collector_events",
            "Events received, by outcome (accepted, duplicate, rejected, dropped)",
            ["outcome"],
            registry=self.registry,
        )
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
        self._gauges: list[Callable[[], Iterator[GaugeMetricFamily]]] = []
        self.registry.register(_GaugeCollector(self._gauges))
        self._request_children: dict[tuple[str, int], Counter] = {}
        self._event_children = {
            name: self.events.labels(name)
            for name in ("accepted", "duplicate", "rejected", "dropped")
        }

    def count_request(self, route: str, status: int) -> None:
        child = self._request_children.get((route, status))
        if child is None:
            child = self._request_children[(route, status)] = self.requests.labels(
                route, str(status)
            )
        child.inc()

    def count_events(self, outcome: str, amount: int) -> None:
        if amount:
            self._event_children[outcome].inc(amount)

    def on_commit(self, group_size: int, seconds: float) -> None:
        """Called from the writer thread after each commit (prometheus-client is thread-safe)."""
        self.commit_seconds.observe(seconds)
        self.commit_group_size.observe(group_size)

    def add_gauges(self, produce: Callable[[], Iterator[GaugeMetricFamily]]) -> None:
        self._gauges.append(produce)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _GaugeCollector(Collector):
    def __init__(self, producers: list[Callable[[], Iterator[GaugeMetricFamily]]]) -> None:
        self._producers = producers

    def collect(self) -> Iterator[GaugeMetricFamily]:
        for produce in self._producers:
            yield from produce()


def gauge(name: str, documentation: str, value: float, labels: dict[str, str] | None = None) -> GaugeMetricFamily:
    if not labels:
        return GaugeMetricFamily(name, documentation, value=value)
    family = GaugeMetricFamily(name, documentation, labels=list(labels))
    family.add_metric(list(labels.values()), value)
    return family
