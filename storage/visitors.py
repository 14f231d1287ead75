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

Besides the verdict a record counts the visitor's events by type, its rage
clicks (the third and later clicks of a burst, each click within 1 s of the
previous one by the client's own timestamps) and each recent page's deepest
scroll and time on page (a page: a path within a session); the signals
snapshot (`collector/signals/snapshot.py`) reads them.

A visitor's bot verdict is the majority of its events' verdicts
(`_consent_transition` events carry none and are not counted): one
misjudged event does not turn a person into a bot, and a crawler whose every
event is flagged stays one. The category is the visitor's most frequent bot
category (the latest on a tie).

Damage on disk never stops the projection: an outbox record that does not
decode is skipped, and a visitor record that does not decode is started
afresh from the visitor's new events (logged once, counted) and reads as no
record until then. `collector check` lists both.

Over 400 lines on purpose: the record, both ways of folding and the reads
share one key layout and one decoder, and must treat a damaged record alike.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator, Sequence
from itertools import islice
from typing import Any, NamedTuple

import msgspec
import xxhash

from storage import outbox
from storage.bounded_keys import bounded_key
from storage.env import Storage
from storage.errors import UNREADABLE_RECORD, mapped_lmdb_errors
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
    # Page engagement (spec 2.3: the server derives scroll depth and time on
    # page from the later scroll events of the session). A page is a page path
    # within a session, so a scroll is credited to its own page whatever the
    # order of arrival or the tab. The most recent pages are kept, as Page
    # tuples; older ones are summed.
    pages: list[tuple[int, int, int, float, float]] = []
    pages_left: int = 0  # pages summed out of `pages`
    depth_left: float = 0.0  # their deepest scrolls, summed
    time_left_ms: float = 0.0  # their longest timeOnPage, summed

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
    page: tuple[str, str, float, float] | None = None  # a pageview's or scroll's (session, path, depth, time)


class _EventFacts(msgspec.Struct):
    visitorId: str = ""
    type: str = ""
    receivedAt: int = 0
    timestamp: int | float = 0  # the stored time: the server's when the client's was skewed
    clientTimestamp: int | float | None = None  # the client's, kept when it was skewed
    bot: Any = None
    # Any: a field of no use here must not make the event unreadable.
    sessionId: Any = None
    page: Any = None
    depth: Any = None  # a scroll's
    timeOnPage: Any = None


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
    rebuilt: tuple[str, ...] = ()  # visitor records that did not decode, started afresh (shown keys)


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
    pages, pages_left, depth_left, time_left = record.pages, record.pages_left, record.depth_left, record.time_left_ms
    copied = pages_copied = False
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
        if ev.page is not None:
            if not pages_copied:
                pages, pages_copied = list(pages), True
            left = _fold_page(pages, ev)
            if left is not None:
                pages_left, depth_left, time_left = pages_left + 1, depth_left + left[3], time_left + left[4]
            continue
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
        types, native, rage, last_click, burst, pages, pages_left, depth_left, time_left,
    )


MAX_PAGES = 8  # pages a record keeps apart; older ones are summed
MAX_TIME_ON_PAGE_MS = 86_400_000.0  # a day: a wilder timeOnPage counts as this (sums stay finite)
Page = tuple[int, int, int, float, float]  # (key of session + path, pageview ms, first ms, depth, time on page)


def page_key(session_id: str, path: str) -> int:
    return xxhash.xxh3_64_intdigest(f"{session_id}\x00{path}".encode(errors="surrogatepass"))


def _fold_page(pages: list[Page], ev: VisitorEvent) -> Page | None:
    """Credit a pageview or scroll to its page in `pages` (changed in place); the page summed out, if any.

    Times are the client's (0: unknown). `pages` is kept in the order the
    pages were last heard of, and the one heard of least recently goes when
    there are too many (the current page excepted): by arrival, not by client
    time, so a clock that ran fast for a while cannot pin old pages and push
    every new one out.
    """
    assert ev.page is not None
    session, path, depth, time_on_page = ev.page
    key = page_key(session, path)
    time_on_page = min(float(time_on_page), MAX_TIME_ON_PAGE_MS)
    ms = max(ev.event_ms, 0)
    view_ms = ms if ev.event_type == "pageview" else 0
    for index, (known, seen_view, first, best_depth, best_time) in enumerate(pages):
        if known == key:
            first = min(first, ms) if first and ms else first or ms
            del pages[index]
            pages.append((key, max(seen_view, view_ms), first, max(best_depth, depth), max(best_time, time_on_page)))
            return None
    pages.append((key, view_ms, ms, float(depth), time_on_page))
    if len(pages) <= MAX_PAGES:
        return None
    # The least recently heard of, but never the current page (the snapshot's
    # scrollDepth and timeOnPageMs are its figures).
    current = current_page(pages)
    return pages.pop(1 if current == 0 else 0)


def current_page(pages: list[Page]) -> int:
    """Which of `pages` (not empty) is current: the latest by pageview time, else by first
    event time, and of pages with the same times the one heard of last (a batch's pages
    whose times ahead of the server clock were all made its receipt time)."""
    return max(range(len(pages)), key=lambda i: (pages[i][1] or pages[i][2], pages[i][2], i))


def fold(record: VisitorRecord | None, event: VisitorEvent) -> VisitorRecord:
    """The record after one more event."""
    return merge(record, [event])


class FoldVisitors:
    """A write job: fold the next outbox entries into visitor records (the catch-up)."""

    __slots__ = ("batch",)
    # The retention sweep removes only what the fold has passed: on a full map it
    # takes the last pages too, or nothing could ever be removed (storage.writer).
    spends_reserve = True

    def __init__(self, batch: int = 2048) -> None:
        self.batch = batch

    def run(self, ctx: WriteContext) -> FoldResult:
        txn, dbs = ctx.txn, ctx.dbs
        after = _read_cursor(txn, dbs)
        seen, read, last = self._from_outbox(txn, dbs, after)
        rebuilt = _write(txn, dbs, seen, last) if read else []
        return FoldResult(read, last, read >= self.batch, tuple(map(shown_key, rebuilt)))

    def _from_outbox(self, txn: Any, dbs: Any, after: int) -> tuple[_Seen, int, int]:
        """The next records read back from the outbox: (events per visitor, records read, last seq)."""
        seen: _Seen = {}
        read, last_key = 0, None
        rows = txn.cursor(db=dbs.outbox)
        if rows.set_range(outbox.seq_key(after + 1)):
            for key, value in islice(rows, self.batch):
                read, last_key = read + 1, key
                try:
                    record = outbox.decode_facts(value)
                except UNREADABLE_RECORD:
                    _skip_unreadable(key)
                    continue
                native = record.key_type in NATIVE_KEY_TYPES
                if record.visitor_id is not None:
                    # The admission stored the facts: no need to parse the event.
                    if record.event_type == "_consent_transition":
                        continue
                    visitor = record.visitor_id
                    page = _page_fact(record.page)
                    if page is None and record.event_type in _PAGE_TYPES:
                        page = _parsed_page(value)  # written before records carried it (or bent)
                    event = VisitorEvent(
                        record.committed_ms, record.is_bot, record.bot_category,
                        record.event_type, native, record.event_ms, page,
                    )
                else:
                    # Written before records carried facts: parse the event itself.
                    try:
                        facts = _facts.decode(outbox.decode(value).event)
                    except UNREADABLE_RECORD:
                        _skip_unreadable(key)
                        continue
                    if facts.type == "_consent_transition" or not isinstance(facts.bot, dict):
                        continue
                    visitor = facts.visitorId
                    client_ms = facts.clientTimestamp if facts.clientTimestamp is not None else facts.timestamp
                    event = VisitorEvent(
                        facts.receivedAt or record.committed_ms, bool(facts.bot.get("isBot")),
                        str(facts.bot.get("category", "")), facts.type, native, outbox.event_time(client_ms),
                        _page_of(facts),
                    )
                seen.setdefault((record.client_id, record.site_id, visitor), []).append(event)
        last = int.from_bytes(last_key, "big") if last_key is not None else after
        return seen, read, last


_Seen = dict[tuple[str, str, str], list[VisitorEvent]]


_PAGE_TYPES = frozenset({"pageview", "scroll"})


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _page_fact(value: Any) -> tuple[str, str, float, float] | None:
    """A stored page fact when it has the shape the admission writes, else None."""
    if (
        isinstance(value, list | tuple) and len(value) == 4 and isinstance(value[0], str)
        and isinstance(value[1], str) and _is_number(value[2]) and _is_number(value[3])
    ):
        return (value[0], value[1], float(value[2]), float(value[3]))
    return None


def _page_of(facts: _EventFacts) -> tuple[str, str, float, float] | None:
    """The page fact of a parsed pageview or scroll (as the pipeline gives it), None for other events."""
    if facts.type not in _PAGE_TYPES:
        return None
    session = facts.sessionId if isinstance(facts.sessionId, str) else ""
    path = facts.page.get("path") if isinstance(facts.page, dict) else None
    depth, time_on_page = 0.0, 0.0
    if facts.type == "scroll":
        if not (_is_number(facts.depth) and _is_number(facts.timeOnPage)):
            return None
        depth, time_on_page = float(facts.depth), float(facts.timeOnPage)
    return (session, path if isinstance(path, str) else "", depth, time_on_page)


def _parsed_page(value: bytes | memoryview) -> tuple[str, str, float, float] | None:
    """The page fact of an outbox record written before records carried it, from its event."""
    try:
        return _page_of(_facts.decode(outbox.decode(value).event))
    except UNREADABLE_RECORD:
        return None


def _skip_unreadable(key: bytes) -> None:
    # One unreadable outbox record must not stall the projection (and retention
    # behind it): it carries no verdict we could fold.
    log.warning("visitor fold skipped unreadable outbox record %d", int.from_bytes(key, "big"))


class FoldAtCommit:
    """The writer's in-transaction consumer: fold a group's own appends before it commits.

    Only when they continue the cursor exactly (every earlier entry folded,
    whichever process appended it); otherwise it leaves them to the catch-up
    job. Writer thread only; the counters are read by /metrics.
    """

    __slots__ = ("groups", "events", "skipped", "rebuilt")

    def __init__(self) -> None:
        self.groups = 0  # groups folded at commit
        self.events = 0  # outbox entries they held
        self.skipped = 0  # groups left to the catch-up (the cursor was behind)
        self.rebuilt = 0  # visitor records that did not decode, started afresh

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
        rebuilt = _write(txn, dbs, seen, last)
        return functools.partial(self._count_folded, read, rebuilt)

    # Counted only after the commit: a group redone (map growth) or aborted counts once or not at all.
    def _count_skipped(self) -> None:
        self.skipped += 1

    def _count_folded(self, events: int, rebuilt: list[bytes]) -> None:
        self.groups += 1
        self.events += events
        if rebuilt:
            self.rebuilt += len(rebuilt)
            log_rebuilt([shown_key(key) for key in rebuilt])


def _read_cursor(txn: Any, dbs: Any) -> int:
    raw = txn.get(CURSOR.encode(), db=dbs.cursors)
    return int.from_bytes(raw, "big") if raw else 0


def _write(txn: Any, dbs: Any, seen: _Seen, last: int) -> list[bytes]:
    """Merge each visitor's events into its record (one read, one write per visitor) and move the cursor.

    A stored record that does not decode is started afresh from these events:
    kept, it would fail every later fold, of every visitor, since the cursor
    could never pass it. Returns the keys of such records.
    """
    # Gathered per visitor first: a batch holds many events of few visitors,
    # and every LMDB call here runs on the writer thread, under the GIL.
    rebuilt: list[bytes] = []
    if seen:
        keys = [visitor_key(*vkey) for vkey in seen]
        stored = dict(txn.cursor(db=dbs.visitors).getmulti(keys))
        merged = []
        for key, events in zip(keys, seen.values(), strict=True):
            raw = stored.get(key)
            try:
                record = _decoder.decode(raw) if raw is not None else None
            except UNREADABLE_RECORD:
                record = None
                rebuilt.append(bytes(key))
            merged.append((key, _encoder.encode(merge(record, events))))
        txn.cursor(db=dbs.visitors).putmulti(merged)
    txn.put(CURSOR.encode(), last.to_bytes(8, "big"), db=dbs.cursors)
    return rebuilt


def shown_key(key: bytes) -> str:
    """A visitor key as an operator reads it: clientId/siteId/visitorId."""
    return key.decode(errors="replace").replace("\x00", "/")


def log_rebuilt(keys: Sequence[str]) -> None:
    """Log visitor records a committed fold started afresh (once: the new record decodes)."""
    for key in keys:
        log.error("visitor record %s did not decode; folded afresh from its new events", key)


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
            event = VisitorEvent(
                at_ms, cand.is_bot, cand.bot_category, cand.event_type, native, cand.event_ms, cand.page
            )
            seen.setdefault((client_id, site_id, visitor), []).append(event)
    return seen, read, expected - 1


def _readable(raw: bytes | memoryview | None) -> VisitorRecord | None:
    """The stored record; None when there is none or it does not decode (the next fold starts it afresh)."""
    try:
        return _decoder.decode(raw) if raw is not None else None
    except UNREADABLE_RECORD:
        return None


class VisitorView(msgspec.Struct, frozen=True):
    """One visitor's record as of one read snapshot, and whether the fold is behind."""

    record: VisitorRecord | None
    behind: bool  # committed outbox entries the projection has not folded yet


def read_visitor(storage: Storage, client_id: str, site_id: str, visitor_id: str) -> VisitorView:
    """The visitor's record, the projection's cursor and the outbox head, from one snapshot."""
    with mapped_lmdb_errors(), storage.read() as txn:
        raw = txn.get(visitor_key(client_id, site_id, visitor_id), db=storage.dbs.visitors)
        folded, head = _position(txn, storage)
        record = _readable(raw)
    return VisitorView(record, folded < head)


def fold_position(storage: Storage) -> tuple[int, int]:
    """(the last seq folded into visitors, the last seq committed), from one snapshot."""
    with mapped_lmdb_errors(), storage.read() as txn:
        return _position(txn, storage)


def _position(txn: Any, storage: Storage) -> tuple[int, int]:
    next_seq = txn.get(outbox.NEXT_SEQ, db=storage.dbs.meta)
    return _read_cursor(txn, storage.dbs), int.from_bytes(next_seq, "big") - 1 if next_seq else 0


def iter_visitors(
    storage: Storage,
    visitor_id: str,
    client_id: str | None = None,
    *,
    on_unreadable: Callable[[str, str, Exception], None] | None = None,
) -> Iterator[tuple[str, str, VisitorRecord]]:
    """(clientId, siteId, record) of every visitor with this id (an operator scan).

    A record that does not decode goes to `on_unreadable(clientId, siteId,
    error)` and is skipped; without it the error is raised there.
    """
    with mapped_lmdb_errors(), storage.read() as txn:
        cursor = txn.cursor(db=storage.dbs.visitors)
        found: list[tuple[str, str, VisitorRecord | Exception]] = []
        positioned = cursor.set_range(f"{client_id}\x00".encode()) if client_id else cursor.first()
        while positioned:
            key = bytes(cursor.key())
            parts = key.decode(errors="replace").split("\x00", 2)
            if client_id is not None and parts[0] != client_id:
                break
            if len(parts) == 3 and key == visitor_key(parts[0], parts[1], visitor_id):  # also when digested
                try:
                    found.append((parts[0], parts[1], _decoder.decode(cursor.value())))
                except UNREADABLE_RECORD as exc:
                    found.append((parts[0], parts[1], exc))
            positioned = cursor.next()
    for client, site, record in found:  # reported outside the read transaction
        if not isinstance(record, Exception):
            yield client, site, record
        elif on_unreadable is None:
            raise record
        else:
            on_unreadable(client, site, record)
