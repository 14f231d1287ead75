"""The storage errors the pipeline knows; LMDB's own exceptions never leave `storage/`."""

from __future__ import annotations

import contextlib
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
    """Storage cannot serve: the caller answers 503 storage_unavailable."""


class StorageFull(StorageError):
    """A commit failed for lack of space (map cannot grow or disk full)."""


class WriterBusy(StorageError):
    """The writer's queue is full: back-pressure, answered at once with 503."""


class FormatError(StorageError):
    """The data directory holds a storage format this version cannot use."""


def is_full(exc: lmdb.Error) -> bool:
    """Whether LMDB failed for lack of room: a map at its cap, or a disk out of space."""
    message = str(exc)
    return isinstance(exc, lmdb.MapFullError | lmdb.DiskError) or any(
        sign in message for sign in ("No space left", "ENOSPC", "MDB_MAP_FULL")
    )


@contextlib.contextmanager
def mapped_lmdb_errors() -> Iterator[None]:
    """Map LMDB's exceptions to StorageError at the storage boundary (one table)."""
    try:
        yield
    except lmdb.Error as exc:
        raise (StorageFull if is_full(exc) else StorageError)(str(exc)) from exc
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
