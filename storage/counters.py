"""Usage counters: (billing account, period YYYY-MM, unit kind) -> units used."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import lmdb
import msgspec

from storage.env import Storage
from storage.errors import StorageError, mapped_lmdb_errors
from storage.writer import WriteContext


def counter_key(account: str, period: str, kind: str) -> bytes:
    return f"{account}\x00{period}\x00{kind}".encode()


COUNTER_BYTES = 8


def is_counter(raw: bytes | memoryview | None) -> bool:
    """A stored value is a counter: absent (0) or 8 big-endian bytes.

    Anything else is never guessed at or overwritten: whoever meters refuses
    or degrades instead.
    """
    return raw is None or len(raw) == COUNTER_BYTES


def decode_value(raw: bytes | memoryview | None) -> int:
    return int.from_bytes(raw, "big") if raw else 0


def encode_value(value: int) -> bytes:
    return value.to_bytes(COUNTER_BYTES, "big")


def read_counter(storage: Storage, account: str, period: str, kind: str) -> int:
    """The units used; StorageError when the stored value is not a counter."""
    key = counter_key(account, period, kind)
    with mapped_lmdb_errors(), storage.read() as txn:
        raw = txn.get(key, db=storage.dbs.counters)
        if not is_counter(raw):
            raise StorageError(f"usage counter {key.decode(errors='replace')!r} is not 8 bytes")
        return decode_value(raw)


class DamagedCounter(msgspec.Struct, frozen=True):
    """A counter row that cannot be read. A part of its key that is not UTF-8
    (or a key that is not three parts) is None: what it counted is unknown."""

    name: str  # its key as account/period/kind, undecodable bytes escaped
    account: str | None
    period: str | None
    kind: str | None
    problem: str


def read_row(key: bytes, value: bytes) -> tuple[str, str, str, int] | DamagedCounter:
    """One stored row as (account, period, kind, used), or what is wrong with it."""
    parts = key.split(b"\x00")
    names = [_utf8(part) for part in parts] if len(parts) == 3 else [None, None, None]
    account, period, kind = names
    if account is None or period is None or kind is None:
        problem = "its key is not three UTF-8 parts"
    elif not is_counter(value):
        problem = f"its value is {len(value)} bytes, not an {COUNTER_BYTES}-byte count"
    else:
        return account, period, kind, decode_value(value)
    return DamagedCounter(counter_name(key), account, period, kind, problem)


def counter_name(key: bytes) -> str:
    """A counter's key as messages name it: account/period/kind, undecodable bytes escaped."""
    return key.decode(errors="backslashreplace").replace("\x00", "/")


def _utf8(part: bytes) -> str | None:
    try:
        return part.decode()
    except UnicodeDecodeError:
        return None


def iter_counters(
    storage: Storage, on_damaged: Callable[[DamagedCounter], None] | None = None
) -> Iterator[tuple[str, str, str, int]]:
    """Every readable counter as (account, period, kind, used).

    A damaged row (a key that is not three UTF-8 parts, a value that is not a
    counter) goes to `on_damaged`, or is left out: /metrics must not break on
    one; `usage show` and `usage invoice` name it and exit 1; `collector
    check` reports it.
    """
    with mapped_lmdb_errors(), storage.read() as txn:
        rows = [(bytes(key), bytes(value)) for key, value in txn.cursor(db=storage.dbs.counters)]
    for key, value in rows:
        row = read_row(key, value)
        if not isinstance(row, DamagedCounter):
            yield row
        elif on_damaged is not None:
            on_damaged(row)


OVERAGE_SUFFIX = "_overage"  # kind of the counter of a unit's billed overage ("pageview_overage")


def overage_key(account: str, period: str, unit: str) -> bytes:
    """The counter of `unit`'s overage served under paid overage: what an invoice bills."""
    return counter_key(account, period, unit + OVERAGE_SUFFIX)


def served_overage(included: int, used: int, added: int) -> int:
    """Units of `added` beyond `included`, counting from `used`."""
    return max(0, used + added - max(used, included))


OVERAGE_COUNTED_FROM = b"overage_counted_from"  # meta: the period overage counters began in this directory


def mark_overage_counting(storage: Storage, period: str) -> None:
    """Record the period from which this directory counts served overage (once; `serve` at start).

    The marked period is the one whose usage began uncounted (an upgrade
    mid-month): its overage counters start from what the usage shows. When
    nothing was metered in `period` yet (a new directory, an upgrade before
    the month's first unit), every unit of it will be counted as served, so
    the mark is the month before: `period` is then priced from its counters
    alone, and terms changed later cannot rewrite it.
    """

    def mark(txn: lmdb.Transaction) -> None:
        if txn.get(OVERAGE_COUNTED_FROM, db=storage.dbs.meta) is None:
            infix = f"\x00{period}\x00".encode()
            metered = any(infix in bytes(key) for key in txn.cursor(db=storage.dbs.counters).iternext(values=False))
            began = period if metered else period_before(period)
            txn.put(OVERAGE_COUNTED_FROM, began.encode(), db=storage.dbs.meta)

    storage.write_transaction(mark)


def period_before(period: str) -> str:
    """The billing period (YYYY-MM) before `period`."""
    year, month = map(int, period.split("-"))
    return f"{year - 1:04d}-12" if month == 1 else f"{year:04d}-{month - 1:02d}"


def overage_counted_from(storage: Storage) -> str | None:
    """The period this directory began counting served overage in (None: it has not yet)."""
    with mapped_lmdb_errors(), storage.read() as txn:
        raw = txn.get(OVERAGE_COUNTED_FROM, db=storage.dbs.meta)
    return bytes(raw).decode(errors="replace") if raw is not None else None


def add_overage(txn: Any, dbs: Any, key: bytes, *, included: int, used: int, added: int, period: str) -> None:
    """In a write job: count the served overage of `added` units (from `used`) on counter `key`.

    In the period the counters began (an upgrade mid-month), overage served
    before them has no counter yet: the first write starts from the overage
    the usage shows. Later periods start from 0 (an allowance lowered before
    any overage was served does not make earlier units overage). A stored
    value that is not a counter is left as it is (never guessed at; `collector
    check` reports it).
    """
    served = served_overage(included, used, added)
    if not served:
        return
    raw = txn.get(key, db=dbs.counters)
    if not is_counter(raw):
        return
    if raw is not None:
        base = decode_value(raw)
    else:
        began = txn.get(OVERAGE_COUNTED_FROM, db=dbs.meta)
        base = max(0, used - included) if began is None or bytes(began).decode() == period else 0
    txn.put(key, encode_value(base + served), db=dbs.counters)


class Spend(msgspec.Struct, frozen=True):
    """The outcome of a SpendUnits job."""

    used: int  # the counter after the job (unchanged when not spent)
    spent: bool
    unreadable: bytes | None = None  # the counter whose stored value is not one; nothing was written


class SpendUnits:
    """A write job: add `units` to one counter when `allow(used, units)` says so.

    Reads, decides, then writes, like the admission: a refusal writes nothing.
    A stored value that is not a counter is never guessed at or overwritten.
    """

    __slots__ = ("key", "units", "allow", "overage")

    def __init__(
        self,
        key: bytes,
        units: int,
        allow: Callable[[int, int], bool],
        overage: tuple[bytes, int, str] | None = None,
    ) -> None:
        """`overage`: (its counter, the included units, the period) when paid overage is on:
        units spent beyond the included ones are added to it too (an invoice bills them)."""
        self.key, self.units, self.allow, self.overage = key, units, allow, overage

    def run(self, ctx: WriteContext) -> Spend:
        raw = ctx.txn.get(self.key, db=ctx.dbs.counters)
        if not is_counter(raw):
            return Spend(0, False, unreadable=self.key)
        used = decode_value(raw)
        if not self.allow(used, self.units):
            return Spend(used, False)
        if self.overage is not None:
            key, included, period = self.overage
            if served_overage(included, used, self.units) and not is_counter(ctx.txn.get(key, db=ctx.dbs.counters)):
                return Spend(used, False, unreadable=key)  # overage it could not count would go unbilled
            add_overage(ctx.txn, ctx.dbs, key, included=included, used=used, added=self.units, period=period)
        ctx.txn.put(self.key, encode_value(used + self.units), db=ctx.dbs.counters)
        return Spend(used + self.units, True)
