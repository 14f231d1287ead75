"""Usage counters: (billing account, period YYYY-MM, unit kind) -> units used."""

from __future__ import annotations

from collections.abc import Iterator

from storage.env import Storage
from storage.errors import mapped_lmdb_errors


def counter_key(account: str, period: str, kind: str) -> bytes:
    return f"{account}\x00{period}\x00{kind}".encode()


def decode_value(raw: bytes | memoryview | None) -> int:
    return int.from_bytes(raw, "big") if raw else 0


def encode_value(value: int) -> bytes:
    return value.to_bytes(8, "big")


def read_counter(storage: Storage, account: str, period: str, kind: str) -> int:
    with mapped_lmdb_errors(), storage.read() as txn:
        return decode_value(txn.get(counter_key(account, period, kind), db=storage.dbs.counters))


def iter_counters(storage: Storage) -> Iterator[tuple[str, str, str, int]]:
    """Every counter as (account, period, kind, used)."""
    with mapped_lmdb_errors(), storage.read() as txn:
        rows = list(txn.cursor(db=storage.dbs.counters))
    for key, value in rows:
        account, period, kind = bytes(key).decode().split("\x00")
        yield account, period, kind, decode_value(bytes(value))
