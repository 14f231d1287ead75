"""Is this path a collector data directory? Decided before `Storage` opens (and writes to) it.

`Storage` opens its environment read-write: it creates `data.mdb` and
`lock.mdb`, its named databases and the format marker. Pointed at the wrong
place (a typo, a foreign LMDB environment) that would write into someone
else's directory. So every command looks first, without writing anything:

- the path must be a directory (or, for a command that creates one, absent
  with enough free space where it will be); an empty `data.mdb` (a first
  start that stopped before LMDB wrote it) counts as absent;
- `data.mdb` must be an LMDB environment;
- its main database must name only databases of a collector: `meta` (any
  format version; the format check itself is `Storage`'s), or some of the
  others (format 0, before the marker existed), or nothing yet (a directory
  whose first start stopped early). Read commands also need `meta`: an
  environment without data would look like an empty store.
"""

from __future__ import annotations

import os
from pathlib import Path

import lmdb

from storage.env import DB_NAMES as _DB_NAMES

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
        env = lmdb.open(str(path), readonly=True, lock=has_lock, max_dbs=0, create=False, map_size=map_size)
    except lmdb.InvalidError as exc:
        return f"{path} is not an LMDB environment ({exc})"
    except lmdb.Error as exc:
        return f"{path} cannot be opened as an LMDB environment ({exc})"
    try:
        with env.begin() as txn:
            names = {bytes(key).decode("utf-8", "replace") for key, _ in txn.cursor()}
    except lmdb.MapResizedError:
        return None  # it grew past twice its size meanwhile: a live environment; Storage decides
    except lmdb.Error as exc:
        return f"{path} holds an LMDB environment that cannot be read ({exc})"
    finally:
        env.close()
    foreign = sorted(names - DB_NAMES)
    if foreign and "meta" not in names:
        shown = ", ".join(repr(name) for name in foreign[:3])
        return f"{path} holds an LMDB environment that is not a collector's (it has {shown})"
    if not create and "meta" not in names:
        return f"no collector data in {path} (a wrong --data-dir or COLLECTOR_DATA_DIR?)"
    return None
