"""The bench table's figures relative to the baseline row of the same run."""

from __future__ import annotations

from bench.__main__ import table
from bench.scenarios import Result


def _row(scenario: str, rps: float, cpu_ms: float, events: int, non2xx: int = 0,
         cpu_is_per_request: bool = True) -> Result:
    return Result(scenario=scenario, connections=64, requests_per_s=rps, events_per_s=rps * events,
                  p50_ms=1.0, p99_ms=2.0, p999_ms=3.0, cpu_s_per_1000_events=0.0,
                  cpu_ms_per_request=cpu_ms, peak_rss_mb=60.0, group_commit_size=1.0, non2xx=non2xx,
                  socket_errors=0, events_per_request=events, cpu_is_per_request=cpu_is_per_request)


def _columns(text: str, scenario: str) -> list[str]:
    return next(line.split() for line in text.splitlines() if line.startswith(scenario + " "))


def test_ratio_and_cpu_above_the_baseline_per_request_and_per_event() -> None:
    text = table([
        _row("baseline", 2000.0, 0.500, 0),
        _row("batch25", 800.0, 1.500, 25),
        _row("over-limit", 1600.0, 0.600, 25, non2xx=100),
        _row("signals-read", 600.0, 1.700, 0, cpu_is_per_request=False),
    ])
    assert _columns(text, "baseline")[-3:] == ["1.00", "-", "-"]
    assert _columns(text, "batch25")[-3:] == ["0.40", "1000", "40.0"]
    # Mostly refused: the per-event figure would divide by events never accepted.
    assert _columns(text, "over-limit")[-3:] == ["0.80", "100", "-"]
    # Its CPU figure also counts the ingest beside the reads.
    assert _columns(text, "signals-read")[-3:] == ["0.30", "-", "-"]


def test_without_a_baseline_row_nothing_is_relative() -> None:
    assert _columns(table([_row("batch25", 800.0, 1.5, 25)]), "batch25")[-3:] == ["-", "-", "-"]
