"""The bench table's figures relative to the baseline row of the same run."""

from __future__ import annotations

from bench.__main__ import table
from bench.scenarios import Result, disagreement


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


def test_figures_not_measured_print_a_dash_and_problems_a_warning() -> None:
    read = _row("signals-read", 600.0, 1.7, 0, cpu_is_per_request=False)
    read.cpu_s_per_1000_events = None
    read.group_commit_size = None
    flawed = _row("batch25", 800.0, 1.5, 25, non2xx=3)
    flawed.socket_errors, flawed.timeouts = 7, 5
    flawed.check("1 of the server's 3 processes exited mid-run")
    text = table([read, flawed])
    columns = _columns(text, "signals-read")
    assert columns[9] == "-" and columns[11] == "-"  # cpu s/1k ev, group
    assert _columns(text, "batch25")[13] == "7"  # errors
    warnings = [line for line in text.splitlines() if line.startswith("WARNING batch25:")]
    assert warnings == [
        "WARNING batch25: 5 requests timed out after 10 s and are missing from the latencies",
        "WARNING batch25: 2 socket errors (connect, read or write)",
        "WARNING batch25: 3 answers were not 2xx",
        "WARNING batch25: 1 of the server's 3 processes exited mid-run: CPU, RSS and group size miss what it had used",
    ]


def test_refusals_are_no_problem_where_they_are_the_point() -> None:
    refused = _row("over-limit", 1600.0, 0.6, 25, non2xx=100)
    refused.expects_2xx = False
    refused.check()
    assert refused.problems == []


def test_a_server_count_outside_the_bench_count_and_what_was_in_flight_is_a_problem() -> None:
    # over-limit once took any refusal (a wrong key's 401) for the rate limit's 429 (helper-106)
    assert disagreement(100, 100, 0, "429 answers") == []
    assert disagreement(164, 100, 64, "429 answers") == []
    assert disagreement(0, 9528, 128, "429 answers") == [
        "the server counted 0 429 answers where the bench counts 9528: the row does not hold"]
    assert disagreement(99, 100, 64, "accepted events")  # fewer than the 2xx answers claim
