"""The bench harness works end to end: `python -m bench --check` (2 s of baseline and batch25)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).parents[2] / "bench" / "results"


def _bench_dirs(under: Path | None = None) -> set[Path]:
    return set((under or Path(tempfile.gettempdir())).glob("bench-*"))


def _servers(under: Path | None = None) -> list[str]:
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    marker = f"{under}/bench-" if under is not None else "/bench-"
    return [line for line in ps.splitlines() if "collector serve" in line and marker in line]


def test_bench_check_runs_and_reports(tmp_path: Path) -> None:
    before = set(RESULTS.glob("*.json"))
    # A setting left in the shell is not passed on: with a one-request writer queue
    # most answers were 503, and --check still exited 0 (audit helper-51).
    env = dict(os.environ, COLLECTOR_WRITER_MAX_QUEUE="1")
    result = subprocess.run(
        [sys.executable, "-m", "bench", "--check"], capture_output=True, text=True, timeout=180, env=env
    )
    assert result.returncode == 0, result.stderr[-2000:] + result.stdout[-2000:]
    assert "batch25" in result.stdout and "x base" in result.stdout
    assert "not passed on: COLLECTOR_WRITER_MAX_QUEUE" in result.stdout
    assert "WARNING" not in result.stdout
    written = set((Path(__file__).parents[2] / "bench" / "results").glob("*.json")) - before
    assert written
    report = json.loads(max(written).read_text())
    batch = next(r for r in report["results"] if r["scenario"] == "batch25")
    assert batch["requests_per_s"] > 0 and batch["non2xx"] == 0
    assert batch["group_commit_size"] >= 1
    assert report["workers"] == 1 and batch["workers"] == 1
    assert batch["problems"] == [] and report["ignored_settings"] == ["COLLECTOR_WRITER_MAX_QUEUE"]
    assert "soak" not in report and "sweep" not in report  # --check runs neither
    for path in written:
        path.unlink()


def test_a_stopped_bench_cleans_up_and_keeps_what_finished(tmp_path: Path) -> None:
    # SIGTERM orphaned the collector and wrk and left the data directory; Ctrl-C
    # lost the scenarios already finished (audit helper-51). Its temporary files go to a
    # directory of this test's own: another bench on the machine is not this one's.
    own_tmp = tmp_path / "tmp"
    own_tmp.mkdir()
    before = set(RESULTS.glob("*.json"))
    bench = subprocess.Popen(
        [sys.executable, "-m", "bench", "--scenarios", "baseline,batch25", "--duration", "6", "--warmup", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "TMPDIR": str(own_tmp)},
    )
    assert bench.stdout is not None
    for line in bench.stdout:
        if line.startswith("running batch25"):
            break
    time.sleep(3)  # mid-way through batch25
    bench.send_signal(signal.SIGTERM)
    out, err = bench.communicate(timeout=60)
    assert bench.returncode == 130, err[-2000:]
    assert "interrupted (SIGTERM)" in err and out.splitlines()[2].startswith("baseline ")
    assert not _servers(own_tmp) and not _bench_dirs(own_tmp)
    written = set(RESULTS.glob("*.json")) - before
    assert len(written) == 1
    report = json.loads(max(written).read_text())
    assert report["interrupted"] == "SIGTERM" and [r["scenario"] for r in report["results"]] == ["baseline"]
    for path in written:
        path.unlink()


def test_the_timed_run_does_not_resend_the_warm_ups_bodies() -> None:
    # batch25-gzip's pool restarted in every wrk process, so a fifth of the timed
    # run re-posted bodies the warm-up had stored (audit helper-51); the bench's
    # cross-check against the server's own accepted count now tells.
    from bench.scenarios import run_scenario
    from bench.server import ensure_wrk

    result = run_scenario("batch25-gzip", ensure_wrk(), seconds=2, warmup=1, connections=16)
    assert result.requests_per_s > 0 and result.problems == [], result.problems


def test_rounds_are_read_as_medians_and_two_runs_compare() -> None:
    before = set(RESULTS.glob("*.json"))
    result = subprocess.run(
        [sys.executable, "-m", "bench", "--scenarios", "baseline,single", "--repeat", "2", "--duration", "1",
         "--warmup", "0"], capture_output=True, text=True, timeout=180,
    )
    assert result.returncode == 0, result.stderr[-2000:] + result.stdout[-2000:]
    assert "round 2/2: running single" in result.stdout and "medians of 2 rounds" in result.stdout
    written = set(RESULTS.glob("*.json")) - before
    assert len(written) == 1
    path = written.pop()
    try:
        report = json.loads(path.read_text())
        assert report["repeat"] == 2
        assert [[r["scenario"] for r in results] for results in report["rounds"]] == [["baseline", "single"]] * 2
        single = [r["requests_per_s"] for results in report["rounds"] for r in results if r["scenario"] == "single"]
        base = [r["requests_per_s"] for results in report["rounds"] for r in results if r["scenario"] == "baseline"]
        row = next(r for r in report["results"] if r["scenario"] == "single")
        assert row["requests_per_s"] == sum(single) / 2  # the median of two
        assert report["ratios"]["single"] == sum(s / b for s, b in zip(single, base, strict=True)) / 2
        compared = subprocess.run([sys.executable, "-m", "bench.compare", str(path), str(path)],
                                  capture_output=True, text=True, timeout=60)
        assert compared.returncode == 0, compared.stderr
        verdicts = {line.split()[0]: line.split()[-1] for line in compared.stdout.splitlines()
                    if line.startswith(("baseline ", "single "))}
        assert verdicts == {"baseline": "?", "single": "?"}  # two rounds are too few to tell
    finally:
        path.unlink()


def test_against_serves_another_revision_beside_this_tree_and_compares(tmp_path: Path) -> None:
    # Its own TMPDIR: what it leaves behind, and its servers, are told apart from anyone else's.
    env = dict(os.environ, TMPDIR=str(tmp_path))
    result = subprocess.run(
        [sys.executable, "-m", "bench", "--scenarios", "baseline,batch25,half-rate", "--duration", "1",
         "--warmup", "0", "--against", "HEAD"], capture_output=True, text=True, timeout=300, env=env,
    )
    written = [Path(line.removeprefix("wrote ")) for line in result.stdout.splitlines() if line.startswith("wrote ")]
    try:
        assert result.returncode == 0, result.stderr[-2000:] + result.stdout[-2000:]
        old_commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                    cwd=RESULTS.parent).stdout.strip()
        assert f"running baseline [old {old_commit}]" in result.stdout and "running baseline [new " in result.stdout
        assert len(written) == 2 and written[0].name.endswith(f"-old-{old_commit}.json")
        old, new = (json.loads(path.read_text()) for path in written)
        assert old["commit"] == old_commit and new["commit"].startswith(old_commit)
        pair = {"rev": "HEAD", "old_commit": old_commit, "new_commit": new["commit"]}
        assert old["against"] == {**pair, "partner": written[1].name}
        assert new["against"] == {**pair, "partner": written[0].name}
        assert any(line.startswith("baseline ") and line.split()[-1] == "?" for line in result.stdout.splitlines())
        # Both sides paced at one rate: the lower of their batch25 figures (helper-54).
        batch = [next(r["requests_per_s"] for r in report["results"] if r["scenario"] == "batch25")
                 for report in (old, new)]
        assert old["half_rate"]["target_rps"] == new["half_rate"]["target_rps"] == round(min(batch) / 2, 1)
        assert list(tmp_path.iterdir()) == []  # the exported revision and the servers' directories are gone
        assert not [line for line in _servers() if str(tmp_path) in line]
        refused = subprocess.run([sys.executable, "-m", "bench", "--against", "no-such-rev"],
                                 capture_output=True, text=True, timeout=60)
        assert refused.returncode == 2 and "--against: 'no-such-rev' is not a commit" in refused.stderr
        assert "Traceback" not in refused.stderr
    finally:
        for path in written:
            path.unlink(missing_ok=True)
