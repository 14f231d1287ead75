"""Is this path a collector data directory? Decided before `Storage` opens (and writes to) it.

`Storage` opens its environment read-write: it creates `data.mdb` and
`lock.mdb`, its named databases and the format marker. Pointed at the wrong
place (a typo, a foreign LMDB environment) that would write into someone
else's directory. So every command looks first, without writing anything:

- the path must be a directory (or, for a command that creates one, absent
  with enough free space where it will be); an empty `data.mdb` (a first
  start that stopped before LMDB wrote it) counts as absent;
- `data.mdb` must be an LMDB environment;
- its main database must name only databases of a collector: `meta` and the
  others, or some of the others (format 0, before the marker existed), or
  nothing yet (a directory whose first start stopped early). A `meta` that
  holds anything holds the collector's node id. Another program's environment
  is refused even when it has a database called `meta`; one with databases a
  later collector added is refused as a later storage format, as `Storage`
  would. Read commands also need `meta`: an environment without data would
  look like an empty store.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

import lmdb

from storage.env import DB_NAMES as _DB_NAMES
from storage.env import newer_format_problem, parse_format
from storage.errors import FormatError

DB_NAMES = frozenset(_DB_NAMES)
# A new environment needs its lock file (about 40 KB, mapped: no space is a
# SIGBUS there) and its first pages; refuse to start one with less than this.
MIN_FREE_TO_CREATE = 4 * 1024 * 1024


def data_dir_problem(path: Path, *, create: bool) -> str | None:
    """Why `path` cannot be used as a data directory, or None. Writes nothing."""
    if path.exists() and not path.is_dir():
        return f"{path} is not a directory"
    data_file = path / "data.mdb"
    if not data_file.exists() or data_file.stat().st_size == 0:
        if not create:
            if not path.exists():
                return f"no data directory at {path} (a wrong --data-dir or COLLECTOR_DATA_DIR?)"
            return f"no collector data in {path} (no data.mdb, or an empty one: a wrong --data-dir?)"
        return _space_problem(path)
    if create and not os.access(data_file, os.R_OK | os.W_OK):  # (serve, tenants import: they write)
        return f"{data_file} is not readable and writable by this user (uid {os.geteuid()})"
    return _environment_problem(path, data_file, create=create)


def _space_problem(path: Path) -> str | None:
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        stat = os.statvfs(existing)
    except OSError as exc:
        return f"cannot inspect {existing}: {exc.strerror or exc}"
    free = stat.f_bavail * stat.f_frsize
    if free < MIN_FREE_TO_CREATE:
        return f"not enough free space to create a data directory in {path} ({free // 1024} KB free)"
    return None


def _environment_problem(path: Path, data_file: Path, *, create: bool) -> str | None:
    # Read-only and, unless a lock file is already there, without one: nothing is written.
    # The map has room past the file, as a serving collector may grow it meanwhile (a
    # map smaller than the file fails the read with MDB_MAP_RESIZED), but stays near its
    # size: a terabyte of address space fails under `ulimit -v` or systemd's LimitAS=.
    has_lock = (path / "lock.mdb").exists()
    map_size = 2 * data_file.stat().st_size + 64 * 1024 * 1024
    try:
        env = lmdb.open(str(path), readonly=True, lock=has_lock, max_dbs=1, create=False, map_size=map_size)
    except lmdb.InvalidError as exc:
        return f"{path} is not an LMDB environment ({exc})"
    except lmdb.Error as exc:
        return f"{path} cannot be opened as an LMDB environment ({exc})"
    try:
        return _shape_problem(path, env, create=create)
    except lmdb.MapResizedError:
        return None  # it grew past twice its size meanwhile: a live environment; Storage decides
    except lmdb.Error as exc:
        return f"{path} holds an LMDB environment that cannot be read ({exc})"
    finally:
        env.close()


class _Meta(NamedTuple):
    """What a collector reads first from its meta database."""

    empty: bool  # a first start that stopped before writing its format marker and node id
    format: bytes | memoryview | None
    node_id: bytes | memoryview | None


def _shape_problem(path: Path, env: lmdb.Environment, *, create: bool) -> str | None:
    """Why the environment's databases are not a collector's, or None."""
    not_ours = f"{path} holds an LMDB environment that is not a collector's"
    with env.begin() as txn:
        try:
            meta = _read_meta(env, txn)
        except lmdb.Error:
            return f"{not_ours} (its 'meta' is not a database)"
        # A collector's main database names its databases and nothing else. The
        # count is on the meta page: another program's millions of keys are not walked.
        entries = env.stat()["entries"]
        names = set() if entries > len(DB_NAMES) else {
            bytes(key).decode("utf-8", "replace") for key, _ in txn.cursor()
        }
    foreign = sorted(names - DB_NAMES)
    if entries > len(DB_NAMES) or foreign:
        newer = _newer_format(path, meta)
        if newer is not None:
            return newer  # a later collector's databases: its format says so plainly
        if foreign:
            return f"{not_ours} (it has {', '.join(repr(name) for name in foreign[:3])})"
        return f"{not_ours} ({entries} entries in its main database)"
    if meta is not None and not meta.empty and meta.node_id is None:
        # Every collector writes its node id with its first format marker.
        return f"{not_ours} (its meta database has no collector node id)"
    if not create and meta is None:
        return f"no collector data in {path} (a wrong --data-dir or COLLECTOR_DATA_DIR?)"
    return None


def _read_meta(env: lmdb.Environment, txn: lmdb.Transaction) -> _Meta | None:
    """The meta database's first entries, None when there is none; lmdb.Error when `meta` is no database."""
    try:
        meta = env.open_db(b"meta", txn=txn, create=False)
    except lmdb.NotFoundError:
        return None
    return _Meta(
        empty=not txn.stat(meta)["entries"],
        format=txn.get(b"format", db=meta),
        node_id=txn.get(b"node_id", db=meta),
    )


def _newer_format(path: Path, meta: _Meta | None) -> str | None:
    """Storage's own refusal when `meta` is a collector's of a later storage format, else None."""
    if meta is None or meta.node_id is None:
        return None
    try:
        version = parse_format(meta.format, path)
    except FormatError as exc:
        return str(exc)
    return newer_format_problem(path, version)
