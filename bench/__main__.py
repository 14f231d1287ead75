"""`python -m bench`: run the scenarios, print a table, write bench/results/<timestamp>.json.

`--sweep` adds a concurrency sweep of `single` and `batch25` and a chart of it
(bench/results/<timestamp>.png); `soak` holds batch25 at 70% of its measured
maximum rate and watches RSS and file descriptors. `--repeat N` runs the
unpaced scenarios N rounds and prints each figure's median (bench/rounds.py);
`python -m bench.compare OLD.json NEW.json` reads two runs side by side, and
`--against REV` serves another git revision beside this tree, scenario by
scenario, and compares them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from bench.revision import UnknownRevision, describe_tree, export
from bench.rounds import by_scenario, ratio_per_round, spread, summary_rows
from bench.scenarios import SCENARIOS, Result, run_scenario
from bench.server import Collector, Interrupted, ensure_wrk, stop_like_ctrl_c

RESULTS = Path(__file__).parent / "results"
ALL = (*SCENARIOS, "half-rate", "soak")
PACED = ("half-rate", "soak")
SWEEP_SCENARIOS = ("single", "batch25")


def table(results: list[Result], *, ratio_to: str = "baseline", ratios: dict[str, float] | None = None,
          spreads: dict[str, float | None] | None = None) -> str:
    """The run's table.

    `x base`: throughput relative to `ratio_to` in the same run. `+us/req` and
    `+us/ev`: the CPU a request spends above the baseline's, per request and
    per event carried (when every request was answered 2xx): what the pipeline
    costs beyond the HTTP stack, the figure a noisy host moves least.
    `errors`: wrk's socket errors and timeouts (a timed-out request is
    missing from the latencies). A WARNING line follows the table for every
    row whose figures cannot be trusted as they stand. Rows summarising
    several rounds (`--repeat`) pass their `ratios` (each the median of the
    per-round ratios) and `spreads` (see bench.rounds), shown as `spread`.
    """
    reference = next((r for r in results if r.scenario == ratio_to), None)
    head = (f"{'scenario':<14}{'wk':>3}{'conn':>5}{'req/s':>9}{'events/s':>10}{'p50 ms':>8}{'p99 ms':>8}"
            f"{'p99.9':>8}{'cpu ms/req':>11}{'cpu s/1k ev':>12}{'rss MB':>8}{'group':>7}{'non2xx':>8}{'errors':>7}"
            f"{'x base':>8}{'+us/req':>9}{'+us/ev':>8}" + (f"{'spread':>8}" if spreads is not None else ""))
    lines = [head, "-" * len(head)]
    for r in results:
        if ratios is not None:
            ratio = f"{ratios[r.scenario]:.2f}" if r.scenario in ratios else "-"
        else:
            ratio = f"{r.requests_per_s / reference.requests_per_s:.2f}" if reference else "-"
        per_request, per_event = _over_baseline(r, reference)
        lines.append(
            f"{r.scenario:<14}{r.workers:>3}{r.connections:>5}{r.requests_per_s:>9.0f}{r.events_per_s:>10.0f}"
            f"{r.p50_ms:>8.1f}{r.p99_ms:>8.1f}{r.p999_ms:>8.1f}{r.cpu_ms_per_request:>11.3f}"
            f"{_figure(r.cpu_s_per_1000_events, '.4f'):>12}{r.peak_rss_mb:>8.0f}{_figure(r.group_commit_size, '.1f'):>7}"
            f"{r.non2xx:>8}{r.socket_errors:>7}{ratio:>8}{per_request:>9}{per_event:>8}"
            + (f"{_percent(spreads.get(r.scenario)):>8}" if spreads is not None else "")
        )
    lines += [f"WARNING {r.scenario}: {problem}" for r in results for problem in r.problems]
    return "\n".join(lines)


def _percent(fraction: float | None) -> str:
    return "-" if fraction is None else f"±{fraction * 100:.0f}%"


def _figure(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


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


@dataclass
class Side:
    """The code one set of servers runs: this tree, or another revision (`--against`)."""

    name: str  # "new" (this tree) or "old" (the revision)
    commit: str
    source: Path | None = None  # None: this tree
    report: dict[str, object] = field(default_factory=dict)
    rounds: list[list[Result]] = field(default_factory=list)
    paced: list[Result] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)

    def tag(self, what: str, both: bool) -> str:
        return f"{what} [{self.name} {self.commit}]" if both else what


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenarios", default=",".join(ALL), help=f"comma-separated names ({', '.join(ALL)})")
    parser.add_argument("--duration", type=float, default=10.0, help="measured seconds per scenario")
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--repeat", type=int, default=1,
                        help="rounds of every unpaced scenario; the table shows each figure's median")
    parser.add_argument("--against", metavar="REV",
                        help="also serve git revision REV, each scenario on both back to back, and compare")
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--workers", type=int, default=1, help="serve --workers N for every scenario")
    parser.add_argument("--soak-duration", type=float, default=120.0, help="seconds of the soak scenario")
    parser.add_argument("--sweep", action="store_true",
                        help="also sweep single and batch25 over --sweep-connections and chart it")
    parser.add_argument("--sweep-connections", type=_ints, default=[1, 4, 16, 64, 128])
    parser.add_argument("--check", action="store_true",
                        help="2-second smoke of baseline and batch25; exits 1 when any answer was not 2xx")
    args = parser.parse_args()
    names = ["baseline", "batch25"] if args.check else [n for n in args.scenarios.split(",") if n]
    duration, warmup = (2.0, 0.0) if args.check else (args.duration, args.warmup)
    unknown = set(names) - set(ALL)
    if unknown:
        parser.error(f"unknown scenarios: {', '.join(sorted(unknown))}; known: {', '.join(ALL)}")
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    if args.connections < 1:
        parser.error("--connections must be at least 1")
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    if args.against is not None and (args.check or args.sweep):
        parser.error("--against compares scenario runs; it does not combine with --check or --sweep")
    repeat = 1 if args.check else args.repeat
    if duration < 1 or args.soak_duration < 1 or warmup < 0:
        parser.error("--duration and --soak-duration must be at least 1 s, --warmup at least 0")
    # Before anything slow (exporting a revision, installing wrk): a stop at
    # any point then ends like Ctrl-C, with every server and temp directory gone.
    stop_like_ctrl_c()
    try:
        with tempfile.TemporaryDirectory(prefix="bench-against-") as tmp:
            sides = [Side("new", describe_tree())]
            if args.against is not None:
                try:
                    commit = export(args.against, Path(tmp))
                except UnknownRevision as exc:
                    parser.error(f"--against: {exc}")
                sides.insert(0, Side("old", commit, Path(tmp)))
            _bench(args, parser, names, duration, warmup, repeat, sides)
    except (KeyboardInterrupt, Interrupted) as stop:
        print(f"\ninterrupted ({str(stop) or 'SIGINT'})", file=sys.stderr, flush=True)
        sys.exit(130)


def _bench(args: argparse.Namespace, parser: argparse.ArgumentParser, names: list[str], duration: float,
           warmup: float, repeat: int, sides: list[Side]) -> None:
    wrk = ensure_wrk()
    if args.sweep:
        from bench.chart import ensure_matplotlib

        ensure_matplotlib()  # before any load: a missing chart must not waste a run
    ignored = Collector.ignored_settings()
    if ignored:
        print(f"note: the servers run on their defaults; not passed on: {', '.join(ignored)}", flush=True)
    stamp = time.strftime("%Y%m%dT%H%M%S")
    paths = {side.name: RESULTS / (f"{stamp}-old-{side.commit}.json" if side.source is not None else f"{stamp}.json")
             for side in sides}
    for side in sides:
        if len(sides) > 1:  # each file names the revision it was compared with and its partner file
            partner = next(other for other in sides if other is not side)
            side.report["against"] = {"rev": args.against, "old_commit": sides[0].commit,
                                      "new_commit": sides[1].commit, "partner": paths[partner.name].name}
        side.report.update({"duration": duration, "warmup": warmup, "workers": args.workers,
                            "connections": args.connections, "repeat": repeat, "commit": side.commit,
                            "python": sys.version.split()[0], "ignored_settings": ignored, "failed": side.failed})
    interrupted = ""
    try:
        _run(args, names, wrk, duration, warmup, repeat, sides)
    except (KeyboardInterrupt, Interrupted) as stop:
        interrupted = str(stop) or "SIGINT"
        print(f"\ninterrupted ({interrupted}): the scenarios that finished follow", file=sys.stderr, flush=True)
    RESULTS.mkdir(exist_ok=True)
    both = len(sides) > 1
    problems = False
    for side in sides:
        report = side.report
        if interrupted:
            report["interrupted"] = interrupted
        results = summary_rows(side.rounds) + side.paced
        problems = problems or any(r.problems for r in results)
        report["results"] = [r.as_dict() for r in results]
        if both:
            print(f"\n{side.name}: {side.commit}" + (" (this tree)" if side.source is None else ""))
        if repeat > 1:
            ratios, spreads = _round_figures(side.rounds, results)
            report["rounds"] = [[r.as_dict() for r in results_of_round] for results_of_round in side.rounds]
            report["ratios"], report["spreads"] = ratios, spreads
            ran = sum(1 for results_of_round in side.rounds if results_of_round)
            if ran:  # a run of paced scenarios only has no rounds to take medians of
                print(f"medians of {ran} rounds; x base: the median of each round's ratio")
            if results:
                print(table(results, ratios=ratios, spreads=spreads))
        elif results:
            print(table(results))
            # the table's `x base`, in the file too (a run with --repeat stores its medians)
            reference = next((r for r in results if r.scenario == "baseline"), None)
            if reference is not None and reference.requests_per_s:
                report["ratios"] = {r.scenario: round(r.requests_per_s / reference.requests_per_s, 3)
                                    for r in results if r.scenario not in PACED}
        _print_paced(report)
        if args.sweep and "sweep" in report and not interrupted:
            from bench.chart import write_chart

            chart = write_chart(report["sweep"], RESULTS / f"{stamp}.png",  # type: ignore[arg-type]
                                title=f"collector sweep {stamp}, {args.workers} worker(s), {duration:.0f} s per point")
            print(f"wrote {chart}")
        out = paths[side.name]
        out.write_text(json.dumps(report, indent=2))
        print(f"wrote {out}")
        side.report["path"] = str(out)
    if both:
        from bench.compare import Run, compare

        old, new = sides
        print()
        print(compare(Run(Path(str(old.report["path"])), old.report), Run(Path(str(new.report["path"])), new.report)))
    failed = {side.tag(name, both): error for side in sides for name, error in side.failed.items()}
    for name, error in failed.items():
        print(f"FAILED {name}: {error}", file=sys.stderr)
    if interrupted:
        sys.exit(130)
    if failed or (args.check and problems):
        sys.exit(1)


def _round_figures(rounds: list[list[Result]], results: list[Result]) -> tuple[dict[str, float], dict[str, float | None]]:
    """Per scenario: the median of its per-round ratios to the baseline, and its requests/s spread.

    A paced row (run once) is relative to the baseline's median, as in a single run.
    """
    runs = by_scenario(rounds)
    ratios: dict[str, float] = {}
    for name in runs:
        per_round = ratio_per_round(rounds, name)
        if per_round:
            ratios[name] = statistics.median(per_round)
    baseline = next((r for r in results if r.scenario == "baseline"), None)
    for r in results:
        if r.scenario not in runs and baseline is not None and baseline.requests_per_s > 0:
            ratios[r.scenario] = r.requests_per_s / baseline.requests_per_s
    spreads = {name: spread([r.requests_per_s for r in scenario_runs]) for name, scenario_runs in runs.items()}
    return ratios, spreads


def _run(args: argparse.Namespace, names: list[str], wrk: str, duration: float, warmup: float, repeat: int,
         sides: list[Side]) -> None:
    """Every scenario in turn (`repeat` rounds of the unpaced ones); one that fails is reported and the run goes on.

    With two sides each scenario runs on both back to back, the first of the
    pair alternating from round to round, so that a slow phase of the host
    falls on both alike.
    """
    both = len(sides) > 1

    def attempt(side: Side, name: str, run: Callable[[], Result]) -> Result | None:
        try:
            return run()
        except Exception as exc:  # noqa: BLE001 (a failed scenario must not lose the others)
            side.failed[name] = f"{type(exc).__name__}: {exc}"
            print(f"  {side.tag(name, both)} failed: {side.failed[name]}", file=sys.stderr, flush=True)
            return None

    unpaced = [n for n in names if n not in PACED]
    for number in range(1, repeat + 1):
        for side in sides:
            side.rounds.append([])
        label = f"round {number}/{repeat}: " if repeat > 1 else ""
        order = sides if number % 2 else sides[::-1]
        for name in unpaced:
            for side in order:
                print(f"{label}running {side.tag(name, both)} ({duration:.0f} s after {warmup:.0f} s warm-up) ...",
                      flush=True)
                result = attempt(side, name if repeat == 1 else f"{name} (round {number})",
                                 partial(run_scenario, name, wrk, seconds=duration, warmup=warmup,
                                         connections=args.connections, workers=args.workers, source=side.source))
                if result is not None:
                    side.rounds[-1].append(result)
    if any(name in PACED for name in names):
        _run_paced(args, names, wrk, duration, sides, attempt)
    if args.sweep:
        _run_sweep(args, wrk, duration, warmup, sides[0])


def _run_paced(args: argparse.Namespace, names: list[str], wrk: str, duration: float, sides: list[Side],
               attempt: Callable[[Side, str, Callable[[], Result]], Result | None]) -> None:
    """half-rate and soak, paced from the median batch25 (or a 5 s calibration run).

    With two sides both are paced at the same rate, the lower of their two
    batch25 figures, and each paced scenario runs on both back to back: a
    latency measured at different offered loads, or minutes apart on this
    host, would compare the pacing and the host rather than the code.
    """
    from bench.soak import LOAD_FACTOR, run_soak

    both = len(sides) > 1
    rates: list[tuple[float, bool, str]] = []  # (requests/s, flagged, whose)
    unmeasured: list[Side] = []  # sides paced at another's rate: theirs is unknown
    for side in sides:
        batch = next((row for row in summary_rows(side.rounds) if row.scenario == "batch25"), None)
        whose = side.tag("batch25", both)
        if batch is None:
            print(f"calibrating{' ' + side.tag('', both).strip() if both else ''}: batch25 for 5 s to find the"
                  " maximum rate ...", flush=True)
            batch = attempt(side, "calibration", partial(run_scenario, "batch25", wrk, seconds=5, warmup=1,
                                                         connections=args.connections, workers=args.workers,
                                                         source=side.source))
            whose = side.tag("calibration", both)
            if batch is not None:
                side.report["soak_calibration"] = batch.as_dict()
        if batch is not None and batch.requests_per_s > 0:
            rates.append((batch.requests_per_s, bool(batch.problems), whose))
        else:
            unmeasured.append(side)
    wanted = [name for name in PACED if name in names]
    if not rates:
        for side in sides:
            for name in wanted:
                side.failed.setdefault(name, "no batch25 rate to pace from (it failed or answered nothing)")
        return
    # The lower rate paces both sides: a pace above a side's own maximum would
    # measure an overloaded server. When that rate comes from a row its run
    # flagged, the paced rows are flagged too, so no verdict rests on them.
    max_rps, flagged, whose = min(rates)
    pace = {"max_rps": max_rps, "from": whose, "from_flagged_row": flagged}
    if flagged:
        print(f"WARNING: pacing from {whose}, whose row is flagged: the paced rows are flagged too", flush=True)
    for side in sides:
        side.report["paced_from"] = pace
    plans = [("half-rate", 0.5, duration), ("soak", LOAD_FACTOR, args.soak_duration)]
    for number, (name, load, seconds) in enumerate(p for p in plans if p[0] in wanted):
        for side in sides if number % 2 == 0 else sides[::-1]:
            print(f"running {side.tag(name, both)} ({seconds:.0f} s at {load:.0%} of {max_rps:.0f} req/s) ...",
                  flush=True)
            try:
                row, paced = run_soak(wrk, max_rps=max_rps, seconds=seconds, workers=args.workers,
                                      connections=args.connections, load_factor=load, scenario=name,
                                      source=side.source)
            except Exception as exc:  # noqa: BLE001 (a failed scenario must not lose the others)
                side.failed[name] = f"{type(exc).__name__}: {exc}"
                print(f"  {side.tag(name, both)} failed: {side.failed[name]}", file=sys.stderr, flush=True)
                continue
            if flagged:
                row.problems.append(f"paced from {whose}, a row flagged for its own problems")
            if side in unmeasured:
                row.problems.append(f"paced from {whose}: this side's own maximum was not measured")
            side.paced.append(row)
            if name == "half-rate":
                side.report["half_rate"] = {"target_rps": paced.target_rps, "achieved_rps": paced.achieved_rps,
                                            "p99_ms": row.p99_ms, "ok": row.p99_ms < 30.0 and not row.problems}
            else:
                side.report["soak"] = {**paced.__dict__, "ok": paced.ok and not row.problems,
                                       "vmrss_ok": paced.vmrss_ok}


def _run_sweep(args: argparse.Namespace, wrk: str, duration: float, warmup: float, side: Side) -> None:
    sweep: list[Result] = []
    side.report["sweep"] = []
    for name in SWEEP_SCENARIOS:
        for conns in args.sweep_connections:
            print(f"sweep {name} at {conns} connections ({duration:.0f} s) ...", flush=True)
            try:
                point = run_scenario(name, wrk, seconds=duration, warmup=warmup, connections=conns,
                                     workers=args.workers)
            except Exception as exc:  # noqa: BLE001 (a failed point must not lose the others)
                side.failed[f"sweep {name} {conns}"] = f"{type(exc).__name__}: {exc}"
                print(f"  sweep {name} {conns} failed: {side.failed[f'sweep {name} {conns}']}", file=sys.stderr,
                      flush=True)
                continue
            sweep.append(point)
            side.report["sweep"] = [r.as_dict() for r in sweep]
    print(sweep_table(sweep))


def _print_paced(report: dict[str, object]) -> None:
    half = report.get("half_rate")
    if isinstance(half, dict):
        print(f"half-rate: batch25 at {half['achieved_rps']} req/s (target {half['target_rps']}),"
              f" p99 {half['p99_ms']} ms (target < 30 ms)")
    soak = report.get("soak")
    if isinstance(soak, dict):
        print(f"soak: target {soak['target_rps']} req/s, achieved {soak['achieved_rps']} req/s;"
              f" heap (RssAnon) {soak['rss_anon_start_mb']} -> {soak['rss_anon_end_mb']} MB"
              f" ({soak['rss_anon_growth_pct']:+.2f}% after {soak['warmup_s']} s warm-up, target < 10%);"
              f" fds {soak['fds_start']} -> {soak['fds_end']} ({soak['fd_growth']:+d}, target 0);"
              f" VmRSS {soak['rss_start_mb']} -> {soak['rss_end_mb']} MB ({soak['rss_growth_pct']:+.2f}%,"
              " mostly LMDB's mapped pages, which come and go)")


if __name__ == "__main__":
    main()
