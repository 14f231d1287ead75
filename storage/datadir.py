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
  nothing yet (a directory whose first start stopped early); each a database,
  not a plain value. `meta` holds both the format marker and the node id (a
  collector writes them in one transaction) or neither (format 0, or a first
  start that stopped early). Another program's environment is refused even
  when it has a database called `meta`. A later storage format is refused
  with `Storage`'s line, so that no command writes beside it (a rotated
  field key). Read commands also need `meta`: an environment without data
  would look like an empty store.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

import lmdb

from storage.env import DB_NAMES as _DB_NAMES
from storage.env import newer_format_problem, parse_format
from storage.errors import FormatError, usable_bytes

DB_NAMES = frozenset(_DB_NAMES)
# A new environment needs its lock file (about 40 KB, mapped: no space is a
# SIGBUS there) and its first pages; refuse to start one with less than this.
MIN_FREE_TO_CREATE = 4 * 1024 * 1024


def keep_directory_owner(
    path: Path, owner: os.stat_result | None = None, *, with_directory: bool = False, also: tuple[str, ...] = ()
) -> None:
    """Give the environment's files the data directory's owner (or `owner`'s) when root made them.

    An operator command run as root (the README allows it) created a root-owned
    0600 `lock.mdb` (or `data.mdb`) in the service's directory, which the service
    then could not open: its next start was refused (helper-89); a restore as root
    replaced the whole directory with a root-owned one (helper-92: `with_directory`,
    and `also`, paths under it such as the key file carried across, with the
    directories between). Best effort: root without CAP_CHOWN leaves them, as the
    service's own user never needs this.
    """
    if os.geteuid() != 0:
        return
    try:
        owner = owner or path.stat()
        if with_directory and path.stat().st_uid != owner.st_uid:
            os.chown(path, owner.st_uid, owner.st_gid)
    except OSError:
        return
    between = {str(parent) for name in also for parent in Path(name).parents if str(parent) != "."}
    for name in ("data.mdb", "lock.mdb", *sorted(between), *also):
        file = path / name
        try:
            if file.stat().st_uid != owner.st_uid:
                os.chown(file, owner.st_uid, owner.st_gid)
        except OSError:
            continue


def non_utf8_path_problem(what: str, path: Path) -> str | None:
    """Why `path` cannot be given to LMDB, which takes UTF-8 paths only, or None (helper-139:
    a name with bytes that are not UTF-8 ended in a traceback, and serve left it behind)."""
    try:
        os.fspath(path).encode("utf-8")
    except UnicodeEncodeError:
        return f"{what} {os.fspath(path)!r} is not valid UTF-8 (LMDB takes UTF-8 paths only): rename it"
    return None


def data_dir_problem(path: Path, *, create: bool) -> str | None:
    """Why `path` cannot be used as a data directory, or None. Writes nothing."""
    if (problem := non_utf8_path_problem("the data directory", path)) is not None:
        return problem
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
    free = usable_bytes(stat)
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
        env = lmdb.open(str(path), readonly=True, lock=has_lock, max_dbs=len(DB_NAMES), create=False,
                        map_size=map_size)
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
    """The keys a collector writes first into its meta database: both, or (format 0) neither."""

    format: bytes | memoryview | None
    node_id: bytes | memoryview | None


# Names are read to say which databases are extra; past this many main-database
# entries (another program's keys) they are counted, not walked.
_NAMES_SHOWN_UP_TO = 1000


def _shape_problem(path: Path, env: lmdb.Environment, *, create: bool) -> str | None:
    """Why the environment's databases are not a collector's, or None."""
    not_ours = f"{path} holds an LMDB environment that is not a collector's"
    entries = env.stat()["entries"]  # from the meta page: nothing walked yet
    with env.begin() as txn:
        names = set() if entries > _NAMES_SHOWN_UP_TO else {
            bytes(key).decode("utf-8", "replace") for key, _ in txn.cursor()
        }
        known = sorted(names & DB_NAMES)
        try:
            # Each of the collector's names must be a database (a plain value
            # would fail Storage's open); a flag mismatch is LMDB's "incompatible".
            for name in known:
                env.open_db(name.encode(), txn=txn, create=False)
        except lmdb.IncompatibleError:
            return f"{not_ours} (its {name!r} is not a database the collector made)"
        try:
            meta = _read_meta(env, txn) if "meta" in names or entries > _NAMES_SHOWN_UP_TO else None
        except lmdb.IncompatibleError:  # (names not walked: a plain value called meta)
            return f"{not_ours} (its 'meta' is not a database the collector made)"
    if meta is not None:
        if (meta.format is None) != (meta.node_id is None):
            # A collector writes both in one transaction (format 0 had neither).
            return f"{not_ours} (its meta database has a format marker or a node id without the other)"
        if meta.format is not None:
            try:
                newer = newer_format_problem(path, parse_format(meta.format, path))
            except FormatError as exc:
                return str(exc)
            if newer is not None:
                return newer  # Storage's own line, before any command writes (rotate-field-key's key file)
    extra = sorted(names - DB_NAMES)
    if entries > len(DB_NAMES) or extra:
        shown = ", ".join(repr(name) for name in extra[:3]) or f"{entries} entries in its main database"
        if meta is not None and meta.format is not None:
            return (f"{path} has databases this collector does not use ({shown}); if a later collector"
                    " wrote it, upgrade the collector")
        return f"{not_ours} ({shown})" if not extra else f"{not_ours} (it has {shown})"
    if not create and "meta" not in names:
        return f"no collector data in {path} (a wrong --data-dir or COLLECTOR_DATA_DIR?)"
    return None


def _read_meta(env: lmdb.Environment, txn: lmdb.Transaction) -> _Meta | None:
    """The format marker and node id in meta; None when there is no meta database."""
    try:
        meta = env.open_db(b"meta", txn=txn, create=False)
    except lmdb.NotFoundError:
        return None
    return _Meta(format=txn.get(b"format", db=meta), node_id=txn.get(b"node_id", db=meta))
