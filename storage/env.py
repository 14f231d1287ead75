"""The one LMDB environment of a data directory and its named databases.

Every durable thing the service keeps lives here: key records, idempotency
records, usage counters, the outbox, the consumer cursors, session-replay
chunks, visitors' consent and the reveal audit log. Commits are durable (sync
and metasync on, no writemap: a full disk then fails a commit with an error
instead of a SIGBUS). The map starts small and sparse and doubles when a
write transaction fills it.
"""

from __future__ import annotations

import os
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import lmdb

from storage.errors import FormatError, mapped_lmdb_errors, usable_bytes
from storage.migrations import MIGRATIONS

_T = TypeVar("_T")

FORMAT_VERSION = 1
DB_NAMES = (
    "meta", "keys", "idempotency", "counters", "outbox", "cursors", "replay", "consent", "audit",
    "visitors",
)
DEFAULT_MAP_SIZE = 64 * 1024 * 1024
DEFAULT_MAX_MAP_SIZE = 1 << 40  # a terabyte of address space: the disk ends first
# Free pages a map at its cap keeps for the jobs that make room (1% of it when more).
RESERVE_PAGES = 64
# Free pages past the reserve a map at its cap needs to be ready (/readyz): what a batch
# of ordinary events takes. With the reserve alone, a node restarted with a full map said
# ready, and its first write, which the writer checks after it is made, was refused
# (helper-139).
READY_MARGIN_PAGES = 32



@dataclass(frozen=True, slots=True)
class Databases:
    meta: lmdb._Database
    keys: lmdb._Database
    idempotency: lmdb._Database
    counters: lmdb._Database
    outbox: lmdb._Database
    cursors: lmdb._Database
    replay: lmdb._Database
    consent: lmdb._Database  # clientId, siteId, visitorId -> the visitor's latest consent
    audit: lmdb._Database  # the hash-chained reveal audit log (append-only)
    visitors: lmdb._Database  # the visitor projection: clientId, siteId, visitorId -> record


def parse_format(raw: bytes | memoryview | None, where: object) -> int:
    """The storage format marker's value (0: none, data older than the marker); FormatError when damaged."""
    if raw is None:
        return 0
    try:
        return int(bytes(raw).decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise FormatError(f"{where} has a damaged storage format marker ({bytes(raw)[:16]!r})") from None


def newer_format_problem(path: object, version: int) -> str | None:
    """Why a directory of storage format `version` cannot be read by this collector, or None."""
    if version > FORMAT_VERSION:
        return (
            f"data directory {path} has storage format {version}; this collector"
            f" reads formats up to {FORMAT_VERSION}: upgrade the collector"
        )
    return None


class Storage:
    """An open data directory. Thread-safe for reads; writes belong to the writer."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        map_size: int = DEFAULT_MAP_SIZE,
        max_map_size: int = DEFAULT_MAX_MAP_SIZE,
        readonly: bool = False,
    ) -> None:
        self.path = Path(path)
        # The environment holds server keys, the stream-token secret and every
        # event: owner-only, whatever the umask (as field-keys.json and backups).
        self.path.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not readonly:
            _owner_only(self.path)
        self.max_map_size = max_map_size
        # LMDB refuses set_mapsize while this process has a write transaction
        # open: the writer thread holds this lock for each transaction, and a
        # resize (grow, or adopting another worker's growth on a read) waits.
        self._resize_lock = threading.Lock()
        with mapped_lmdb_errors():
            self.env = lmdb.open(
                str(self.path),
                map_size=map_size,
                max_dbs=len(DB_NAMES) + 8,  # headroom for named databases added later
                max_readers=512,
                sync=True,
                metasync=True,
                writemap=False,
                readahead=False,
                readonly=readonly,
                mode=0o600,
            )
            # Another process may have grown the map already; adopt its size.
            self.env.set_mapsize(0)
            if readonly:
                dbs = {name: self.env.open_db(name.encode(), create=False) for name in DB_NAMES}
            else:
                with self.env.begin(write=True) as txn:
                    dbs = {name: self.env.open_db(name.encode(), txn=txn) for name in DB_NAMES}
        self.dbs = Databases(**dbs)
        if not readonly:
            try:
                self._check_format()
            except BaseException:
                # py-lmdb refuses to reopen a directory this process still holds open
                self.env.close()
                raise
        self.node_id = self._meta_get(b"node_id").decode()
        # The files this process has open, to tell when one is removed or
        # replaced under it: writes would then go to a file nobody will read.
        self._open_files = {name: os.stat(self.path / name) for name in DATA_FILES} if not readonly else {}

    # -- format marker and migrations -------------------------------------

    def _check_format(self) -> None:
        with mapped_lmdb_errors(), self.env.begin(write=True) as txn:
            raw = txn.get(b"format", db=self.dbs.meta)
            if raw is None and not self._has_data(txn):
                txn.put(b"format", str(FORMAT_VERSION).encode(), db=self.dbs.meta)
                txn.put(b"node_id", secrets.token_hex(4).encode(), db=self.dbs.meta)
                return
            # Data without a marker was written before the marker existed: format 0.
            version = parse_format(raw, self.path)
            newer = newer_format_problem(self.path, version)
            if newer is not None:
                raise FormatError(newer)
            while version < FORMAT_VERSION:
                migrate = MIGRATIONS.get(version)
                if migrate is None:
                    raise FormatError(f"no migration from storage format {version}")
                migrate(txn, self.dbs)
                version += 1
                txn.put(b"format", str(version).encode(), db=self.dbs.meta)

    def _has_data(self, txn: lmdb.Transaction) -> bool:
        return any(txn.stat(db)["entries"] for db in (self.dbs.keys, self.dbs.outbox))

    def format_version(self) -> int:
        return int(self._meta_get(b"format") or b"0")

    def _meta_get(self, key: bytes) -> bytes:
        with mapped_lmdb_errors(), self.env.begin() as txn:
            value = txn.get(key, db=self.dbs.meta)
        return bytes(value) if value is not None else b""

    # -- reads ------------------------------------------------------------

    def read(self) -> lmdb.Transaction:
        """A read transaction; use as a context manager and keep it short."""
        try:
            return self.env.begin(buffers=False)
        except lmdb.MapResizedError:
            self.adopt_map_size()
            return self.env.begin(buffers=False)

    # -- writes outside the writer ------------------------------------------

    def write_transaction(self, body: Callable[[lmdb.Transaction], _T]) -> _T:
        """Run `body` in a durable write transaction of its own; StorageError on failure.

        For operator commands and start-up (the service's writes go through the
        group-commit writer): a full map is grown, and a map another process
        grew meanwhile (`serve` taking events beside the command) is adopted,
        then `body` runs again from the start.
        """
        with mapped_lmdb_errors(str(self.path)):
            while True:
                try:
                    with self._resize_lock, self.env.begin(write=True) as txn:
                        return body(txn)
                except lmdb.MapFullError:
                    if not self.grow():
                        raise
                except lmdb.MapResizedError:
                    self.adopt_map_size()

    # -- map growth ---------------------------------------------------------

    def write_guard(self) -> threading.Lock:
        """Hold while a write transaction is open in this process (no resize meanwhile)."""
        return self._resize_lock

    def adopt_map_size(self) -> None:
        """Adopt the map size another process grew the environment to.

        Several processes (`serve --workers N`) share one environment. When one
        grows the map, the others' next transaction that reaches past their own
        mapping fails with MapResizedError; `set_mapsize(0)` re-reads the size
        from the environment. Same rule as `grow`: no transaction of this
        process may be open.
        """
        with self._resize_lock, mapped_lmdb_errors():
            self.env.set_mapsize(0)

    def grow(self) -> bool:
        """Double the map; False when it cannot grow any more.

        Must be called with no transaction of this process open (the writer
        calls it between transactions, on the thread that runs reads). Another
        process may have grown the map already: adopt its size first, and
        only double when that did not make room.
        """
        with self._resize_lock:
            before = self.env.info()["map_size"]
            with mapped_lmdb_errors():
                self.env.set_mapsize(0)
            current = self.env.info()["map_size"]
            if current > before:
                return True
            # set_mapsize(0) takes the size recorded by the last commit, which is
            # smaller than ours while one transaction needs several doublings
            current = max(current, before)
            if current >= self.max_map_size:
                return False
            with mapped_lmdb_errors():
                self.env.set_mapsize(min(current * 2, self.max_map_size))
            return True

    def clear_stale_readers(self) -> int:
        """Free the reader slots of processes that died holding a read transaction; how many.

        A reader left by a `collector check` killed with -9 pins the snapshot it
        read: LMDB cannot reuse any page freed after it, so the file grows with
        every write until the slot is cleared.
        """
        with mapped_lmdb_errors():
            return int(self.env.reader_check())

    def free_pages_at_cap(self, txn: lmdb.Transaction) -> tuple[int, int] | None:
        """(pages holding no live data, pages in all) when the map is at `max_map_size`; None below it.

        Every tree's pages (branch, leaf, overflow) are live; the rest of a map at
        its cap is the free list, reusable once no reader needs it. (py-lmdb does
        not expose the free list itself; its own few pages are counted as free.)
        """
        map_size = self.env.info()["map_size"]
        if map_size < self.max_map_size:
            return None
        stats = [txn.stat(getattr(self.dbs, name)) for name in DB_NAMES]
        stats.append(self.env.stat())  # the main tree, which names the others
        live = sum(s["branch_pages"] + s["leaf_pages"] + s["overflow_pages"] for s in stats)
        capacity = map_size // stats[-1]["psize"]
        return capacity - live - 2, capacity  # (less the two meta pages)

    def reads_short_of_reserve(self, margin: int = 0) -> bool:
        """short_of_reserve, in a read transaction of its own (for readiness)."""
        with mapped_lmdb_errors(), self.read() as txn:
            return self.short_of_reserve(txn, margin)

    def short_of_reserve(self, txn: lmdb.Transaction, margin: int = 0) -> bool:
        """True when the map is at its cap with fewer free pages than it keeps for the
        jobs that make room (RESERVE_PAGES, or 1% of the map when more: see
        storage.writer), and `margin` more."""
        at_cap = self.free_pages_at_cap(txn)
        if at_cap is None:
            return False
        free, capacity = at_cap
        return free < max(RESERVE_PAGES, capacity // 100) + margin

    def usage(self) -> tuple[int, int]:
        """(map size, bytes used) for the metrics gauges."""
        info = self.env.info()
        used = (info["last_pgno"] + 1) * self.env.stat()["psize"]
        return info["map_size"], used

    def writable(self, min_free_bytes: int = 1024 * 1024) -> bool:
        """True while the data directory can take writes: open, writable, space left."""
        try:
            stat = os.statvfs(self.path)
        except OSError:
            return False
        return (
            self.files_intact() is None
            # the data file, not the directory: LMDB writes only into its files
            # (a read-only directory around writable files serves fine)
            and os.access(self.path / "data.mdb", os.W_OK)
            and usable_bytes(stat) >= min_free_bytes
        )

    def files_intact(self) -> str | None:
        """None while the environment's files are the ones this process opened; else what changed.

        A data.mdb removed (or replaced) while serving still takes commits,
        into an inode that is gone at the next start: the writer refuses to
        commit instead, and readiness turns 503.
        """
        for name, opened in self._open_files.items():
            try:
                now = os.stat(self.path / name)
            except FileNotFoundError:
                return f"{self.path / name} was removed while the collector had it open; restart it"
            except OSError as exc:
                return f"{self.path / name}: {exc.strerror}"
            if (now.st_dev, now.st_ino) != (opened.st_dev, opened.st_ino):
                return f"{self.path / name} was replaced while the collector had it open; restart it"
        return None

    def close(self) -> None:
        self.env.close()


DATA_FILES = ("data.mdb", "lock.mdb")


def _owner_only(path: Path) -> None:
    """Take group and other access off the data directory and its LMDB files (an older version's)."""
    for target in (path, *(path / name for name in DATA_FILES)):
        try:
            mode = target.stat().st_mode
            if mode & 0o077:
                target.chmod(mode & 0o7700)
        except FileNotFoundError:
            continue
        except PermissionError:
            continue  # not ours to change (read by another user): leave it
