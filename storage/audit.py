"""The reveal audit log: who revealed which sealed values, when and why.

Append-only and hash-chained: every entry carries the SHA-256 of the entry
before it, and its own hash covers its content and that link, so an edit or
a removal anywhere breaks the chain (`verify_chain`). No HTTP route reads or
writes it; only `collector reveal` appends, and `collector audit` lists and
verifies. Retention never touches it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import lmdb
import msgspec

from storage.env import Storage
from storage.errors import UNREADABLE_RECORD, StorageError, mapped_lmdb_errors

GENESIS = "0" * 64


class AuditEntry(msgspec.Struct, frozen=True):
    seq: int
    at_ms: int
    who: str  # the operating-system user (and the sudo user behind it, if any)
    action: str  # "reveal"
    receipt_id: str
    fields: list[str]  # paths of the values revealed
    reason: str
    prev_hash: str
    hash: str = ""


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(AuditEntry)


def _digest(entry: AuditEntry) -> str:
    unsigned = msgspec.structs.replace(entry, hash="")
    return hashlib.sha256(_encoder.encode(unsigned)).hexdigest()


def append_entry(
    storage: Storage, *, at_ms: int, who: str, action: str, receipt_id: str, fields: list[str], reason: str
) -> AuditEntry:
    """Append one entry in its own durable transaction; returns it with its hash."""

    def append(txn: lmdb.Transaction) -> AuditEntry:
        cursor = txn.cursor(db=storage.dbs.audit)
        if cursor.last():
            try:
                last = _decoder.decode(cursor.value())
            except UNREADABLE_RECORD as exc:
                # Chaining onto an entry we cannot read would bless whatever it holds.
                raise StorageError(f"the last audit entry does not decode ({exc}); see `collector check`") from None
            seq, prev = last.seq + 1, last.hash
        else:
            seq, prev = 1, GENESIS
        entry = AuditEntry(seq, at_ms, who, action, receipt_id, fields, reason, prev)
        entry = msgspec.structs.replace(entry, hash=_digest(entry))
        txn.put(seq.to_bytes(8, "big"), _encoder.encode(entry), db=storage.dbs.audit)
        return entry

    return storage.write_transaction(append)


def iter_entries(storage: Storage) -> Iterator[AuditEntry]:
    """Every entry in order; one that does not decode is left out (`verify_chain` reports it)."""
    for _, entry in _entries(storage):
        if entry is not None:
            yield entry


def _entries(storage: Storage) -> list[tuple[int, AuditEntry | None]]:
    """(the seq of its key, the entry or None when it does not decode) for every entry."""
    with mapped_lmdb_errors(), storage.read() as txn:
        rows = [(int.from_bytes(key, "big"), bytes(value)) for key, value in txn.cursor(db=storage.dbs.audit)]
    entries: list[tuple[int, AuditEntry | None]] = []
    for seq, raw in rows:
        try:
            entries.append((seq, _decoder.decode(raw)))
        except UNREADABLE_RECORD:
            entries.append((seq, None))
    return entries


def verify_chain(storage: Storage) -> list[str]:
    """Problems found in the chain; empty when every entry is intact and in place."""
    problems: list[str] = []
    prev: str | None = GENESIS
    expected_seq = 1
    for key_seq, entry in _entries(storage):
        if entry is None:
            problems.append(f"audit entry {key_seq} does not decode")
            prev, expected_seq = None, key_seq + 1  # the next entry's link cannot be checked
            continue
        if entry.seq != expected_seq:
            problems.append(f"audit entry {expected_seq} is missing (found {entry.seq})")
        if prev is not None and entry.prev_hash != prev:
            problems.append(f"audit entry {entry.seq} does not link to the entry before it")
        if entry.hash != _digest(entry):
            problems.append(f"audit entry {entry.seq} was altered")
        prev, expected_seq = entry.hash, entry.seq + 1
    return problems
