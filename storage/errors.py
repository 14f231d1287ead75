"""The storage errors the pipeline knows; LMDB's own exceptions never leave `storage/`."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

import lmdb
import msgspec

# What decoding a damaged stored record raises: msgspec's DecodeError (and its
# ValidationError) for bytes that are not the record's shape, and a bare
# UnicodeDecodeError, which msgspec lets through for a string that is not
# UTF-8. A reader that must get past one bad record catches all of them.
# RecursionError: skipping a value nested hundreds of thousands deep (msgspec.Raw).
UNREADABLE_RECORD = (msgspec.DecodeError, UnicodeDecodeError, RecursionError)


class StorageError(Exception):
    """Storage cannot serve: the caller answers 503 storage_unavailable.

    `for_client`: what the 503 may tell a client, when the message (for the
    operator's log) says more than anyone holding a public key should learn.
    """

    def __init__(self, message: str = "", *, for_client: str | None = None) -> None:
        super().__init__(message)
        self.for_client = message if for_client is None else for_client


class StorageFull(StorageError):
    """A commit failed for lack of space (map cannot grow or disk full)."""


def map_at_cap(storage_max_map_size: int, detail: str = "") -> StorageFull:
    """The map is full and at `max_map_size_mb`: the operator is told which setting
    (helper-114: with 76 GB free on the disk, "the data directory is full" sent
    them to `df`)."""
    said = f"the data directory is full{detail}"
    cap_mb = storage_max_map_size // (1024 * 1024)
    return StorageFull(f"{said}: its LMDB map is at max_map_size_mb ({cap_mb}); raise it, or let retention"
                       " make room", for_client=said)


class WriterBusy(StorageError):
    """The writer's queue is full: back-pressure, answered at once with 503."""


class FormatError(StorageError):
    """The data directory holds a storage format this version cannot use."""


def is_full(exc: lmdb.Error, path: str | None = None) -> bool:
    """Whether LMDB failed for lack of room: a map at its cap, or a disk out of space.

    With `path` (the data directory), an I/O error on a disk with (almost) nothing
    left counts too: LMDB reports a write that came up short, which is how a
    filling disk shows, as EIO (helper-98: "Input/output error", and the
    retention sweep never took its full-map path).
    """
    message = str(exc)
    if isinstance(exc, lmdb.MapFullError | lmdb.DiskError) or any(
        sign in message for sign in ("No space left", "ENOSPC", "MDB_MAP_FULL")
    ):
        return True
    return path is not None and "Input/output error" in message and disk_nearly_full(path)


FULL_BELOW_BYTES = 1024 * 1024


def usable_bytes(stat: os.statvfs_result) -> int:
    """Bytes this process may still write on a file system: root may use the reserve.

    The one rule for "full" (/readyz, a commit's I/O error, a new data directory):
    /readyz once said 503 on a disk whose root reserve the service was writing into
    while every batch got 202 (helper-100).
    """
    return (stat.f_bfree if os.geteuid() == 0 else stat.f_bavail) * stat.f_frsize


def disk_nearly_full(path: str) -> bool:
    """Under 1 MiB left for this process on the filesystem holding `path`."""
    try:
        return usable_bytes(os.statvfs(path)) < FULL_BELOW_BYTES
    except OSError:
        return False


def storage_error(exc: lmdb.Error, path: str | None = None) -> StorageError:
    """LMDB's error as the storage error it is: StorageFull for lack of room (saying
    what an EIO then means), else StorageError with LMDB's message."""
    message = str(exc)
    if not is_full(exc, path):
        return StorageError(message)
    if "Input/output error" in message:
        # (the path is the operator's: a website key is public, helper-114)
        return StorageFull(f"{message}: the disk holding {path} is full (a write came up short)",
                           for_client=f"{message}: the disk holding the data directory is full")
    return StorageFull(message)


@contextlib.contextmanager
def mapped_lmdb_errors(path: str | None = None) -> Iterator[None]:
    """Map LMDB's exceptions to StorageError at the storage boundary (one table).

    `path`: the data directory, to tell a full disk from other I/O errors.
    """
    try:
        yield
    except lmdb.Error as exc:
        raise storage_error(exc, path) from exc
    except OSError as exc:
        raise StorageError(str(exc)) from exc


W = TypeVar("W")
R = TypeVar("R")


def readable_rows(
    rows: Iterable[tuple[W, R | Exception]], on_unreadable: Callable[[W, Exception], None] | None
) -> Iterator[tuple[W, R]]:
    """The rows a scan decoded; a row that did not decode goes to `on_unreadable`
    (where, error), or is raised without it. Called outside the read transaction."""
    for where, found in rows:
        if not isinstance(found, Exception):
            yield where, found
        elif on_unreadable is None:
            raise found
        else:
            on_unreadable(where, found)
