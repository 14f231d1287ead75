"""Key records: API key -> the tenant configuration (stored as the tenants-file JSON)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import lmdb

from storage.env import Storage
from storage.errors import mapped_lmdb_errors


def get_key(storage: Storage, key: str) -> bytes | None:
    with mapped_lmdb_errors(), storage.read() as txn:
        value = txn.get(key.encode(), db=storage.dbs.keys)
    return bytes(value) if value is not None else None


def iter_keys(storage: Storage) -> Iterator[tuple[str, bytes]]:
    with mapped_lmdb_errors(), storage.read() as txn:
        rows = [(bytes(k).decode(), bytes(v)) for k, v in txn.cursor(db=storage.dbs.keys)]
    yield from rows


# (the stored record or None, the new one) -> what to store, decided inside the transaction
Merge = Callable[[bytes | None, bytes], bytes]


def put_keys(storage: Storage, records: Iterable[tuple[str, bytes]], merge: Merge | None = None) -> None:
    """Upsert many key records in one durable transaction: all or nothing."""
    with mapped_lmdb_errors():
        _write_with_growth(storage, list(records), merge)


def _write_with_growth(storage: Storage, rows: list[tuple[str, bytes]], merge: Merge | None) -> None:
    while True:
        try:
            with storage.env.begin(write=True) as txn:
                for key, value in rows:
                    if merge is not None:
                        stored = txn.get(key.encode(), db=storage.dbs.keys)
                        value = merge(bytes(stored) if stored is not None else None, value)
                    txn.put(key.encode(), value, db=storage.dbs.keys)
            return
        except lmdb.MapFullError:
            if not storage.grow():
                raise
        except lmdb.MapResizedError:  # another process grew the shared map
            storage.adopt_map_size()
