"""`collector check`: verify a data directory without changing it.

Reads one snapshot, streaming every database with a cursor (memory grows
with tenants and periods, not with events), and reports:

- outbox continuity: every sequence from the retention low-water mark
  (meta `outbox_retained_from`, itself checked: 8 bytes, not past the head)
  up to the next-seq marker is present, keys
  are 8 bytes, and each record decodes and carries the receipt of its seq;
- every idempotency record decodes and names a receipt the outbox holds for
  that same (clientId, eid), unless retention removed that seq;
- usage counters are not below what the outbox holds per (clientId, period,
  unit). Counters are keyed by billing account, so only a client whose every
  key bills into its own clientId is compared (other clients pooling into it
  only raise its counter); other clients are skipped with a note. A client
  whose billing account changed (an import records the period) counted its
  earlier events into the account of their time: its shortfall in that period
  or before is a note. Counters
  may legitimately be higher: retention removes outbox rows, not counts,
  and signals snapshot reads spend coverage units no outbox event explains;
- every session-replay chunk has a well-formed key and a record that decodes;
- every visitor record decodes (the projection starts one that does not
  afresh, losing its counts), and no consumer cursor is past the outbox head
  (its consumer would pass over every event committed until the head got there);
- the reveal audit log's hash chain is intact (no entry edited or removed).
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from typing import Any

import lmdb
import msgspec

from storage import consent, counters, idempotency, keys, outbox, replay, visitors
from storage.audit import verify_chain
from storage.env import Storage
from storage.errors import UNREADABLE_RECORD, StorageError, mapped_lmdb_errors
from storage.outbox import receipt_seq
from storage.retention import RETAINED_FROM


class CheckReport(msgspec.Struct):
    outbox_records: int = 0
    idempotency_records: int = 0
    counters: int = 0
    keys: int = 0
    replay_chunks: int = 0
    visitor_records: int = 0
    retained_from: int = 0  # outbox seqs below this may have been removed by retention
    next_seq: int = 1
    problems: list[str] = []
    problems_omitted: int = 0  # problems found beyond the listed ones
    notes: list[str] = []  # what was not checked, and why

    @property
    def ok(self) -> bool:
        return not self.problems


class _StoredFacts(msgspec.Struct):
    """The few fields of a stored event the recount needs."""

    type: str | None = None
    receivedAt: int | float | None = None  # the request time the meter used for the period
    bot: Any = None
    visitorId: str | None = None


_facts_decoder = msgspec.json.Decoder(_StoredFacts)


class _KeyFacts(msgspec.Struct):
    clientId: str
    billingAccount: str | None = None


_key_decoder = msgspec.json.Decoder(_KeyFacts)
_visitor_decoder = msgspec.msgpack.Decoder(visitors.VisitorRecord)


def unit_of(facts: _StoredFacts) -> str | None:
    """The counter kind an outbox event drew on (None: not metered)."""
    if facts.type == "_consent_transition":
        return None
    is_bot = isinstance(facts.bot, dict) and bool(facts.bot.get("isBot"))
    return "pageview" if facts.type == "pageview" and not is_bot else "coverage"


def _record_facts(record: outbox.OutboxRecord) -> tuple[object, ...]:
    return (record.visitor_id, record.event_type, record.is_bot, record.bot_category)


def _event_facts(facts: _StoredFacts) -> tuple[object, ...]:
    bot = facts.bot if isinstance(facts.bot, dict) else {}
    return (facts.visitorId, facts.type, bool(bot.get("isBot")), bot.get("category", ""))


class _Checker:
    def __init__(self, storage: Storage, txn: lmdb.Transaction, max_problems: int) -> None:
        self.storage = storage
        self.txn = txn
        self.dbs = storage.dbs
        self.max_problems = max_problems
        self.report = CheckReport()
        self.counted: Counter[tuple[str, str, str]] = Counter()

    def problem(self, text: str) -> None:
        if len(self.report.problems) < self.max_problems:
            self.report.problems.append(text)
        else:
            self.report.problems_omitted += 1

    def outbox(self) -> None:
        raw_next = self.txn.get(outbox.NEXT_SEQ, db=self.dbs.meta)
        raw_retained = self.txn.get(RETAINED_FROM, db=self.dbs.meta)
        next_seq = int.from_bytes(raw_next, "big") if raw_next else 1
        retained_from = int.from_bytes(raw_retained, "big") if raw_retained else 0
        self.report.next_seq, self.report.retained_from = next_seq, retained_from
        for name, raw in ((outbox.NEXT_SEQ, raw_next), (RETAINED_FROM, raw_retained)):
            if raw is not None and len(raw) != 8:
                self.problem(f"meta {name.decode()} is {len(raw)} bytes, not an 8-byte sequence number")
        if retained_from > next_seq:
            # Retention never moves the mark past the head, so one of the two is
            # damaged; a mark too high would excuse every gap below it as retention's.
            shown_next = str(next_seq) if raw_next else "absent or empty, read as 1"
            self.problem(f"the outbox markers disagree: meta {RETAINED_FROM.decode()} ({retained_from}) is past"
                         f" {outbox.NEXT_SEQ.decode()} ({shown_next}); one of them is damaged, and gaps below"
                         " the mark cannot be told from lost rows")
        expected = max(retained_from, 1)  # the lowest seq that must still be present
        for key, value in self.txn.cursor(db=self.dbs.outbox):
            self.report.outbox_records += 1
            if len(key) != 8:
                self.problem(f"outbox key {bytes(key)!r} is not an 8-byte sequence number")
                continue
            seq = int.from_bytes(key, "big")
            if seq >= next_seq:
                self.problem(f"outbox seq {seq} is at or past the next-seq marker {next_seq}")
            if seq > expected:
                self.problem(
                    f"outbox seqs {expected}..{seq - 1} are missing (retained from {retained_from})"
                )
            expected = max(expected, seq + 1)
            self._record(seq, value)
        if expected < next_seq:
            self.problem(
                f"outbox seqs {expected}..{next_seq - 1} are missing (next seq {next_seq})"
            )

    def _record(self, seq: int, value: bytes | memoryview) -> None:
        try:
            record = outbox.decode(value)
            facts = _facts_decoder.decode(record.event)
            # (the facts decoder skips the other members unread: a string that is
            # not UTF-8 among them would still make `outbox dump` skip the record)
            bytes(record.event).decode("utf-8")
        except UNREADABLE_RECORD as exc:
            self.problem(f"outbox seq {seq} does not decode: {exc}")
            return
        if receipt_seq(record.receipt_id) != seq:
            self.problem(f"outbox seq {seq} carries receipt {record.receipt_id} of another seq")
        if record.visitor_id is not None and _record_facts(record) != _event_facts(facts):
            # consumers trust the record's facts instead of parsing the event
            self.problem(
                f"outbox seq {seq} carries facts {_record_facts(record)} that disagree with its"
                f" event {_event_facts(facts)}"
            )
        unit = unit_of(facts)
        if unit is not None:
            ms = facts.receivedAt if facts.receivedAt is not None else record.committed_ms
            try:
                period = time.strftime("%Y-%m", time.gmtime(ms / 1000))
            except (OverflowError, OSError, ValueError):  # past what the platform's time_t holds
                self.problem(f"outbox seq {seq} was received at {ms}, a time in no billing period")
                return
            self.counted[(record.client_id, period, unit)] += 1

    def idempotency(self) -> None:
        retained_from = self.report.retained_from
        for key, value in self.txn.cursor(db=self.dbs.idempotency):
            self.report.idempotency_records += 1
            shown = bytes(key).decode(errors="replace").replace("\x00", "/")
            try:
                record = idempotency.decode(value)
            except UNREADABLE_RECORD as exc:
                self.problem(f"idempotency record {shown} does not decode: {exc}")
                continue
            seq = receipt_seq(record.receipt_id)
            if seq is None:
                self.problem(
                    f"idempotency record {shown} names a malformed receipt {record.receipt_id!r}"
                )
                continue
            if seq < retained_from:
                continue  # retention removed that part of the outbox
            raw = self.txn.get(outbox.seq_key(seq), db=self.dbs.outbox)
            if raw is None:
                self.problem(
                    f"idempotency record {shown} names missing receipt {record.receipt_id}"
                )
                continue
            try:
                stored = outbox.decode(raw)
            except UNREADABLE_RECORD:
                continue  # reported by the outbox pass
            if stored.receipt_id != record.receipt_id or bytes(key) != idempotency.ledger_key(
                stored.client_id, stored.eid
            ):
                self.problem(
                    f"idempotency record {shown} names receipt {record.receipt_id}, but outbox seq"
                    f" {seq} holds {stored.client_id}/{stored.eid} ({stored.receipt_id})"
                )

    def usage(self) -> None:
        accounts: dict[str, set[str]] = {}
        for key, value in self.txn.cursor(db=self.dbs.keys):
            self.report.keys += 1
            try:
                facts = _key_decoder.decode(value)
            except UNREADABLE_RECORD as exc:
                self.problem(f"key record {bytes(key)[:12]!r}... does not decode: {exc}")
                continue
            accounts.setdefault(facts.clientId, set()).add(facts.billingAccount or facts.clientId)
        stored: dict[tuple[str, str, str], int] = {}
        for key, value in self.txn.cursor(db=self.dbs.counters):
            self.report.counters += 1
            parts = bytes(key).decode(errors="replace").split("\x00")
            if len(parts) != 3 or not counters.is_counter(value):
                self.problem(f"usage counter {'/'.join(parts)} is malformed")
                continue
            stored[(parts[0], parts[1], parts[2])] = counters.decode_value(value)
        # Each account's counter holds at least what the outbox holds of the clients
        # billing into it (helper-126: an account of several clients was not compared).
        # A client whose billing account changed (tenants import records the period)
        # had its earlier events counted into the account of their time.
        # (account, period, unit) -> client -> events the outbox holds of it
        pooled: dict[tuple[str, str, str], dict[str, int]] = {}
        skipped: set[str] = set()
        for (client, period, unit), found in sorted(self.counted.items()):
            billed = accounts.get(client)
            if billed is None or len(billed) != 1:
                if client not in skipped:
                    skipped.add(client)
                    why = (
                        "it has no key record"
                        if billed is None
                        else f"its keys bill into several accounts ({', '.join(sorted(billed))})"
                    )
                    self.report.notes.append(f"usage of client {client} not compared: {why}")
                continue
            pooled.setdefault((next(iter(billed)), period, unit), {})[client] = found
        for (account, period, unit), by_client in sorted(pooled.items()):
            have, found = stored.get((account, period, unit), 0), sum(by_client.values())
            if have >= found:
                continue
            clients = list(by_client)
            shortfall = f"counter {account}/{period}/{unit} is {have}, the outbox holds {found}"
            if clients != [account]:
                shortfall += f" of clients {', '.join(clients)}"
            moves = {client: keys.billing_move(self.txn, self.dbs.meta, client) for client in clients}
            moved = {client: when for client, when in moves.items() if period <= when}
            if not moved:
                self.problem(shortfall)
            elif clients == [account]:
                self.report.notes.append(
                    f"{shortfall}; its billing account changed in {moved[account]}: events before that"
                    " are counted in the account of their time"
                )
            else:
                changed = ", ".join(f"{client}'s in {when}" for client, when in sorted(moved.items()))
                self.report.notes.append(
                    f"{shortfall}; billing accounts changed ({changed}): events before that are counted"
                    " in the account of their time"
                )

    def replay(self) -> None:
        for key, value in self.txn.cursor(db=self.dbs.replay):
            self.report.replay_chunks += 1
            parts = replay.split_key(bytes(key))
            if parts is None:
                self.problem(f"replay key {bytes(key)[:40]!r} is malformed")
                continue
            try:
                replay.decode(value)
            except UNREADABLE_RECORD as exc:
                client, site, session, seq = parts
                self.problem(f"replay chunk {client}/{site}/{session}/{seq} does not decode: {exc}")

    def visitors(self) -> None:
        for key, value in self.txn.cursor(db=self.dbs.visitors):
            self.report.visitor_records += 1
            if bytes(key).count(b"\x00") < 2:
                self.problem(f"visitor key {bytes(key)[:40]!r} is malformed")
                continue
            try:
                _visitor_decoder.decode(value)
            except UNREADABLE_RECORD as exc:
                self.problem(f"visitor record {visitors.shown_key(bytes(key))} does not decode: {exc}")

    def consent(self) -> None:
        for key, value in self.txn.cursor(db=self.dbs.consent):
            try:
                consent.decode_strict(value)
            except UNREADABLE_RECORD as exc:
                # (consent and visitor records share one key shape)
                shown = visitors.shown_key(bytes(key))
                self.problem(f"consent record {shown} does not decode (read as a denial): {exc}")

    def cursors(self) -> None:
        head = self.report.next_seq - 1
        for key, value in self.txn.cursor(db=self.dbs.cursors):
            name = bytes(key).decode(errors="replace")
            if len(value) != 8:
                self.problem(f"cursor {name} is not an 8-byte sequence number: {bytes(value)[:16]!r}")
                continue
            seq = int.from_bytes(value, "big")
            if seq > head:
                self.problem(f"cursor {name} is at seq {seq}, past the outbox head {head}")


# (BadTxnError: a fresh transaction on an environment whose damage LMDB met at once)
_DAMAGED_PAGE = (lmdb.CorruptedError, lmdb.PageNotFoundError, lmdb.BadTxnError)
_PASS_RECORDS = {"usage": "key and counter", "cursors": "consumer cursor"}  # (the others are named so)


def check(storage: Storage, *, max_problems: int = 100) -> CheckReport:
    """Verify the data directory in one read snapshot; never writes.

    Problems past `max_problems` are counted, not listed. Raises StorageError
    when the environment cannot be read at all.
    """
    with mapped_lmdb_errors(), contextlib.ExitStack() as transactions:
        checker = _Checker(storage, transactions.enter_context(storage.read()), max_problems)
        for part in (checker.outbox, checker.idempotency, checker.usage, checker.replay, checker.visitors,
                     checker.consent, checker.cursors):  # fmt: skip
            try:
                part()
            except _DAMAGED_PAGE as exc:
                # A damaged page ends that pass, not the check: the report says which
                # records, and the others are still checked (helper-89: no report at
                # all), in a transaction of their own (LMDB fails every later read of
                # the one that met the damage).
                records = _PASS_RECORDS.get(part.__name__, part.__name__)
                checker.problem(f"the {records} records are damaged: {exc} (what lies past it was not read)")
                checker.txn = transactions.enter_context(storage.read())
    try:
        for problem in verify_chain(storage):
            checker.problem(problem)
    except (*_DAMAGED_PAGE, StorageError) as exc:
        checker.problem(f"the audit log is damaged: {exc}")
    return checker.report
