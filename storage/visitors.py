"""The visitor projection's store: one record per (clientId, siteId, visitorId).

The `visitors` cursor is the last outbox seq folded into the records; the
records and the cursor always change in the same transaction, so a crash
never loses or double-counts an event. Retention keeps outbox entries until
the cursor has passed them. Two ways advance it:

- `FoldAtCommit`, in the admitting transaction itself: when a group's new
  outbox entries continue the cursor exactly, their visitors are folded from
  the admissions' facts in memory before the group commits. This is the
  steady state, in every worker process: a snapshot read after a 202 already
  sees the events, and the outbox is never read back.
- `FoldVisitors`, a write job that tails the outbox from the cursor, up to
  `batch` entries a pass: the catch-up after a restart, an upgrade, or a
  group whose fold at commit was skipped. It reads the facts the admission
  stored in each record (an event's time is then its commit time) and parses
  the event only for records written before records carried facts (its
  `receivedAt`).

Besides the verdict a record counts the visitor's events by type and its rage
clicks (the third and later clicks of a burst, each click within 1 s of the
previous one by the client's own timestamps); the signals snapshot
(`collector/signals/snapshot.py`) reads them.

A visitor's bot verdict is the majority of its events' verdicts
(`_consent_transition` events carry none and are not counted): one
misjudged event does not turn a person into a bot, and a crawler whose every
event is flagged stays one. The category is the visitor's most frequent bot
category (the latest on a tie).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator
from itertools import islice
from typing import Any, NamedTuple

import msgspec

from storage import outbox
from storage.bounded_keys import bounded_key
from storage.env import Storage
from storage.errors import mapped_lmdb_errors
from storage.outbox import Appended
from storage.writer import WriteContext

CURSOR = "visitors"
log = logging.getLogger("collector.projection")


class VisitorRecord(msgspec.Struct, array_like=True, frozen=True):
    first_ms: int
    last_ms: int
    events: int  # events that carry a bot verdict
    bot_events: int
    categories: dict[str, int]  # bot category -> events
    last_category: str = ""
    # Appended later (records grow only at the end; older ones decode with these
    # defaults): what the signals snapshot reads besides the verdict.
    types: dict[str, int] = {}  # event type -> events
    native_events: int = 0  # events sent with mobile or server keys
    rage_clicks: int = 0  # third and later clicks of a burst (each within RAGE_GAP_MS)
    last_click_ms: int = 0  # the client timestamp of the latest click (burst state)
    click_burst: int = 0  # clicks in the current burst

    @property
    def is_bot(self) -> bool:
        return self.bot_events * 2 > self.events

    @property
    def category(self) -> str:
        if not self.is_bot:
            return "human"
        top = max(self.categories.values())
        tied = [name for name, count in self.categories.items() if count == top]
        return self.last_category if self.last_category in tied else tied[0]


class VisitorEvent(NamedTuple):
    """The facts of one committed event that the fold needs."""

    at_ms: int  # commit time (receivedAt for records written before facts existed)
    is_bot: bool
    category: str
    event_type: str = "pageview"
    native: bool = False  # sent with a mobile or server key
    event_ms: int = 0  # the client's timestamp


class _EventFacts(msgspec.Struct):
    visitorId: str = ""
    type: str = ""
    receivedAt: int = 0
    timestamp: int | float = 0  # the stored time: the server's when the client's was skewed
    clientTimestamp: int | float | None = None  # the client's, kept when it was skewed
    bot: Any = None


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(VisitorRecord)
_facts = msgspec.json.Decoder(_EventFacts)
RAGE_GAP_MS = 1000  # clicks closer than this (client time) continue a burst
RAGE_FROM = 3  # the third click of a burst is the first rage click
NATIVE_KEY_TYPES = frozenset({"mobile", "server"})


def visitor_key(client_id: str, site_id: str, visitor_id: str) -> bytes:
    return bounded_key(f"{client_id}\x00{site_id}\x00", visitor_id)


class FoldResult(msgspec.Struct, frozen=True):
    folded: int  # outbox entries read
    cursor: int  # the last seq folded
    more: bool  # the batch limit was hit


def merge(record: VisitorRecord | None, events: list[VisitorEvent]) -> VisitorRecord:
    """The record after more events, in commit order (pure).

    Folding them in one call or one at a time gives the same record: every
    piece of state a later event depends on (the click burst) lives in the
    record. Called with a visitor's events of one fold pass, so the record is
    built once per visitor, not once per event.
    """
    if record is None:
        record = VisitorRecord(events[0].at_ms, events[0].at_ms, 0, 0, {})
    first, last = record.first_ms, record.last_ms
    bot_events, native = record.bot_events, record.native_events
    categories, types = record.categories, dict(record.types)
    last_category = record.last_category
    rage, last_click, burst = record.rage_clicks, record.last_click_ms, record.click_burst
    copied = False
    for ev in events:
        first, last = min(first, ev.at_ms), max(last, ev.at_ms)
        types[ev.event_type] = types.get(ev.event_type, 0) + 1
        native += ev.native
        if ev.is_bot:
            if not copied:
                categories, copied = dict(categories), True
            categories[ev.category] = categories.get(ev.category, 0) + 1
            bot_events += 1
            last_category = ev.category
        if ev.event_type == "click":
            if ev.event_ms <= 0:  # time unknown (a record from before times were kept)
                burst, last_click = 0, 0
                continue
            gap = ev.event_ms - last_click
            burst = burst + 1 if burst and 0 <= gap <= RAGE_GAP_MS else 1
            rage += burst >= RAGE_FROM
            last_click = ev.event_ms
    return VisitorRecord(
        first, last, record.events + len(events), bot_events, categories, last_category,
        types, native, rage, last_click, burst,
    )


def fold(record: VisitorRecord | None, event: VisitorEvent) -> VisitorRecord:
    """The record after one more event."""
    return merge(record, [event])


class FoldVisitors:
    """A write job: fold the next outbox entries into visitor records (the catch-up)."""

    __slots__ = ("batch",)

    def __init__(self, batch: int = 2048) -> None:
        self.batch = batch

    def run(self, ctx: WriteContext) -> FoldResult:
        txn, dbs = ctx.txn, ctx.dbs
        after = _read_cursor(txn, dbs)
        seen, read, last = self._from_outbox(txn, dbs, after)
        if read:
            _write(txn, dbs, seen, last)
        return FoldResult(read, last, read >= self.batch)

    def _from_outbox(self, txn: Any, dbs: Any, after: int) -> tuple[_Seen, int, int]:
        """The next records read back from the outbox: (events per visitor, records read, last seq)."""
        seen: _Seen = {}
        read, last_key = 0, None
        rows = txn.cursor(db=dbs.outbox)
        if rows.set_range(outbox.seq_key(after + 1)):
            for key, value in islice(rows, self.batch):
                read, last_key = read + 1, key
                record = outbox.decode_facts(value)
                native = record.key_type in NATIVE_KEY_TYPES
                if record.visitor_id is not None:
                    # The admission stored the facts: no need to parse the event.
                    if record.event_type == "_consent_transition":
                        continue
                    visitor = record.visitor_id
                    event = VisitorEvent(
                        record.committed_ms, record.is_bot, record.bot_category,
                        record.event_type, native, record.event_ms,
                    )
                else:
                    # Written before records carried facts: parse the event itself.
                    try:
                        facts = _facts.decode(outbox.decode(value).event)
                    except (msgspec.DecodeError, msgspec.ValidationError):
                        # One unreadable old record must not stall the projection
                        # (and retention behind it): it carries no verdict to fold.
                        log.warning("visitor fold skipped unreadable outbox record %s", bytes(key).hex())
                        continue
                    if facts.type == "_consent_transition" or not isinstance(facts.bot, dict):
                        continue
                    visitor = facts.visitorId
                    client_ms = facts.clientTimestamp if facts.clientTimestamp is not None else facts.timestamp
                    event = VisitorEvent(
                        facts.receivedAt or record.committed_ms, bool(facts.bot.get("isBot")),
                        str(facts.bot.get("category", "")), facts.type, native, outbox.event_time(client_ms),
                    )
                seen.setdefault((record.client_id, record.site_id, visitor), []).append(event)
        last = int.from_bytes(last_key, "big") if last_key is not None else after
        return seen, read, last


_Seen = dict[tuple[str, str, str], list[VisitorEvent]]


class FoldAtCommit:
    """The writer's in-transaction consumer: fold a group's own appends before it commits.

    Only when they continue the cursor exactly (every earlier entry folded,
    whichever process appended it); otherwise it leaves them to the catch-up
    job. Writer thread only; the counters are read by /metrics.
    """

    __slots__ = ("groups", "events", "skipped")

    def __init__(self) -> None:
        self.groups = 0  # groups folded at commit
        self.events = 0  # outbox entries they held
        self.skipped = 0  # groups left to the catch-up (the cursor was behind)

    def __call__(self, ctx: WriteContext) -> Callable[[], None] | None:
        """Fold inside the transaction; returns what counts it once the transaction commits."""
        appended = ctx.appended
        if not appended:
            return None
        txn, dbs = ctx.txn, ctx.dbs
        gathered = _from_appended(appended, _read_cursor(txn, dbs))
        if gathered is None:
            return self._count_skipped
        seen, read, last = gathered
        if not read:  # a catch-up earlier in this group folded them all
            return None
        _write(txn, dbs, seen, last)
        return functools.partial(self._count_folded, read)

    # Counted only after the commit: a group redone (map growth) or aborted counts once or not at all.
    def _count_skipped(self) -> None:
        self.skipped += 1

    def _count_folded(self, events: int) -> None:
        self.groups += 1
        self.events += events


def _read_cursor(txn: Any, dbs: Any) -> int:
    raw = txn.get(CURSOR.encode(), db=dbs.cursors)
    return int.from_bytes(raw, "big") if raw else 0


def _write(txn: Any, dbs: Any, seen: _Seen, last: int) -> None:
    """Merge each visitor's events into its record (one read, one write per visitor) and move the cursor."""
    # Gathered per visitor first: a batch holds many events of few visitors,
    # and every LMDB call here runs on the writer thread, under the GIL.
    if seen:
        keys = [visitor_key(*vkey) for vkey in seen]
        stored = dict(txn.cursor(db=dbs.visitors).getmulti(keys))
        merged = [
            (key, _encoder.encode(merge(_decode_stored(stored.get(key)), events)))
            for key, events in zip(keys, seen.values(), strict=True)
        ]
        txn.cursor(db=dbs.visitors).putmulti(merged)
    txn.put(CURSOR.encode(), last.to_bytes(8, "big"), db=dbs.cursors)


def _from_appended(appended: list[Appended], after: int) -> tuple[_Seen, int, int] | None:
    """What reading these appends back from the outbox would give, when they continue seq `after`.

    Entries the cursor already passed are left out: a catch-up job earlier in
    the same group folded them from the outbox. None when the rest do not
    continue the cursor (a gap, or a catch-up that stopped inside an entry:
    the catch-up reads the outbox), or when a candidate lacks its facts.
    """
    seen: _Seen = {}
    read = 0
    expected = after + 1
    for entry in appended:
        if entry.last_seq <= after:
            continue
        if entry.first_seq != expected:
            return None
        expected = entry.last_seq + 1
        native = entry.key_type in NATIVE_KEY_TYPES
        at_ms, client_id, site_id = entry.committed_ms, entry.client_id, entry.site_id
        read += len(entry.candidates)
        for cand in entry.candidates:
            visitor = cand.visitor_id
            if visitor is None:
                return None
            if cand.event_type == "_consent_transition":
                continue
            event = VisitorEvent(at_ms, cand.is_bot, cand.bot_category, cand.event_type, native, cand.event_ms)
            seen.setdefault((client_id, site_id, visitor), []).append(event)
    return seen, read, expected - 1


def _decode_stored(raw: bytes | memoryview | None) -> VisitorRecord | None:
    return _decoder.decode(raw) if raw is not None else None


class VisitorView(msgspec.Struct, frozen=True):
    """One visitor's record as of one read snapshot, and whether the fold is behind."""

    record: VisitorRecord | None
    behind: bool  # committed outbox entries the projection has not folded yet


def read_visitor(storage: Storage, client_id: str, site_id: str, visitor_id: str) -> VisitorView:
    """The visitor's record, the projection's cursor and the outbox head, from one snapshot."""
    with mapped_lmdb_errors(), storage.read() as txn:
        raw = txn.get(visitor_key(client_id, site_id, visitor_id), db=storage.dbs.visitors)
        folded, head = _position(txn, storage)
        record = _decoder.decode(raw) if raw is not None else None
    return VisitorView(record, folded < head)


def fold_position(storage: Storage) -> tuple[int, int]:
    """(the last seq folded into visitors, the last seq committed), from one snapshot."""
    with mapped_lmdb_errors(), storage.read() as txn:
        return _position(txn, storage)


def _position(txn: Any, storage: Storage) -> tuple[int, int]:
    next_seq = txn.get(outbox.NEXT_SEQ, db=storage.dbs.meta)
    return _read_cursor(txn, storage.dbs), int.from_bytes(next_seq, "big") - 1 if next_seq else 0


def iter_visitors(storage: Storage, visitor_id: str, client_id: str | None = None) -> Iterator[tuple[str, str, VisitorRecord]]:
    """(clientId, siteId, record) of every visitor with this id (an operator scan)."""
    with mapped_lmdb_errors(), storage.read() as txn:
        cursor = txn.cursor(db=storage.dbs.visitors)
        found = []
        positioned = cursor.set_range(f"{client_id}\x00".encode()) if client_id else cursor.first()
        while positioned:
            key = bytes(cursor.key())
            client, site, _ = key.decode(errors="replace").split("\x00", 2)
            if client_id is not None and client != client_id:
                break
            if key == visitor_key(client, site, visitor_id):  # also when the id was digested
                found.append((client, site, _decoder.decode(cursor.value())))
            positioned = cursor.next()
    yield from found
