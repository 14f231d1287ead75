"""`python -m bench.compare OLD.json NEW.json`: two bench runs, scenario by scenario.

For each scenario both runs measured: requests/s, the ratio to the baseline of
the same run (`x base`), p99 and server CPU per request, old then new, with the
change. The verdict says whether the change stands out from the runs' own
noise: when both runs have at least three rounds (`python -m bench --repeat 3`),
a scenario is `faster` or `slower` only when the ranges of its per-round ratios
(requests/s for the baseline itself) do not overlap, and `noise` when they do.
That is a rank test at its extreme: two runs of identical code, n and m
rounds, fail to overlap by chance once in C(n+m, n)/2 comparisons (1 in 10 for
3 and 3, 1 in 126 for 5 and 5); the output says which, for each row. The `cpu`
column applies the same test to server CPU per request (`less`, `more`,
`noise`), which needs no baseline: a change to the HTTP stack moves the
baseline and so every row's ratio. Fewer rounds cannot
tell noise from change: their verdict is `?`, as for the paced `half-rate` and
`soak` (run once; their rate is the pace the bench set, so only their p99 and
CPU compare). A row either run flagged (its own table's WARNING: errors,
refusals, a lost process) is `untrusted`, its warnings repeated beneath; an
interrupted run, failed scenarios and differing settings are named at the top.
A file that is not a bench result is refused with one line and exit 2.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SETTINGS = ("workers", "connections", "duration", "warmup")
FIGURES = ("requests_per_s", "p99_ms", "cpu_ms_per_request")
PACED = ("half-rate", "soak")  # run at a rate the bench sets: compare their p99 and CPU, not their rate
MIN_ROUNDS = 3  # with 2 and 2, identical code would be called faster or slower 1 time in 3


def _is_number(value: object) -> bool:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)  # 1e400 reads as inf: no bench writes it
    except OverflowError:  # an integer past a float's range
        return False


def _not_json(constant: str) -> float:
    """NaN and Infinity: Python's json reads them, no bench writes them, and they compare as nonsense."""
    raise ValueError(f"{constant} is not a JSON number")


class Run:
    """One bench JSON: its summary rows and, with --repeat, each round's rows."""

    def __init__(self, path: Path, report: dict[str, Any]) -> None:
        self.path = path
        self.report = report
        self.rows: dict[str, dict[str, Any]] = {row["scenario"]: row for row in report.get("results", [])}
        self.rounds: list[dict[str, dict[str, Any]]] = [
            {row["scenario"]: row for row in results} for results in report.get("rounds", [])
        ]

    @classmethod
    def load(cls, path: Path) -> Run:
        try:
            report = json.loads(path.read_text(), parse_constant=_not_json)
            # A lone surrogate escape ("\\ud800") decodes but cannot be printed.
            json.dumps(report, ensure_ascii=False).encode()
        except OSError as exc:
            raise ValueError(f"{path}: {exc.strerror}") from None
        except (ValueError, RecursionError) as exc:  # bad JSON or UTF-8, an absurd number or nesting
            raise ValueError(f"{path}: not a bench result ({str(exc) or type(exc).__name__})") from None
        if not isinstance(report, dict) or not isinstance(report.get("results"), list):
            raise ValueError(f"{path}: not a bench result (no results list)")
        rounds = report.get("rounds", [])
        if not isinstance(rounds, list) or not all(isinstance(r, list) for r in rounds):
            raise ValueError(f"{path}: not a bench result (rounds is not a list of lists)")
        for row in [*report["results"], *(row for results in rounds for row in results)]:
            if not (isinstance(row, dict) and isinstance(row.get("scenario"), str)
                    and all(_is_number(row.get(name)) for name in FIGURES)):
                raise ValueError(f"{path}: not a bench result (a row lacks scenario, {', '.join(FIGURES)})")
            if not isinstance(row.get("problems", []), list):
                raise ValueError(f"{path}: not a bench result (a row's problems are not a list)")
        if not isinstance(report.get("failed", {}), dict) or not isinstance(report.get("interrupted", ""), str):
            raise ValueError(f"{path}: not a bench result (failed is not an object or interrupted not a string)")
        for paced in ("half_rate", "soak"):
            figures = report.get(paced, {})
            if not isinstance(figures, dict) or not _is_number(figures.get("target_rps", 0)):
                raise ValueError(f"{path}: not a bench result ({paced} has no finite target_rps)")
        ratios = report.get("ratios", {})
        if not isinstance(ratios, dict) or not all(_is_number(v) for v in ratios.values()):
            raise ValueError(f"{path}: not a bench result (ratios are not numbers)")
        return cls(path, report)

    def ratio(self, scenario: str) -> float | None:
        """The scenario's x base: the run's own median ratio when it has rounds, else from its rows."""
        ratios = self.report.get("ratios")
        if isinstance(ratios, dict) and scenario in ratios:
            return float(ratios[scenario])
        base, row = self.rows.get("baseline"), self.rows.get(scenario)
        if base is None or row is None or not base["requests_per_s"]:
            return None
        return float(row["requests_per_s"]) / float(base["requests_per_s"])

    def per_round(self, scenario: str) -> list[float]:
        """What the verdict compares, in each round: requests/s for the baseline, else the ratio to it."""
        values = []
        for rows in self.rounds:
            row, base = rows.get(scenario), rows.get("baseline")
            if row is None:
                continue
            if scenario == "baseline":
                values.append(float(row["requests_per_s"]))
            elif base is not None and base["requests_per_s"]:
                values.append(float(row["requests_per_s"]) / float(base["requests_per_s"]))
        return values

    def cpu_per_round(self, scenario: str) -> list[float]:
        """The scenario's server CPU per request in each round (absolute: no ratio to take)."""
        return [float(rows[scenario]["cpu_ms_per_request"]) for rows in self.rounds if scenario in rows]

    def pace(self, scenario: str) -> float | None:
        """The req/s a paced scenario was driven at (its target), when the run recorded it."""
        figures = self.report.get({"half-rate": "half_rate", "soak": "soak"}.get(scenario, ""))
        target = figures.get("target_rps") if isinstance(figures, dict) else None
        return float(target) if isinstance(target, int | float) and _is_number(target) else None

    def problems(self, scenario: str) -> list[str]:
        """Why the run's own table flagged the scenario's row (timeouts, errors, refusals, a lost process)."""
        row = self.rows.get(scenario) or {}
        return [str(problem) for problem in row.get("problems", [])]

    def rounds_run(self) -> int:
        return sum(1 for rows in self.rounds if rows) if self.rounds else 1

    def warnings(self, side: str) -> list[str]:
        r, out = self.report, []
        if r.get("interrupted"):
            out.append(f"WARNING: the {side} run was interrupted ({r['interrupted']}): its rows hold what finished")
        failed = r.get("failed")
        if isinstance(failed, dict) and failed:
            out.append(f"WARNING: in the {side} run, these failed: {', '.join(map(str, failed))}")
        return out

    def label(self) -> str:
        r = self.report
        rounds = f"{self.rounds_run()} round(s)" if self.rounds_run() else "paced scenarios only"
        return (f"{self.path.name}: commit {r.get('commit') or '?'}, {rounds},"
                f" {r.get('workers', '?')} worker(s), {r.get('connections', '?')} connections,"
                f" {r.get('duration', '?')} s")


def verdict(old: Sequence[float], new: Sequence[float]) -> str:
    """`faster`/`slower` when the per-round ranges do not overlap, `noise` when they do, `?` under MIN_ROUNDS."""
    if len(old) < MIN_ROUNDS or len(new) < MIN_ROUNDS:
        return "?"
    if min(new) > max(old):
        return "faster"
    if max(new) < min(old):
        return "slower"
    return "noise"


def cpu_verdict(old: Sequence[float], new: Sequence[float]) -> str:
    """The same test on CPU per request: `less` or `more` beyond the rounds' noise."""
    return {"faster": "more", "slower": "less"}.get(verdict(old, new), verdict(old, new))


def _one_in(n: int, m: int) -> str:
    """C(n+m, n)/2, the odds of a false call; as a power of ten once it is too long to read."""
    if n + m <= 40:
        return str(math.comb(n + m, n) // 2)
    digits = (math.lgamma(n + m + 1) - math.lgamma(n + 1) - math.lgamma(m + 1) - math.log(2)) / math.log(10)
    return f"10^{digits:.0f}"


def _change(old: float | None, new: float | None) -> str:
    if old is None or new is None or not old:
        return "-"
    return f"{(new - old) / old * 100:+.0f}%"


def _num(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def compare(old: Run, new: Run) -> str:
    lines = [f"old  {old.label()}", f"new  {new.label()}", *old.warnings("old"), *new.warnings("new")]
    for name in SETTINGS:
        if old.report.get(name) != new.report.get(name):
            lines.append(f"WARNING: the runs differ in {name} ({old.report.get(name)} vs {new.report.get(name)}):"
                         " read the changes with care")
    head = (f"{'scenario':<14}{'req/s old':>10}{'new':>8}{'change':>8}{'x base old':>11}{'new':>6}{'change':>8}"
            f"{'p99 old':>9}{'new':>8}{'cpu ms/req old':>15}{'new':>7}{'change':>8}{'cpu':>7}{'verdict':>10}")
    lines += [head, "-" * len(head)]
    flagged: list[str] = []
    for scenario, before in old.rows.items():
        after = new.rows.get(scenario)
        if after is None:
            continue
        rps_old, rps_new = float(before["requests_per_s"]), float(after["requests_per_s"])
        cpu_old, cpu_new = float(before["cpu_ms_per_request"]), float(after["cpu_ms_per_request"])
        ratio_old, ratio_new = old.ratio(scenario), new.ratio(scenario)
        problems = [f"{side}: {problem}" for side, run in (("old", old), ("new", new)) for problem in run.problems(scenario)]
        # A row its own run flagged (errors, refusals, a lost process) is no evidence either way.
        call = "untrusted" if problems else verdict(old.per_round(scenario), new.per_round(scenario))
        # No cpu call where CPU also counts load beside the requests (signals-read: the ingest next to
        # the reads), as in the run's own table; a summary row carries its rounds' flag.
        not_per_request = any(run.rows[scenario].get("cpu_is_per_request") is False for run in (old, new))
        cpu_call = ("-" if problems or not_per_request
                    else cpu_verdict(old.cpu_per_round(scenario), new.cpu_per_round(scenario)))
        flagged += [f"WARNING {scenario}: {problem}" for problem in problems]
        # A paced row's rate is the pace the bench set, not what the code reached: its changes say nothing.
        paced = scenario in PACED
        lines.append(
            f"{scenario:<14}{rps_old:>10.0f}{rps_new:>8.0f}{'-' if paced else _change(rps_old, rps_new):>8}"
            f"{_num(ratio_old, '.2f'):>11}{_num(ratio_new, '.2f'):>6}"
            f"{'-' if paced else _change(ratio_old, ratio_new):>8}"
            f"{float(before['p99_ms']):>9.1f}{float(after['p99_ms']):>8.1f}"
            f"{cpu_old:>15.3f}{cpu_new:>7.3f}{_change(cpu_old, cpu_new):>8}{cpu_call:>7}{call:>10}"
        )
    lines += flagged
    paced_seen = [name for name in PACED if name in old.rows and name in new.rows]
    for name in paced_seen:
        pace_old, pace_new = old.pace(name), new.pace(name)
        if pace_old and pace_new and abs(pace_new - pace_old) > 0.05 * pace_old:
            lines.append(f"WARNING {name}: paced at {pace_old:.0f} and {pace_new:.0f} req/s: its p99 and CPU were"
                         " taken at different loads and do not compare")
    if paced_seen:
        lines.append(f"{', '.join(paced_seen)}: paced at a rate the bench set (with --against, one rate for both"
                     " sides), so their req/s and x base changes are shown as -; read their p99 and CPU")
    only = sorted(set(old.rows) ^ set(new.rows))
    if only:
        lines.append(f"measured in one run only: {', '.join(only)}")
    n, m = old.rounds_run() if old.rounds else 0, new.rounds_run() if new.rounds else 0
    if min(n, m) >= MIN_ROUNDS:
        lines.append("verdict: faster/slower when the per-round ranges of x base (req/s for baseline) do not"
                     f" overlap, noise when they do; between identical code, {n} and {m} rounds give faster"
                     f" or slower by chance 1 time in {_one_in(n, m)} for each row and verdict column;"
                     f" ? where a row has fewer than {MIN_ROUNDS} rounds a side (half-rate and soak run once);"
                     " untrusted where either run flagged the row. x base is relative to the same tree's"
                     " baseline: a change to the HTTP stack the baseline measures moves it for every row, so"
                     " read it beside `cpu`, the same test on server CPU per request (less/more/noise),"
                     " which is absolute (on a saturated worker, close to the inverse of req/s); `-` where"
                     " the row is flagged or its CPU counts other load (signals-read)")
    else:
        lines.append(f"verdict ?: fewer than {MIN_ROUNDS} rounds a side cannot tell a change from this host's"
                     " noise; run both with --repeat 3 (or 5)")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("old", type=Path, help="the earlier run's bench/results/<timestamp>.json")
    parser.add_argument("new", type=Path, help="the later run's JSON")
    args = parser.parse_args(argv)
    try:
        old, new = Run.load(args.old), Run.load(args.new)
    except ValueError as exc:
        print(f"python -m bench.compare: {exc}", file=sys.stderr)
        return 2
    print(compare(old, new))
    return 0


if __name__ == "__main__":
    sys.exit(main())
