"""Evaluate the bot classifier on a labelled user-agent file.

    python -m collector.ingest.bots_eval [FILE]

FILE is a CSV with columns label (bot or human), category (expected, may be
empty), source and user_agent; the default is tests/data/user_agents.csv.
Each row is classified as a website event carrying only its user agent (no
request headers, platform or SDK evidence). Prints precision, recall and F1
for "bot", the confusion counts, expected and predicted counts per category,
and the first 20 misclassified rows. Exits 0 (2 when FILE cannot be read).
"""

from __future__ import annotations

import csv
import sys
from collections import Counter
from pathlib import Path

import msgspec

from collector.ingest.bots import BotClassifier

DEFAULT_FILE = Path(__file__).resolve().parents[2] / "tests" / "data" / "user_agents.csv"


class Row(msgspec.Struct, frozen=True):
    label: str
    category: str
    source: str
    user_agent: str


class Report(msgspec.Struct, frozen=True):
    tp: int
    fp: int
    fn: int
    tn: int
    precision: float
    recall: float
    f1: float
    category_agreement: float  # bots flagged with their expected category, of bots with one
    expected: dict[str, int]
    predicted: dict[str, int]
    wrong: list[tuple[str, str, str, str]]  # (label, expected category, predicted, user agent)


def read_rows(path: Path) -> list[Row]:
    with path.open(newline="", encoding="utf-8") as handle:
        return [Row(r["label"], r.get("category") or "", r.get("source") or "", r["user_agent"])
                for r in csv.DictReader(handle)]


def evaluate(rows: list[Row], classifier: BotClassifier | None = None) -> Report:
    classifier = classifier or BotClassifier()
    tp = fp = fn = tn = agree = with_category = 0
    expected: Counter[str] = Counter()
    predicted: Counter[str] = Counter()
    wrong = []
    for row in rows:
        verdict = classifier.classify(user_agent=row.user_agent, native=False)
        is_bot = row.label == "bot"
        expected[row.category or row.label] += 1
        predicted[verdict.category] += 1
        if is_bot and verdict.is_bot:
            tp += 1
        elif verdict.is_bot:
            fp += 1
        elif is_bot:
            fn += 1
        else:
            tn += 1
        if is_bot and row.category:
            with_category += 1
            agree += verdict.category == row.category
        if is_bot != verdict.is_bot or (is_bot and row.category and verdict.category != row.category):
            wrong.append((row.label, row.category, verdict.category, row.user_agent))
    precision = tp / (tp + fp) if tp + fp else 1.0
    recall = tp / (tp + fn) if tp + fn else 1.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return Report(tp, fp, fn, tn, precision, recall, f1,
                  agree / with_category if with_category else 1.0,
                  dict(sorted(expected.items())), dict(sorted(predicted.items())), wrong)


def render(report: Report, path: Path) -> str:
    lines = [
        f"file: {path}",
        f"rows: {report.tp + report.fp + report.fn + report.tn}",
        f"precision: {report.precision:.4f}  recall: {report.recall:.4f}  f1: {report.f1:.4f}",
        f"confusion: tp={report.tp} fp={report.fp} fn={report.fn} tn={report.tn}",
        f"category agreement (bots): {report.category_agreement:.4f}",
        "category   expected  predicted",
    ]
    for name in sorted(set(report.expected) | set(report.predicted)):
        lines.append(f"  {name:<15} {report.expected.get(name, 0):>5} {report.predicted.get(name, 0):>9}")
    lines.append(f"misclassified ({len(report.wrong)}, first 20; label/expected -> predicted):")
    for label, category, got, user_agent in report.wrong[:20]:
        lines.append(f"  {label}/{category or '-'} -> {got}: {user_agent}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    path = Path(args[0]) if args else DEFAULT_FILE
    try:
        rows = read_rows(path)
    except (OSError, KeyError, csv.Error) as exc:
        print(f"cannot read {path}: {exc}", file=sys.stderr)
        return 2
    print(render(evaluate(rows), path))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
