"""Workers' shared metrics: what one answer shows never reads lower in a later one."""

from __future__ import annotations

from pathlib import Path

from prometheus_client.core import CounterMetricFamily

from collector.metrics_share import SharedMetrics


def _requests(count: float) -> list[CounterMetricFamily]:
    family = CounterMetricFamily("collector_requests", "requests", labels=["route"])
    family.add_metric(["/v1/events"], count)
    return [family]


def _value(families: list, worker: str) -> float:  # type: ignore[type-arg]
    return next(sample.value for family in families for sample in family.samples
                if sample.name == "collector_requests_total" and sample.labels["worker"] == worker)


def test_a_snapshot_that_cannot_be_written_shows_the_last_written_one(tmp_path: Path) -> None:
    # Live figures in that answer, the older file in the next worker's: a drop,
    # read as a counter reset (review helper-45).
    zero, one = SharedMetrics(tmp_path, 0), SharedMetrics(tmp_path, 1)
    zero.publish(_requests(100))
    one.publish(_requests(7))
    (tmp_path / "worker-0.json").unlink()  # as good as unreadable: only memory has it
    shown = zero.gather(unwritten=True)
    assert (_value(shown, "0"), _value(shown, "1")) == (100, 7)
    assert _value(one.gather(), "1") == 7
