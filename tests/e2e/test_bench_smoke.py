"""The bench harness works end to end: `python -m bench --check` (2 s of baseline and batch25)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_bench_check_runs_and_reports(tmp_path: Path) -> None:
    before = set((Path(__file__).parents[2] / "bench" / "results").glob("*.json"))
    result = subprocess.run(
        [sys.executable, "-m", "bench", "--check"], capture_output=True, text=True, timeout=180
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "batch25" in result.stdout and "x base" in result.stdout
    written = set((Path(__file__).parents[2] / "bench" / "results").glob("*.json")) - before
    assert written
    report = json.loads(max(written).read_text())
    batch = next(r for r in report["results"] if r["scenario"] == "batch25")
    assert batch["requests_per_s"] > 0 and batch["non2xx"] == 0
    assert batch["group_commit_size"] >= 1
    assert report["workers"] == 1 and batch["workers"] == 1
    assert "soak" not in report and "sweep" not in report  # --check runs neither
    for path in written:
        path.unlink()
