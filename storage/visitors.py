"""The visitor projection's store: one record per (clientId, siteId, visitorId).

`FoldVisitors` is a write job that tails the outbox from the `visitors`
cursor: it folds up to `batch` committed events into their visitors'
records and advances the cursor in the same transaction, so a crash replays
the batch and never counts an event twice. Retention keeps outbox entries
until this cursor has passed them. It reads the facts the admission stored
in each record (an event's time is then its commit time) and parses the
event only for records written before records carried facts (its
`receivedAt`).

A visitor's bot verdict is the majority of its events' verdicts
(`_consent_transition` events carry none and are not counted): one
misjudged event does not turn a person into a bot, and a crawler whose every
event is flagged stays one. The category is the visitor's most frequent bot
category (the latest on a tie).
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import islice
from typing import Any

import msgspec

from storage import outbox
from storage.env import Storage
from storage.errors import mapped_lmdb_errors
from storage.writer import WriteContext

CURSOR = "visitors"


class VisitorRecord(msgspec.Struct, array_like=True, frozen=True):
    first_ms: int
    last_ms: int
    events: int  # events that carry a bot verdict
    bot_events: int
    categories: dict[str, int]  # bot category -> events
    last_category: str = ""

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


class _EventFacts(msgspec.Struct):
    visitorId: str = ""
    type: str = ""
    receivedAt: int = 0
    bot: Any = None


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(VisitorRecord)
_facts = msgspec.json.Decoder(_EventFacts)


def visitor_key(client_id: str, site_id: str, visitor_id: str) -> bytes:
    return f"{client_id}\x00{site_id}\x00{visitor_id}".encode()


def fold(record: VisitorRecord | None, at_ms: int, is_bot: bool, category: str) -> VisitorRecord:
    """The record after one more event with the given verdict (pure; `merge` must agree)."""
    if record is None:
        record = VisitorRecord(at_ms, at_ms, 0, 0, {})
    categories = record.categories
    if is_bot:
        categories = {**categories, category: categories.get(category, 0) + 1}
    return VisitorRecord(
        min(record.first_ms, at_ms),
        max(record.last_ms, at_ms),
        record.events + 1,
        record.bot_events + is_bot,
        categories,
        category if is_bot else record.last_category,
    )


class FoldResult(msgspec.Struct, frozen=True):
    folded: int  # outbox entries read
    cursor: int  # the last seq folded
    more: bool  # the batch limit was hit


def merge(record: VisitorRecord | None, times: list[int], bot_categories: list[str]) -> VisitorRecord:
    """The record after more events, as folding them one by one would give (pure).

    `times` holds every event's time, `bot_categories` the category of each
    bot event among them, both in commit order.
    """
    first, last = min(times), max(times)
    if record is None:
        record = VisitorRecord(first, last, 0, 0, {})
    categories = record.categories
    if bot_categories:
        categories = dict(categories)
        for name in bot_categories:
            categories[name] = categories.get(name, 0) + 1
    return VisitorRecord(
        min(record.first_ms, first),
        max(record.last_ms, last),
        record.events + len(times),
        record.bot_events + len(bot_categories),
        categories,
        bot_categories[-1] if bot_categories else record.last_category,
    )


class FoldVisitors:
    """A write job: fold the next outbox entries into visitor records."""

    __slots__ = ("batch",)

    def __init__(self, batch: int = 2048) -> None:
        self.batch = batch

    def run(self, ctx: WriteContext) -> FoldResult:
        txn, dbs = ctx.txn, ctx.dbs
        raw_cursor = txn.get(CURSOR.encode(), db=dbs.cursors)
        after = int.from_bytes(raw_cursor, "big") if raw_cursor else 0
        # Gather per visitor first and touch each visitor record once: a batch
        # holds many events of few visitors, and every object built or LMDB
        # call made here runs on the writer thread, under the GIL.
        seen: dict[tuple[str, str, str], tuple[list[int], list[str]]] = {}
        read, last_key = 0, None
        rows = txn.cursor(db=dbs.outbox)
        if rows.set_range(outbox.seq_key(after + 1)):
            for key, value in islice(rows, self.batch):
                read, last_key = read + 1, key
                record = outbox.decode_facts(value)
                if record.visitor_id is not None:
                    # The admission stored the facts: no need to parse the event.
                    if record.event_type == "_consent_transition":
                        continue
                    visitor, at_ms = record.visitor_id, record.committed_ms
                    is_bot, category = record.is_bot, record.bot_category
                else:
                    # Written before records carried facts: parse the event itself.
                    facts = _facts.decode(outbox.decode(value).event)
                    if facts.type == "_consent_transition" or not isinstance(facts.bot, dict):
                        continue
                    visitor, at_ms = facts.visitorId, facts.receivedAt or record.committed_ms
                    is_bot, category = bool(facts.bot.get("isBot")), str(facts.bot.get("category", ""))
                vkey = (record.client_id, record.site_id, visitor)
                entry = seen.get(vkey)
                if entry is None:
                    entry = seen[vkey] = ([], [])
                entry[0].append(at_ms)
                if is_bot:
                    entry[1].append(category)
        last = int.from_bytes(last_key, "big") if last_key is not None else after
        if read:
            keys = [visitor_key(*vkey) for vkey in seen]
            stored = dict(txn.cursor(db=dbs.visitors).getmulti(keys)) if keys else {}
            txn.cursor(db=dbs.visitors).putmulti(
                [
                    (key, _encoder.encode(merge(_decode_stored(stored.get(key)), times, bots)))
                    for key, (times, bots) in zip(keys, seen.values(), strict=True)
                ]
            )
            txn.put(CURSOR.encode(), last.to_bytes(8, "big"), db=dbs.cursors)
        return FoldResult(read, last, read >= self.batch)


def _decode_stored(raw: bytes | memoryview | None) -> VisitorRecord | None:
    return _decoder.decode(raw) if raw is not None else None


def iter_visitors(storage: Storage, visitor_id: str, client_id: str | None = None) -> Iterator[tuple[str, str, VisitorRecord]]:
    """(clientId, siteId, record) of every visitor with this id (an operator scan)."""
    with mapped_lmdb_errors(), storage.read() as txn:
        cursor = txn.cursor(db=storage.dbs.visitors)
        found = []
        positioned = cursor.set_range(f"{client_id}\x00".encode()) if client_id else cursor.first()
        while positioned:
            client, site, visitor = bytes(cursor.key()).decode().split("\x00", 2)
            if client_id is not None and client != client_id:
                break
            if visitor == visitor_id:
                found.append((client, site, _decoder.decode(cursor.value())))
            positioned = cursor.next()
    yield from found
