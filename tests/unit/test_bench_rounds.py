"""Several rounds read as one row (`--repeat`), and two runs compared (`python -m bench.compare`)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from bench.__main__ import _round_figures, table
from bench.compare import Run, compare, main, verdict
from bench.rounds import by_scenario, ratio_per_round, spread, summarise, summary_rows
from bench.scenarios import Result


def _row(scenario: str, rps: float, *, p99: float = 2.0, cpu: float = 1.0, group: float | None = 10.0,
         problems: list[str] | None = None) -> Result:
    return Result(scenario=scenario, connections=64, requests_per_s=rps, events_per_s=rps * 25, p50_ms=1.0,
                  p99_ms=p99, p999_ms=3.0, cpu_s_per_1000_events=0.04, cpu_ms_per_request=cpu,
                  peak_rss_mb=100.0, group_commit_size=group, non2xx=0, socket_errors=1, events_per_request=25,
                  problems=problems or [])


def test_each_figure_is_its_median_and_counts_and_problems_add_up() -> None:
    runs = [_row("batch25", 800, p99=90, cpu=1.2), _row("batch25", 600, p99=300, cpu=1.5, problems=["slow"]),
            _row("batch25", 700, p99=100, cpu=1.1, group=None)]
    row = summarise(runs)
    assert (row.requests_per_s, row.events_per_s, row.p99_ms, row.cpu_ms_per_request) == (700, 17500, 100, 1.2)
    assert row.group_commit_size is None  # not measured in one round: no median of the others
    assert row.socket_errors == 3
    assert row.problems == ["round 2: slow"]
    assert runs[1].problems == ["slow"]  # the rounds' own rows are left as they were
    assert summarise(runs[:1]) is runs[0]


def test_the_ratio_is_taken_within_each_round_then_its_median() -> None:
    rounds = [[_row("baseline", 3000), _row("batch25", 900)],
              [_row("baseline", 2000), _row("batch25", 620)],  # a slow phase slows both
              [_row("baseline", 3300), _row("batch25", 1000)]]
    assert ratio_per_round(rounds, "batch25") == pytest.approx([0.3, 0.31, 1000 / 3300])
    results = [summarise(runs) for runs in by_scenario(rounds).values()]
    ratios, spreads = _round_figures(rounds, results)
    assert ratios["batch25"] == pytest.approx(1000 / 3300)  # the median round's, not 900 / 3000
    assert spreads["batch25"] == pytest.approx((1000 - 620) / 2 / 900)
    assert spread([5.0]) is None
    text = table(results, ratios=ratios, spreads=spreads)
    assert text.splitlines()[0].split()[-1] == "spread"
    assert next(line for line in text.splitlines() if line.startswith("batch25")).split()[-4:] == [
        "0.30", "0", "0.0", "±21%"]


def _report(path: Path, per_round: list[tuple[float, float]], **settings: object) -> Path:
    # batch25's CPU per request falls as its rate rises; the baseline's stays put.
    rounds = [[_row("baseline", base).as_dict(), _row("batch25", batch, cpu=1000 / batch).as_dict()]
              for base, batch in per_round]
    results = [summarise([_row("baseline", b) for b, _ in per_round]).as_dict(),
               summarise([_row("batch25", b, cpu=1000 / b) for _, b in per_round]).as_dict()]
    report: dict[str, object] = {"results": results, "commit": "abc1234", "repeat": len(per_round),
                                 "workers": 1, "connections": 64, "duration": 10.0, "warmup": 2.0, **settings}
    if len(per_round) > 1:
        report["rounds"] = rounds
    path.write_text(json.dumps(report))
    return path


def _verdicts(text: str) -> dict[str, str]:
    return {line.split()[0]: line.split()[-1] for line in text.splitlines() if line.split()[0] in ("baseline", "batch25")}


def test_compare_calls_a_change_only_beyond_the_rounds_noise(tmp_path: Path) -> None:
    old = Run.load(_report(tmp_path / "old.json", [(3000, 800), (2500, 700), (3200, 820)]))
    faster = Run.load(_report(tmp_path / "new.json", [(3100, 1100), (2600, 950), (3000, 1050)]))
    assert _verdicts(compare(old, faster)) == {"baseline": "noise", "batch25": "faster"}
    assert _verdicts(compare(faster, old)) == {"baseline": "noise", "batch25": "slower"}
    # The same test on CPU per request, which no baseline divides: less, more, noise.
    cpu = {line.split()[0]: line.split()[-2] for line in compare(old, faster).splitlines()
           if line.split()[0] in ("baseline", "batch25")}
    assert cpu == {"baseline": "noise", "batch25": "less"}
    assert "batch25" in compare(faster, old) and " more " in compare(faster, old)
    single = Run.load(_report(tmp_path / "one.json", [(3000, 1200)]))
    text = compare(old, single)
    assert _verdicts(text) == {"baseline": "?", "batch25": "?"}
    assert "run both with --repeat 3 (or 5)" in text
    line = next(line for line in text.splitlines() if line.startswith("batch25"))
    assert line.split()[1:4] == ["800", "1200", "+50%"]
    assert verdict([1.0, 2.0, 1.5], [2.0, 3.0, 2.5]) == "noise"  # touching ranges are no evidence
    # Two rounds a side: identical code would be called faster or slower 1 time in 3.
    assert verdict([1.0, 1.1], [2.0, 2.1]) == "?"
    assert "by chance 1 time in 10" in compare(old, faster)


def test_compare_warns_when_the_runs_were_not_alike(tmp_path: Path) -> None:
    old = Run.load(_report(tmp_path / "old.json", [(3000, 800)]))
    new = Run.load(_report(tmp_path / "new.json", [(5000, 1500)], workers=2))
    assert "WARNING: the runs differ in workers (1 vs 2)" in compare(old, new)


@pytest.mark.parametrize("content", ["", "[]", '{"results": [{"scenario": "x"}]}', '{"results": [], "rounds": 3}',
                                     "\xff", '{"results": [], "ratios": {"batch25": null}}',
                                     '{"results": [], "ratios": {"batch25": "abc"}}', "[" * 100_000,
                                     '{"results": [{"scenario": "x", "requests_per_s": 1' + "0" * 400
                                     + ', "p99_ms": 1, "cpu_ms_per_request": 1}]}',
                                     '{"results": [], "n": 1' + "0" * 5000 + "}",
                                     # helper-55: a lone surrogate (unprintable), NaN, wrong types
                                     '{"results": [], "commit": "\\ud800"}',
                                     '{"results": [{"scenario": "x", "requests_per_s": NaN, "p99_ms": 1,'
                                     ' "cpu_ms_per_request": 1}]}',
                                     '{"results": [], "failed": ["a"]}', '{"results": [], "interrupted": 5}',
                                     '{"results": [{"scenario": "x", "requests_per_s": 1e400, "p99_ms": 1,'
                                     ' "cpu_ms_per_request": 1}]}', '{"results": [], "half_rate": {"target_rps": 1e999}}'])
def test_compare_refuses_what_is_not_a_bench_result(tmp_path: Path, content: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_bytes(content.encode("latin-1"))
    good = _report(tmp_path / "good.json", [(3000, 800)])
    assert main([str(good), str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"python -m bench.compare: {bad}: not a bench result") and err.count("\n") == 1
    assert main([str(tmp_path / "missing.json"), str(good)]) == 2
    assert "missing.json: No such file or directory" in capsys.readouterr().err


def test_another_revision_is_exported_without_touching_the_repository(tmp_path: Path) -> None:
    from bench.revision import ROOT, UnknownRevision, export

    short = export("HEAD", tmp_path)
    assert (tmp_path / "collector" / "__main__.py").is_file() and (tmp_path / "storage" / "writer.py").is_file()
    assert not (tmp_path / ".git").exists() and len(short) >= 7
    with pytest.raises(UnknownRevision, match="is not a commit"):
        export("no-such-revision-anywhere", tmp_path / "x")
    with pytest.raises(UnknownRevision, match="is not a commit"):
        export("--output=/tmp/x", tmp_path / "y")  # never read as an option of git
    with pytest.raises(UnknownRevision, match="is not a commit"):
        export("HEAD^{tree}", tmp_path / "z")
    # A revision ending in free text resolves (`^{commit}` appended to it had broken it; helper-54).
    subject = subprocess.run(["git", "log", "-1", "--format=%s"], capture_output=True, text=True, cwd=ROOT).stdout
    plain = re.match(r"[\w ,:]*", subject).group(0)[:40]  # a regex to git: no special characters
    assert export(":/" + plain, tmp_path / "w") == short
    assert (ROOT / ".git").exists()


def test_a_problem_names_its_real_round_when_another_round_failed() -> None:
    # single failed in round 1 (no row) and was refused in round 3: the warning said "round 2" (helper-53).
    rounds = [[_row("baseline", 3000)],
              [_row("baseline", 3100), _row("single", 2000)],
              [_row("baseline", 2900), _row("single", 1900, problems=["7 answers were not 2xx"])]]
    rows = {r.scenario: r for r in summary_rows(rounds)}
    assert rows["single"].problems == ["measured in 2 of 3 rounds", "round 3: 7 answers were not 2xx"]
    assert rows["baseline"].problems == []
    lone = summary_rows([[_row("baseline", 1)], [_row("baseline", 2), _row("single", 5, problems=["x"])]])
    assert lone[1].problems == ["measured in 1 of 2 rounds", "round 2: x"]
    # An interrupted round with nothing in it is not a round the rows missed.
    assert summary_rows([[_row("baseline", 1)], []])[0].problems == []


def test_compare_does_not_judge_a_row_its_own_run_flagged(tmp_path: Path) -> None:
    old = Run.load(_report(tmp_path / "old.json", [(3000, 800), (2500, 700), (3200, 820)]))
    new_path = _report(tmp_path / "new.json", [(3100, 1100), (2600, 950), (3000, 1050)])
    report = json.loads(new_path.read_text())
    report["results"][1]["problems"] = ["round 2: 2237 answers were not 2xx"]
    report["interrupted"], report["failed"] = "SIGTERM", {"single (round 3)": "RuntimeError: boom"}
    report["rounds"].append([])  # interrupted before round 4 had a result
    new_path.write_text(json.dumps(report))
    text = compare(old, Run.load(new_path))
    assert _verdicts(text) == {"baseline": "noise", "batch25": "untrusted"}
    assert next(line for line in text.splitlines() if line.startswith("batch25")).split()[-2] == "-"
    assert "WARNING batch25: new: round 2: 2237 answers were not 2xx" in text
    assert "WARNING: the new run was interrupted (SIGTERM)" in text
    assert "WARNING: in the new run, these failed: single (round 3)" in text
    assert "new  new.json: commit abc1234, 3 round(s)" in text


def test_compare_reads_many_rounds_and_says_paced_rates_are_not_the_codes(tmp_path: Path) -> None:
    # 520 rounds a side overflowed the chance's float (helper-55).
    many = Run.load(_report(tmp_path / "many.json", [(3000, 800)] * 520))
    assert "by chance 1 time in 10^311 for each row" in compare(many, many)
    from bench.compare import _one_in

    assert (_one_in(3, 3), _one_in(5, 5), _one_in(7300, 7300)) == ("10", "126", "10^4393")  # was a traceback
    old_path, new_path = _report(tmp_path / "old.json", [(3000, 800)]), _report(tmp_path / "new.json", [(3300, 800)])
    for path, p99 in ((old_path, 20.0), (new_path, 31.0)):
        report = json.loads(path.read_text())
        report["results"].append({**report["results"][1], "scenario": "half-rate", "requests_per_s": 400 + p99,
                                  "p99_ms": p99})
        path.write_text(json.dumps(report))
    text = compare(Run.load(old_path), Run.load(new_path))
    half = next(line for line in text.splitlines() if line.startswith("half-rate")).split()
    assert half[3] == "-" and half[6] == "-" and half[7:9] == ["20.0", "31.0"]
    assert "half-rate: paced at a rate the bench set" in text
    # Separate runs paced at different rates: their p99 and CPU do not compare (helper-57).
    for path, target in ((old_path, 270.0), (new_path, 410.0)):
        report = json.loads(path.read_text())
        report["half_rate"] = {"target_rps": target}
        path.write_text(json.dumps(report))
    assert "WARNING half-rate: paced at 270 and 410 req/s" in compare(Run.load(old_path), Run.load(new_path))


def test_the_cpu_verdict_skips_a_row_whose_cpu_counts_other_load(tmp_path: Path) -> None:
    paths = _report(tmp_path / "old.json", [(3000, 800)] * 3), _report(tmp_path / "new.json", [(3000, 1200)] * 3)
    for path in paths:
        report = json.loads(path.read_text())
        for rows in [report["results"], *report["rounds"]]:
            rows[1]["cpu_is_per_request"] = False  # as signals-read's: the ingest beside the reads
        path.write_text(json.dumps(report))
    line = next(line for line in compare(*map(Run.load, paths)).splitlines() if line.startswith("batch25"))
    assert line.split()[-2:] == ["-", "faster"]
    paced_only = tmp_path / "paced.json"
    paced_only.write_text(json.dumps({"results": [], "rounds": [[], [], []]}))
    assert "paced.json: commit ?, paced scenarios only" in compare(Run.load(paced_only), Run.load(paths[1]))


def test_both_sides_are_paced_at_the_lower_rate_and_a_flagged_one_flags_the_paced_rows(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    import bench.soak
    from bench.__main__ import Side, _run_paced

    paced: list[tuple[str, float]] = []

    def run_soak(wrk: str, *, max_rps: float, scenario: str, source: Path | None, **_: object) -> tuple[Result, Any]:
        paced.append((str(source), max_rps))
        figures = type("Paced", (), {"target_rps": max_rps / 2, "achieved_rps": max_rps / 2})()
        return _row(scenario, max_rps / 2), figures

    monkeypatch.setattr(bench.soak, "run_soak", run_soak)
    args = argparse.Namespace(connections=64, workers=1, soak_duration=10.0)

    def run(old_batch: Result, new_batch: Result) -> tuple[Side, Side]:
        old, new = Side("old", "abc", Path("/tmp/old-tree")), Side("new", "def")
        old.rounds, new.rounds = [[old_batch]], [[new_batch]]
        paced.clear()
        _run_paced(args, ["half-rate"], "wrk", 1.0, [old, new], lambda side, name, run: run())
        return old, new

    # A pace above a side's own maximum would measure an overloaded server (helper-57).
    old, new = run(_row("batch25", 900), _row("batch25", 500))
    assert paced == [("/tmp/old-tree", 500), ("None", 500)] and not old.paced[0].problems
    assert new.report["paced_from"] == {"max_rps": 500, "from": "batch25 [new def]", "from_flagged_row": False}
    # A flagged lower rate still paces, and flags both sides' paced rows (helper-55: it passed unflagged).
    old, new = run(_row("batch25", 40, problems=["12 requests timed out"]), _row("batch25", 800))
    assert paced == [("/tmp/old-tree", 40), ("None", 40)]
    assert new.paced[0].problems == ["paced from batch25 [old abc], a row flagged for its own problems"]
    # A side whose own maximum is unknown (its calibration failed) is paced at the other's, flagged (helper-58).
    old, new = Side("old", "abc", Path("/tmp/old-tree")), Side("new", "def")
    old.rounds, new.rounds = [[]], [[_row("batch25", 1000)]]
    _run_paced(args, ["half-rate"], "wrk", 1.0, [old, new],
               lambda side, name, run: None if name == "calibration" else run())
    assert old.paced[0].problems == ["paced from batch25 [new def]: this side's own maximum was not measured"]
    assert not new.paced[0].problems
    # No rate at all: the paced scenarios are reported as failed, not dropped without a word.
    old, new = run(_row("batch25", 0), _row("batch25", 0))
    assert paced == [] and "half-rate" in old.failed and "half-rate" in new.failed
    from bench.soak import short_of_pace

    assert short_of_pace(390, 400) == [] and short_of_pace(300, 400) == [
        "reached 300 of its 400 req/s pace: the server could not keep it"]
