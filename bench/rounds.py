"""Several rounds of the same scenarios, read as one row each (`--repeat N`).

On a shared or virtual host one 10-second run of a scenario can land in a slow
phase and move 20-40% on its own. The issue's reference figures are medians of
three runs, so the bench can take them the same way: every round runs every
scenario once, in order, and each figure of the summary row is its median over
the rounds. The ratio to the baseline is taken within each round first (the two
ran seconds apart, so a slow phase tends to slow both) and then its median is
kept. `spread` says how far the rounds disagreed: half the range of a
scenario's requests/s, relative to its median.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import replace

from bench.scenarios import Result

MEDIAN_FIGURES = (
    "requests_per_s", "events_per_s", "p50_ms", "p99_ms", "p999_ms", "cpu_ms_per_request", "peak_rss_mb",
)  # fmt: skip
SUMMED_COUNTS = ("non2xx", "socket_errors", "timeouts")


def _median_or_none(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if len(known) == len(values) else None


def summarise(runs: Sequence[Result], numbers: Sequence[int] | None = None, of: int | None = None) -> Result:
    """One row for one scenario's rounds: medians of the figures, sums of the counts, every problem kept.

    `numbers`: the round each run came from (default 1, 2, ...), so that a
    problem names its real round when another round failed; `of`: how many
    rounds ran, so that a row measured in fewer says so.
    """
    if not runs:
        raise ValueError("no runs to summarise")
    numbers = list(numbers) if numbers is not None else list(range(1, len(runs) + 1))
    missing = [f"measured in {len(runs)} of {of} rounds"] if of is not None and len(runs) < of else []
    if len(runs) == 1 and (of is None or of == 1):
        return runs[0]  # a single run: its row as it stands
    first = runs[0]
    figures: dict[str, object] = {name: statistics.median(getattr(r, name) for r in runs) for name in MEDIAN_FIGURES}
    figures["cpu_s_per_1000_events"] = _median_or_none([r.cpu_s_per_1000_events for r in runs])
    figures["group_commit_size"] = _median_or_none([r.group_commit_size for r in runs])
    for name in SUMMED_COUNTS:
        figures[name] = sum(getattr(r, name) for r in runs)
    problems = missing + [f"round {n}: {problem}" for n, r in zip(numbers, runs, strict=True) for problem in r.problems]
    # A note may quote figures of its own round (signals-read's ingest beside the reads).
    note = f"round {numbers[0]}: {first.note}" if first.note else ""
    return replace(first, problems=problems, note=note, **figures)  # type: ignore[arg-type]


def summary_rows(rounds: Sequence[Sequence[Result]]) -> list[Result]:
    """One row per scenario, problems named by their real round.

    A round with no result at all (interrupted before its first scenario
    finished, or every scenario failed: both reported on their own) does not
    count among the rounds a row is said to miss.
    """
    ran = sum(1 for results in rounds if results)
    rows = []
    for name in by_scenario(rounds):
        numbered = [(n, r) for n, results in enumerate(rounds, 1) for r in results if r.scenario == name]
        rows.append(summarise([r for _, r in numbered], [n for n, _ in numbered], of=ran))
    return rows


def ratio_per_round(rounds: Sequence[Sequence[Result]], scenario: str, reference: str = "baseline") -> list[float]:
    """The scenario's requests/s over the reference's, in each round that ran both."""
    ratios = []
    for results in rounds:
        ours = next((r for r in results if r.scenario == scenario), None)
        base = next((r for r in results if r.scenario == reference), None)
        if ours is not None and base is not None and base.requests_per_s > 0:
            ratios.append(ours.requests_per_s / base.requests_per_s)
    return ratios


def spread(values: Sequence[float]) -> float | None:
    """Half the range of `values` relative to their median, as a fraction; None for fewer than two."""
    if len(values) < 2:
        return None
    middle = statistics.median(values)
    return (max(values) - min(values)) / 2 / middle if middle else None


def by_scenario(rounds: Sequence[Sequence[Result]]) -> dict[str, list[Result]]:
    """Each scenario's results across the rounds, in the order the scenarios first ran."""
    runs: dict[str, list[Result]] = {}
    for results in rounds:
        for result in results:
            runs.setdefault(result.scenario, []).append(result)
    return runs
