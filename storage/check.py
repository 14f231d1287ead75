"""`collector check`: verify a data directory without changing it.

Checks that outbox sequence numbers increase and stay below the next-seq
marker, that every outbox and idempotency record decodes and every
idempotency record points at a receipt in the outbox (unless retention
already removed that part of the outbox), and that each usage
counter is at least what the outbox holds for that (clientId, period, unit)
when the client is its own billing account (counters of pooled accounts are
keyed by the account, and are skipped).
"""

from __future__ import annotations

import json
import time
from collections import Counter

import msgspec

from storage import counters, idempotency, outbox
from storage.env import Storage
from storage.retention import RETAINED_FROM


class CheckReport(msgspec.Struct):
    outbox_records: int = 0
    idempotency_records: int = 0
    counters: int = 0
    problems: list[str] = []

    @property
    def ok(self) -> bool:
        return not self.problems


def _unit(event: dict[str, object]) -> str | None:
    kind = event.get("type")
    if kind == "_consent_transition":
        return None
    bot = event.get("bot")
    if kind == "pageview" and not (isinstance(bot, dict) and bot.get("isBot")):
        return "pageview"
    return "coverage"


def _receipt_seq(receipt_id: str) -> int:
    """The outbox sequence a receipt id names (its last 12 hex digits)."""
    try:
        return int(receipt_id[-12:], 16)
    except ValueError:
        return 2**63


def check(storage: Storage, *, max_problems: int = 100) -> CheckReport:
    report = CheckReport()

    def problem(text: str) -> None:
        if len(report.problems) < max_problems:
            report.problems.append(text)

    receipts: set[str] = set()
    counted: Counter[tuple[str, str, str]] = Counter()
    previous = 0
    with storage.read() as txn:
        next_raw = txn.get(outbox.NEXT_SEQ, db=storage.dbs.meta)
        next_seq = int.from_bytes(next_raw, "big") if next_raw else 1
        retained_raw = txn.get(RETAINED_FROM, db=storage.dbs.meta)
        retained_from = int.from_bytes(retained_raw, "big") if retained_raw else 0
        for key, value in txn.cursor(db=storage.dbs.outbox):
            seq = int.from_bytes(key, "big")
            report.outbox_records += 1
            if seq <= previous or seq >= next_seq:
                problem(f"outbox seq {seq} out of order (previous {previous}, next {next_seq})")
            previous = seq
            try:
                record = outbox.decode(value)
                event = json.loads(record.event)
            except (msgspec.DecodeError, ValueError) as exc:
                problem(f"outbox seq {seq} does not decode: {exc}")
                continue
            receipts.add(record.receipt_id)
            unit = _unit(event)
            if unit:
                period = time.strftime("%Y-%m", time.gmtime(record.committed_ms / 1000))
                counted[(record.client_id, period, unit)] += 1
        for key, value in txn.cursor(db=storage.dbs.idempotency):
            report.idempotency_records += 1
            try:
                rec = idempotency.decode(value)
            except msgspec.DecodeError as exc:
                problem(f"idempotency record {bytes(key)!r} does not decode: {exc}")
                continue
            if rec.receipt_id not in receipts and _receipt_seq(rec.receipt_id) >= retained_from:
                problem(f"idempotency record {bytes(key)!r} names missing receipt {rec.receipt_id}")
    stored: dict[tuple[str, str, str], int] = {}
    for account, period, unit, count in counters.iter_counters(storage):
        report.counters += 1
        stored[(account, period, unit)] = count
    for (client, period, unit), found in counted.items():
        have = stored.get((client, period, unit))
        if have is not None and have < found:
            problem(f"counter {client}/{period}/{unit} is {have}, the outbox holds {found}")
    return report
