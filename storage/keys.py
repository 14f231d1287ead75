"""Key records: API key -> the tenant configuration (stored as the tenants-file JSON)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import lmdb

from storage.bounded_keys import bounded_key
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


def put_keys(storage: Storage, records: Iterable[tuple[str, bytes]]) -> None:
    """Upsert many key records in one durable transaction: all or nothing."""
    rows = list(records)
    storage.write_transaction(lambda txn: _put(storage, txn, rows))


def change_key(storage: Storage, key: str, change: Callable[[bytes | None], list[tuple[str, bytes]]]) -> None:
    """One durable transaction: `change` sees the key's stored record (None when
    absent) and returns the rows to write; it may raise to write nothing.

    A read and a write in two transactions let a concurrent import (a
    suspension) or a second change of the same key be overwritten.
    """

    def body(txn: lmdb.Transaction) -> None:
        try:
            stored = key.encode()
        except UnicodeEncodeError:  # (a command line's bytes that are not UTF-8): no record has it
            stored = b""
        raw = txn.get(stored, db=storage.dbs.keys) if stored else None  # (LMDB refuses an empty key)
        _put(storage, txn, change(bytes(raw) if raw is not None else None))

    storage.write_transaction(body)


BILLING_MOVED = b"billing_moved\x00"  # meta: + clientId -> the latest period (YYYY-MM) its billing account changed


def update_keys(
    storage: Storage,
    update: Callable[[dict[str, bytes]], dict[str, bytes]],
    moved: Callable[[], dict[str, str]] | None = None,
) -> None:
    """One durable transaction: `update` sees every stored record and returns the rows to write.

    For a change that depends on other keys (an import recomputes each billing
    account's terms from all of its keys). `update` may raise to write nothing.
    `moved`, called after it: clients whose billing account it changed, with
    the period, recorded for `collector check` (usage counted before a move
    sits in the account of that time).
    """

    def body(txn: lmdb.Transaction) -> None:
        stored = {bytes(k).decode(): bytes(v) for k, v in txn.cursor(db=storage.dbs.keys)}
        _put(storage, txn, update(stored).items())
        for client, period in (moved() if moved is not None else {}).items():
            txn.put(moved_key(client), period.encode(), db=storage.dbs.meta)

    storage.write_transaction(body)


def moved_key(client_id: str) -> bytes:
    """The meta key of a client's billing move (a clientId of 128 four-byte characters is digested)."""
    return bounded_key(BILLING_MOVED.decode(), client_id)


def billing_move(txn: lmdb.Transaction, meta: lmdb._Database, client_id: str) -> str:
    """The latest period the client's billing account changed, "" when never (see update_keys)."""
    raw = txn.get(moved_key(client_id), db=meta)
    return bytes(raw).decode(errors="replace") if raw is not None else ""


def _put(storage: Storage, txn: lmdb.Transaction, rows: Iterable[tuple[str, bytes]]) -> None:
    for key, value in rows:
        txn.put(key.encode(), value, db=storage.dbs.keys)
