"""What this process just committed to the outbox, handed to a consumer in memory.

The visitor projection tails the outbox from its cursor. Reading its rows back
costs one py-lmdb call per event, and py-lmdb releases the GIL on every call:
on the writer thread, next to a busy event loop, each call waits for the GIL
again, so a pass over 2,048 rows took tens of milliseconds and held every
admission in its group for as long (the p99 at half load). The admission
already had the facts the fold needs; after its transaction commits the writer
appends them here, and the fold takes them from here when they continue its
cursor exactly.

Anything else (another worker process appended in between, the feed dropped
old entries, a fold that took entries aborted, a restart) leaves a gap
between the cursor and the feed's head, and the fold reads the outbox
instead. So the feed is only ever a shortcut: the outbox stays the truth.
Used on the writer thread only (the writer appends, the fold job takes).
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple


class Appended(NamedTuple):
    """One admission's new outbox records: seqs first_seq .. first_seq + len(candidates) - 1."""

    first_seq: int
    client_id: str
    site_id: str
    key_type: str
    committed_ms: int
    candidates: Sequence[Any]  # storage.admission.Candidate, in seq order

    @property
    def last_seq(self) -> int:
        return self.first_seq + len(self.candidates) - 1


class CommitFeed:
    def __init__(self, max_entries: int = 4096) -> None:
        self.max_entries = max_entries
        self._entries: collections.deque[Appended] = collections.deque()

    def __len__(self) -> int:
        return len(self._entries)

    def extend(self, committed: Iterable[Appended]) -> None:
        """Entries of one committed transaction, in seq order."""
        entries = self._entries
        entries.extend(committed)
        while len(entries) > self.max_entries:  # a consumer that lags reads the outbox instead
            entries.popleft()

    def take(self, after: int, limit: int) -> list[Appended] | None:
        """Whole entries continuing seq `after` (about `limit` records), or None for a gap."""
        entries = self._entries
        while entries and entries[0].last_seq <= after:
            entries.popleft()  # already folded (from the outbox)
        if not entries or entries[0].first_seq != after + 1:
            return None
        taken: list[Appended] = []
        expected, count = after + 1, 0
        while entries and entries[0].first_seq == expected and count < limit:
            entry = entries.popleft()
            taken.append(entry)
            expected, count = entry.last_seq + 1, count + len(entry.candidates)
        return taken
