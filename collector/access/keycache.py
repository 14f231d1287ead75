"""In-process cache of key records over LMDB (spec 5.6).

Found keys are cached for `ttl` seconds (2 minutes), failed lookups for
`negative_ttl` (30 seconds), so a key imported while the service runs may
answer 401 for up to 30 seconds, and a revocation takes effect within 2
minutes. Suspension is faster (spec 5.6: about 60 seconds, at most 90): a
cached record's `suspended` flag is re-read from storage once it is
`suspension_ttl` (60 s) old. The cache is bounded; the oldest entries go first.
A key of a length no imported key has is answered unknown without an entry.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

import msgspec

from collector.access.tenants import KEY_MAX_CHARS, KEY_MIN_CHARS, KeyRecord, decode_record
from collector.errors import ServiceError
from storage import keys as key_store
from storage.env import Storage
from storage.errors import UNREADABLE_RECORD, StorageError


class KeyCacheStatistics(msgspec.Struct, frozen=True):
    entries: int
    hits: int
    misses: int
    read_failures: int


class KeyCache:
    def __init__(
        self,
        storage: Storage,
        *,
        ttl: float = 120.0,
        negative_ttl: float = 30.0,
        suspension_ttl: float = 60.0,
        max_entries: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._storage = storage
        self._ttl = ttl
        self._negative_ttl = negative_ttl
        self._suspension_ttl = min(suspension_ttl, ttl)
        self._max_entries = max_entries
        self._clock = clock
        # key -> (expires, record, when its suspension is next re-read)
        self._entries: OrderedDict[str, tuple[float, KeyRecord | None, float]] = OrderedDict()
        self._hits = self._misses = self._read_failures = 0

    def lookup(self, key: str) -> KeyRecord | None:
        """The live record for `key`, or None if unknown or revoked.

        Raises ServiceError("service_unavailable") when the key store cannot be read.
        """
        if not KEY_MIN_CHARS <= len(key) <= KEY_MAX_CHARS:
            # No such key can be imported: not looked up, and above all not cached. 80,000
            # random 30 KB keys (401 each, no key needed) held 1.5 GB here (helper-114).
            self._misses += 1
            return None
        now = self._clock()
        entry = self._entries.get(key)
        if entry is not None and entry[0] > now:
            self._hits += 1
            self._entries.move_to_end(key)  # least recently used first out (helper-127: hits kept their place)
            expires, record, recheck = entry
            if record is not None and recheck <= now:
                record = self._refresh_suspension(key, record)
                self._entries[key] = (expires, record, now + self._suspension_ttl)
            return record
        self._misses += 1
        record = self._read(key)
        if record is not None and record.revokedAt:
            record = None
        expires = now + (self._ttl if record is not None else self._negative_ttl)
        self._entries[key] = (expires, record, now + self._suspension_ttl)
        self._entries.move_to_end(key)
        if len(self._entries) > self._max_entries:
            self._entries.popitem(last=False)
        return record

    def _read(self, key: str) -> KeyRecord | None:
        try:
            raw = key_store.get_key(self._storage, key)
            return decode_record(raw) if raw is not None else None
        except (StorageError, *UNREADABLE_RECORD):
            self._read_failures += 1
            raise ServiceError(
                "service_unavailable", "the key configuration could not be read; retry shortly"
            ) from None

    def _refresh_suspension(self, key: str, cached: KeyRecord) -> KeyRecord:
        """The cached record with the stored suspension flags (the rest waits for the full ttl)."""
        try:
            stored = self._read(key)
        except ServiceError:
            return cached  # keep serving what is known; the next re-read may succeed
        if stored is None or (stored.suspended, stored.accountSuspended) == (
            cached.suspended, cached.accountSuspended
        ):
            return cached
        return msgspec.structs.replace(
            cached, suspended=stored.suspended, accountSuspended=stored.accountSuspended
        )

    def statistics(self) -> KeyCacheStatistics:
        return KeyCacheStatistics(
            len(self._entries), self._hits, self._misses, self._read_failures
        )
