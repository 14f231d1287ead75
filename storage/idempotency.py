"""Idempotency records: (clientId, event id) -> content hash, receipt id, time stored.

A record older than the window is treated as absent, so a replay after the
window is admitted again; retention removes such records in the background.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import msgspec

from storage.bounded_keys import bounded_key
from storage.errors import UNREADABLE_RECORD, mapped_lmdb_errors


class IdempotencyRecord(msgspec.Struct, array_like=True, frozen=True):
    content_hash: bytes
    receipt_id: str
    stored_ms: int


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(IdempotencyRecord)


def ledger_key(client_id: str, eid: str) -> bytes:
    return bounded_key(f"{client_id}\x00", eid)


def ledger_keys(client_id: str, eids: Iterable[str]) -> list[bytes]:
    """ledger_key for many ids of one client."""
    prefix = client_id + "\x00"
    return [bounded_key(prefix, eid) for eid in eids]


def public_ledger_key(client_id: str, eid: str) -> str:
    """The form reported in `ledgerKeys` of the 202 body."""
    return f"{client_id}/{eid}"


def encode(record: IdempotencyRecord) -> bytes:
    return _encoder.encode(record)


# A tuple of IdempotencyRecord's fields, in order, encodes to the same bytes.
encode_fields: Callable[[tuple[Any, ...]], bytes] = _encoder.encode


def decode(raw: bytes | memoryview) -> IdempotencyRecord:
    return _decoder.decode(raw)


def live(record: IdempotencyRecord, now_ms: int, window_ms: int) -> bool:
    return now_ms - record.stored_ms < window_ms


def stored_receipts(
    storage: Any, client_id: str, events: Iterable[tuple[str, bytes, bytes | None]], *, now_ms: int, window_ms: int
) -> list[str | None]:
    """For each (eid, content hash, previous hash): the receipt of its live record holding that content, else None.

    A read, nothing written: for events a request does not store (an identify
    dropped by a later consent denial), whose exact replay is still a duplicate.
    A record that does not decode counts as none.
    """
    wanted = list(events)
    if not wanted:
        return []
    keys = ledger_keys(client_id, [eid for eid, _, _ in wanted])
    with mapped_lmdb_errors(), storage.read() as txn:
        stored = dict(txn.cursor(db=storage.dbs.idempotency).getmulti(keys))
    found: list[str | None] = []
    for key, (_, content_hash, legacy_hash) in zip(keys, wanted, strict=True):
        raw = stored.get(key)
        try:
            record = decode(raw) if raw is not None else None
        except UNREADABLE_RECORD:
            record = None
        matches = record is not None and live(record, now_ms, window_ms) and (
            record.content_hash in (content_hash, legacy_hash)
        )
        found.append(record.receipt_id if matches and record is not None else None)
    return found
