"""The field key ids a data directory's values were sealed with, kept in its meta database.

The key file lives beside the data (or where `field_key_file` says), and a start
that found none created a fresh `k1`: values sealed with the lost `k1` then
read as tampered, and putting the old file back lost everything sealed since,
under the same id. With the ids recorded here, a start without the file is
refused instead (collector.fieldkeys.settle_key_file).
"""

from __future__ import annotations

from typing import Any, TypeVar

import lmdb
import msgspec

from storage.env import Storage
from storage.errors import UNREADABLE_RECORD, mapped_lmdb_errors

FIELD_KEY_IDS = b"field_key_ids"  # meta: JSON list of every key id the key file has held
# meta: JSON {key id: fingerprint} of the key first seen under each id: another
# install's key file, whose k1 is another key, is refused too (helper-97)
FIELD_KEY_PRINTS = b"field_key_prints"


def recorded_key_ids(storage: Storage) -> list[str]:
    with mapped_lmdb_errors(), storage.read() as txn:
        # (unreadable, something was recorded: a missing file is still refused)
        return _stored(txn, storage, FIELD_KEY_IDS, list[str], [], ["(unreadable record)"])


def recorded_key_prints(storage: Storage) -> dict[str, str]:
    """Key id -> the fingerprint of the key first recorded under it ({} before any, or unreadable)."""
    with mapped_lmdb_errors(), storage.read() as txn:
        return _stored(txn, storage, FIELD_KEY_PRINTS, dict[str, str], {}, {})


def record_key_ids(storage: Storage, key_ids: list[str], prints: dict[str, str] | None = None) -> None:
    """Add `key_ids` to the recorded ones, and `prints` for ids that have none yet
    (written only when that changes them)."""

    def merge(txn: lmdb.Transaction) -> None:
        known = _stored(txn, storage, FIELD_KEY_IDS, list[str], [], [])
        merged = sorted({*known, *key_ids})
        if merged != known:
            txn.put(FIELD_KEY_IDS, msgspec.json.encode(merged), db=storage.dbs.meta)
        if prints:
            had = _stored(txn, storage, FIELD_KEY_PRINTS, dict[str, str], {}, {})
            if set(prints) - set(had):
                txn.put(FIELD_KEY_PRINTS, msgspec.json.encode({**prints, **had}), db=storage.dbs.meta)

    storage.write_transaction(merge)


_V = TypeVar("_V")


def _stored(txn: Any, storage: Storage, key: bytes, kind: type[_V], absent: _V, unreadable: _V) -> _V:
    """The JSON record at `key` in meta, `absent` when there is none, `unreadable` when it does not decode."""
    raw = txn.get(key, db=storage.dbs.meta)
    if raw is None:
        return absent
    try:
        return msgspec.json.decode(bytes(raw), type=kind)
    except UNREADABLE_RECORD:
        return unreadable
