"""`python -m bench`: run the scenarios, print a table, write bench/results/<timestamp>.json."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from bench.scenarios import SCENARIOS, Result, run_scenario
from bench.server import ensure_wrk

RESULTS = Path(__file__).parent / "results"


def table(results: list[Result]) -> str:
    base = next((r.requests_per_s for r in results if r.scenario == "baseline"), 0.0)
    head = (f"{'scenario':<14}{'conn':>5}{'req/s':>9}{'events/s':>10}{'p50 ms':>8}{'p99 ms':>8}"
            f"{'p99.9':>8}{'cpu ms/req':>11}{'cpu s/1k ev':>12}{'rss MB':>8}{'group':>7}{'non2xx':>8}{'x base':>8}")
    lines = [head, "-" * len(head)]
    for r in results:
        ratio = f"{r.requests_per_s / base:.2f}" if base else "-"
        lines.append(
            f"{r.scenario:<14}{r.connections:>5}{r.requests_per_s:>9.0f}{r.events_per_s:>10.0f}"
            f"{r.p50_ms:>8.1f}{r.p99_ms:>8.1f}{r.p999_ms:>8.1f}{r.cpu_ms_per_request:>11.3f}"
            f"{r.cpu_s_per_1000_events:>12.4f}{r.peak_rss_mb:>8.0f}{r.group_commit_size:>7.1f}"
            f"{r.non2xx:>8}{ratio:>8}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated names")
    parser.add_argument("--duration", type=float, default=10.0, help="measured seconds per scenario")
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--check", action="store_true", help="2-second smoke of baseline and batch25")
    args = parser.parse_args()
    names = ["baseline", "batch25"] if args.check else args.scenarios.split(",")
    duration, warmup = (2.0, 0.0) if args.check else (args.duration, args.warmup)
    unknown = set(names) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenarios: {', '.join(sorted(unknown))}; known: {', '.join(SCENARIOS)}")
    wrk = ensure_wrk()
    results = []
    for name in names:
        print(f"running {name} ({duration:.0f} s after {warmup:.0f} s warm-up) ...", flush=True)
        results.append(run_scenario(name, wrk, seconds=duration, warmup=warmup, connections=args.connections))
    print(table(results))
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"{time.strftime('%Y%m%dT%H%M%S')}.json"
    out.write_text(json.dumps({"duration": duration, "results": [r.as_dict() for r in results]}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
