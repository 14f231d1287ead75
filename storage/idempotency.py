"""Idempotency records: (clientId, event id) -> content hash, receipt id, time stored.

A record is the id's while it is stored, whatever its age: the retention sweep
removes one older than the window, and a replay after that is admitted again
(storage/admission.py says why admission does not judge the window itself).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import msgspec

from storage.bounded_keys import bounded_key


class IdempotencyRecord(msgspec.Struct, array_like=True, frozen=True):
    content_hash: bytes
    receipt_id: str
    stored_ms: int
    # How the hash was made: HASHED_KEYED, HASHED_AS_WRITTEN, or 0 (absent: a record of a version before
    # 2026-11-25, which hashed the constrained number fields as floats; collector.ingest.number_forms).
    # (Versions before it read a record this long too: msgspec ignores trailing items.)
    hash_form: int = 0


HASHED_AS_WRITTEN = 1  # numbers hashed in the form they were sent, unkeyed xxh3_128
# The keyed hash (collector.ingest.sealing.content_digest), numbers as written: from 2026-11-26.
# An unkeyed hash of the event as sent let the holder of the data file confirm guesses of
# the sealed, withheld and scrubbed values it covers.
HASHED_KEYED = 2


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
