"""The bench's sweep chart from a tiny synthetic result set (no load)."""

from __future__ import annotations

from pathlib import Path

from bench.chart import write_chart


def _row(scenario: str, connections: int, rps: float, p99: float, workers: int = 1) -> dict[str, object]:
    size = 25 if scenario == "batch25" else 1
    return {"scenario": scenario, "connections": connections, "requests_per_s": rps,
            "events_per_s": rps * size, "p99_ms": p99, "workers": workers}


def test_chart_writer_produces_a_png(tmp_path: Path) -> None:
    rows = [_row("single", c, 100.0 * c ** 0.5, 2.0 * c) for c in (1, 4, 16)]
    rows += [_row("batch25", c, 40.0 * c ** 0.3, 5.0 * c) for c in (1, 4, 16)]
    rows += [_row("batch25", c, 60.0 * c ** 0.3, 4.0 * c, workers=2) for c in (1, 4, 16)]
    out = write_chart(rows, tmp_path / "sweep.png", title="synthetic")
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 10_000  # three panels with lines, not an empty canvas
