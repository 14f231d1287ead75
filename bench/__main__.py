"""`python -m bench`: run the scenarios, print a table, write bench/results/<timestamp>.json.

`--sweep` adds a concurrency sweep of `single` and `batch25` and a chart of it
(bench/results/<timestamp>.png); `soak` holds batch25 at 70% of its measured
maximum rate and watches RSS and file descriptors.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from bench.scenarios import SCENARIOS, Result, run_scenario
from bench.server import ensure_wrk

RESULTS = Path(__file__).parent / "results"
ALL = (*SCENARIOS, "half-rate", "soak")
PACED = ("half-rate", "soak")
SWEEP_SCENARIOS = ("single", "batch25")


def table(results: list[Result], *, ratio_to: str = "baseline") -> str:
    """The run's table.

    `x base`: throughput relative to `ratio_to` in the same run. `+us/req` and
    `+us/ev`: the CPU a request spends above the baseline's, per request and
    per event carried (when every request was answered 2xx): what the pipeline
    costs beyond the HTTP stack, the figure a noisy host moves least.
    """
    reference = next((r for r in results if r.scenario == ratio_to), None)
    head = (f"{'scenario':<14}{'wk':>3}{'conn':>5}{'req/s':>9}{'events/s':>10}{'p50 ms':>8}{'p99 ms':>8}"
            f"{'p99.9':>8}{'cpu ms/req':>11}{'cpu s/1k ev':>12}{'rss MB':>8}{'group':>7}{'non2xx':>8}{'x base':>8}"
            f"{'+us/req':>9}{'+us/ev':>8}")
    lines = [head, "-" * len(head)]
    for r in results:
        ratio = f"{r.requests_per_s / reference.requests_per_s:.2f}" if reference else "-"
        per_request, per_event = _over_baseline(r, reference)
        lines.append(
            f"{r.scenario:<14}{r.workers:>3}{r.connections:>5}{r.requests_per_s:>9.0f}{r.events_per_s:>10.0f}"
            f"{r.p50_ms:>8.1f}{r.p99_ms:>8.1f}{r.p999_ms:>8.1f}{r.cpu_ms_per_request:>11.3f}"
            f"{r.cpu_s_per_1000_events:>12.4f}{r.peak_rss_mb:>8.0f}{r.group_commit_size:>7.1f}"
            f"{r.non2xx:>8}{ratio:>8}{per_request:>9}{per_event:>8}"
        )
    return "\n".join(lines)


def _over_baseline(result: Result, reference: Result | None) -> tuple[str, str]:
    """CPU microseconds above the reference, per request and per event ("-" where meaningless)."""
    if reference is None or result is reference or not result.cpu_is_per_request:
        return "-", "-"
    extra_us = (result.cpu_ms_per_request - reference.cpu_ms_per_request) * 1000
    per_event = extra_us / result.events_per_request if result.events_per_request and not result.non2xx else None
    return f"{extra_us:.0f}", "-" if per_event is None else f"{per_event:.1f}"


def sweep_table(rows: list[Result]) -> str:
    head = f"{'scenario':<10}{'wk':>3}{'conn':>6}{'req/s':>9}{'events/s':>10}{'p50 ms':>8}{'p99 ms':>9}{'non2xx':>8}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r.scenario:<10}{r.workers:>3}{r.connections:>6}{r.requests_per_s:>9.0f}"
                     f"{r.events_per_s:>10.0f}{r.p50_ms:>8.1f}{r.p99_ms:>9.1f}{r.non2xx:>8}")
    return "\n".join(lines)


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("connection counts must be at least 1")
    return values


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenarios", default=",".join(ALL), help=f"comma-separated names ({', '.join(ALL)})")
    parser.add_argument("--duration", type=float, default=10.0, help="measured seconds per scenario")
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--workers", type=int, default=1, help="serve --workers N for every scenario")
    parser.add_argument("--soak-duration", type=float, default=120.0, help="seconds of the soak scenario")
    parser.add_argument("--sweep", action="store_true",
                        help="also sweep single and batch25 over --sweep-connections and chart it")
    parser.add_argument("--sweep-connections", type=_ints, default=[1, 4, 16, 64, 128])
    parser.add_argument("--check", action="store_true", help="2-second smoke of baseline and batch25")
    args = parser.parse_args()
    names = ["baseline", "batch25"] if args.check else [n for n in args.scenarios.split(",") if n]
    duration, warmup = (2.0, 0.0) if args.check else (args.duration, args.warmup)
    unknown = set(names) - set(ALL)
    if unknown:
        parser.error(f"unknown scenarios: {', '.join(sorted(unknown))}; known: {', '.join(ALL)}")
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    wrk = ensure_wrk()
    if args.sweep:
        from bench.chart import ensure_matplotlib

        ensure_matplotlib()  # before any load: a missing chart must not waste a run
    stamp = time.strftime("%Y%m%dT%H%M%S")
    report: dict[str, object] = {"duration": duration, "warmup": warmup, "workers": args.workers,
                                 "connections": args.connections}
    results: list[Result] = []
    for name in [n for n in names if n not in PACED]:
        print(f"running {name} ({duration:.0f} s after {warmup:.0f} s warm-up) ...", flush=True)
        results.append(run_scenario(name, wrk, seconds=duration, warmup=warmup,
                                    connections=args.connections, workers=args.workers))
    batch = next((r for r in results if r.scenario == "batch25"), None)
    if batch is None and any(name in PACED for name in names):
        print("calibrating: batch25 for 5 s to find the maximum rate ...", flush=True)
        batch = run_scenario("batch25", wrk, seconds=5, warmup=1, connections=args.connections,
                             workers=args.workers)
        report["soak_calibration"] = batch.as_dict()
    if "half-rate" in names:
        from bench.soak import run_soak

        assert batch is not None
        print(f"running half-rate ({duration:.0f} s at 50% of {batch.requests_per_s:.0f} req/s) ...", flush=True)
        half, paced = run_soak(wrk, max_rps=batch.requests_per_s, seconds=duration, workers=args.workers,
                               connections=args.connections, load_factor=0.5, scenario="half-rate")
        results.append(half)
        report["half_rate"] = {"target_rps": paced.target_rps, "achieved_rps": paced.achieved_rps,
                               "p99_ms": half.p99_ms, "ok": half.p99_ms < 30.0}
    if "soak" in names:
        from bench.soak import run_soak

        assert batch is not None
        print(f"running soak ({args.soak_duration:.0f} s at 70% of {batch.requests_per_s:.0f} req/s) ...",
              flush=True)
        soak_result, soak = run_soak(wrk, max_rps=batch.requests_per_s, seconds=args.soak_duration,
                                     workers=args.workers, connections=args.connections)
        results.append(soak_result)
        report["soak"] = {**soak.__dict__, "ok": soak.ok, "heap_ok": soak.heap_ok}
    report["results"] = [r.as_dict() for r in results]
    print(table(results))
    if "half_rate" in report:
        half_dict = report["half_rate"]
        assert isinstance(half_dict, dict)
        print(f"half-rate: batch25 at {half_dict['achieved_rps']} req/s (target {half_dict['target_rps']}),"
              f" p99 {half_dict['p99_ms']} ms (target < 30 ms)")
    if "soak" in report:
        soak_dict = report["soak"]
        assert isinstance(soak_dict, dict)
        print(f"soak: target {soak_dict['target_rps']} req/s, achieved {soak_dict['achieved_rps']} req/s;"
              f" RSS {soak_dict['rss_start_mb']} -> {soak_dict['rss_end_mb']} MB"
              f" ({soak_dict['rss_growth_pct']:+.2f}% after {soak_dict['warmup_s']} s warm-up, target < 10%;"
              f" anonymous/heap part {soak_dict['rss_anon_start_mb']} -> {soak_dict['rss_anon_end_mb']} MB,"
              f" {soak_dict['rss_anon_growth_pct']:+.2f}%);"
              f" fds {soak_dict['fds_start']} -> {soak_dict['fds_end']} ({soak_dict['fd_growth']:+d}, target 0)")
    RESULTS.mkdir(exist_ok=True)
    if args.sweep:
        from bench.chart import write_chart

        sweep: list[Result] = []
        for name in SWEEP_SCENARIOS:
            for conns in args.sweep_connections:
                print(f"sweep {name} at {conns} connections ({duration:.0f} s) ...", flush=True)
                sweep.append(run_scenario(name, wrk, seconds=duration, warmup=warmup,
                                          connections=conns, workers=args.workers))
        report["sweep"] = [r.as_dict() for r in sweep]
        print(sweep_table(sweep))
        chart = write_chart(report["sweep"], RESULTS / f"{stamp}.png",  # type: ignore[arg-type]
                            title=f"collector sweep {stamp}, {args.workers} worker(s), {duration:.0f} s per point")
        print(f"wrote {chart}")
    out = RESULTS / f"{stamp}.json"
    out.write_text(json.dumps(report, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
