"""The concurrency sweep as a PNG: throughput and p99 latency against connections.

matplotlib is a bench-only dependency (the `bench` extra, pinned in
constraints.txt); `ensure_matplotlib` installs it into the running
interpreter's environment when it is missing, as `ensure_wrk` does for wrk.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def ensure_matplotlib() -> None:
    try:
        importlib.import_module("matplotlib")
        return
    except ImportError:
        pass
    print("installing matplotlib (the bench extra) ...", flush=True)
    constraints = ROOT / "constraints.txt"
    argv = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    if constraints.exists():
        argv += ["-c", str(constraints)]
    subprocess.run([*argv, "matplotlib"], check=True)
    importlib.invalidate_caches()


def write_chart(sweep: Iterable[Mapping[str, object]], path: Path, *, title: str = "") -> Path:
    """Two panels (throughput, p99) with one line per scenario; x is connections (log 2)."""
    ensure_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sweep = list(sweep)
    mixed = len({int(row.get("workers", 1) or 1) for row in sweep}) > 1  # type: ignore[call-overload]
    series: dict[str, list[tuple[int, float, float, float]]] = {}
    for row in sweep:
        label = str(row["scenario"])
        workers = int(row.get("workers", 1) or 1)  # type: ignore[call-overload]
        if workers > 1 or mixed:
            label += f" ({workers} worker{'s' if workers > 1 else ''})"
        series.setdefault(label, []).append((
            int(row["connections"]),  # type: ignore[call-overload]
            float(row["requests_per_s"]),  # type: ignore[arg-type]
            float(row["events_per_s"]),  # type: ignore[arg-type]
            float(row["p99_ms"]),  # type: ignore[arg-type]
        ))
    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(14, 4.6), dpi=110)
    for label, points in sorted(series.items()):
        points.sort()
        conns = [p[0] for p in points]
        (line,) = left.plot(conns, [p[1] for p in points], marker="o", label=label)
        middle.plot(conns, [p[2] for p in points], marker="o", color=line.get_color(), label=label)
        right.plot(conns, [p[3] for p in points], marker="o", color=line.get_color(), label=label)
    panels = ((left, "requests/s"), (middle, "events/s (2xx only)"), (right, "p99 latency (ms)"))
    for ax, ylabel in panels:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent connections")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.set_ylim(bottom=0)
        ticks = sorted({p[0] for points in series.values() for p in points})
        ax.set_xticks(ticks)
        ax.set_xticklabels([str(t) for t in ticks])
        ax.legend(fontsize=8)
    middle.set_title("events")
    left.set_title("requests")
    right.set_title("p99 latency")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> None:
    """`python -m bench.chart A.json B.json -o both.png`: one chart of several runs' sweeps
    (e.g. `--workers 1` and `--workers 2`; lines are labelled by scenario and workers)."""
    import argparse
    import json

    parser = argparse.ArgumentParser(prog="python -m bench.chart", description=main.__doc__)
    parser.add_argument("results", nargs="+", type=Path, help="bench/results/<timestamp>.json files")
    parser.add_argument("-o", "--output", type=Path, required=True)
    parser.add_argument("--title", default="")
    args = parser.parse_args(argv)
    rows: list[Mapping[str, object]] = []
    for path in args.results:
        report = json.loads(path.read_text())
        if not report.get("sweep"):
            parser.error(f"{path} has no sweep (run the bench with --sweep)")
        rows += report["sweep"]
    print(write_chart(rows, args.output, title=args.title))


if __name__ == "__main__":
    main()
