"""The outbox: every committed event in commit order, keyed by an 8-byte sequence.

The outbox is the source of truth that projections, hubs and sinks tail from
their own cursor. Sequence numbers come from the meta database inside the
admitting transaction, so several processes can append safely.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import msgspec

from storage.env import Storage
from storage.errors import UNREADABLE_RECORD, mapped_lmdb_errors, readable_rows

NEXT_SEQ = b"outbox_next_seq"


class Appended(NamedTuple):
    """One admission's new outbox records, seqs first_seq .. last_seq, as facts in memory.

    The writer collects them during a group so that a consumer folding inside
    the same transaction (storage.visitors.FoldAtCommit) need not read the
    rows it just wrote back from LMDB.
    """

    first_seq: int
    client_id: str
    site_id: str
    key_type: str
    committed_ms: int
    candidates: Sequence[Any]  # storage.admission.Candidate, in seq order

    @property
    def last_seq(self) -> int:
        return self.first_seq + len(self.candidates) - 1


class OutboxRecord(msgspec.Struct, array_like=True, frozen=True):
    receipt_id: str
    client_id: str
    site_id: str
    eid: str
    committed_ms: int
    key_type: str
    event: bytes  # the enriched event JSON as stored
    # Appended later (stored records grow only at the end): the few facts of the
    # event that consumers need, so that they do not JSON-parse every event.
    # Records written before carry none (visitor_id is None): read the event.
    visitor_id: str | None = None
    event_type: str = ""
    is_bot: bool = False
    bot_category: str = ""  # "human" when not a bot
    # The client's own timestamp (0: not recorded): consumers compare events
    # of one visitor by it (a skewed clock keeps its intervals).
    event_ms: int = 0
    # A pageview's or scroll's (sessionId, page path, depth percent, timeOnPage
    # ms; 0, 0 for a pageview); only those records carry it. Any: a fact of
    # another shape (a development build wrote (depth, timeOnPage)) must not
    # make the record unreadable; consumers check it (storage.visitors).
    page: Any = None


class RecordFacts(OutboxRecord, array_like=True, frozen=True):
    """An OutboxRecord decoded for its facts: `event` stays a view, not a copy.

    A redefined field keeps its position, so this reads OutboxRecord's arrays.
    """

    event: msgspec.Raw  # type: ignore[assignment]


MAX_EVENT_MS = 2**62  # event_ms is a msgpack int: a wild client clock must still encode


def event_time(value: int | float | None) -> int:
    """A client timestamp as a record keeps it: whole ms, 0 (unknown) when out of range."""
    return int(value) if value is not None and 0 < value < MAX_EVENT_MS else 0


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(OutboxRecord)
_facts_decoder = msgspec.msgpack.Decoder(RecordFacts)


def seq_key(seq: int) -> bytes:
    return seq.to_bytes(8, "big")


def encode(record: OutboxRecord) -> bytes:
    return _encoder.encode(record)


# The admission encodes a tuple of OutboxRecord's fields, in order: the same
# bytes (array_like), without building a Struct per event on the writer thread.
encode_fields: Callable[[tuple[Any, ...]], bytes] = _encoder.encode


def decode(raw: bytes | memoryview) -> OutboxRecord:
    return _decoder.decode(raw)


def decode_facts(raw: bytes | memoryview) -> RecordFacts:
    """The record without copying its event (consumers that need only the facts)."""
    return _facts_decoder.decode(raw)


def receipt_id(node_id: str, seq: int) -> str:
    return f"rcpt_{node_id}{seq:012x}"


def receipt_format(node_id: str) -> str:
    """A %-format giving receipt_id(node_id, seq) for `fmt % seq` (one node, many seqs)."""
    return "rcpt_" + node_id.replace("%", "%%") + "%012x"


_RECEIPT_DIGITS = 12  # receipt ids end with the seq as 12 hex digits


def receipt_seq(receipt: str) -> int | None:
    """The outbox sequence a receipt id names, or None when it is not a receipt id."""
    tail = receipt[-_RECEIPT_DIGITS:]
    if not receipt.startswith("rcpt_") or len(tail) != _RECEIPT_DIGITS:
        return None
    try:
        return int(tail, 16)
    except ValueError:
        return None


def read_record(storage: Storage, seq: int) -> OutboxRecord | None:
    with mapped_lmdb_errors(), storage.read() as txn:
        raw = txn.get(seq_key(seq), db=storage.dbs.outbox)
    return decode(raw) if raw is not None else None


def iter_outbox(
    storage: Storage,
    after: int = 0,
    limit: int | None = None,
    *,
    on_unreadable: Callable[[int, Exception], None] | None = None,
) -> Iterator[tuple[int, OutboxRecord]]:
    """Records with sequence > after, in commit order, read in one snapshot per chunk.

    A record that does not decode is passed to `on_unreadable` with its seq and
    skipped; without `on_unreadable` its error (UNREADABLE_RECORD) is raised there.
    """
    chunk = 1024
    remaining = limit
    while remaining is None or remaining > 0:
        take = chunk if remaining is None else min(chunk, remaining)
        with mapped_lmdb_errors(), storage.read() as txn:
            cursor = txn.cursor(db=storage.dbs.outbox)
            rows: list[tuple[int, OutboxRecord | Exception]] = []
            if cursor.set_range(seq_key(after + 1)):
                for key, value in cursor:
                    rows.append((int.from_bytes(key, "big"), _decoded(value)))
                    if len(rows) >= take:
                        break
        yield from readable_rows(rows, on_unreadable)  # reported outside the read transaction
        if len(rows) < take:
            return
        after = rows[-1][0]
        if remaining is not None:
            remaining -= len(rows)


def _decoded(raw: bytes | memoryview) -> OutboxRecord | Exception:
    try:
        return decode(raw)
    except UNREADABLE_RECORD as exc:
        return exc


def last_seq(storage: Storage) -> int:
    with mapped_lmdb_errors(), storage.read() as txn:
        raw = txn.get(NEXT_SEQ, db=storage.dbs.meta)
    return int.from_bytes(raw, "big") - 1 if raw else 0

