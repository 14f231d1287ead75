"""The commit feed: the fold takes committed admissions' facts in memory, or reads the outbox."""

from __future__ import annotations

import json
from pathlib import Path

from storage import outbox
from storage.admission import Admission, Candidate
from storage.env import Storage
from storage.feed import Appended, CommitFeed
from storage.visitors import FoldResult, FoldVisitors
from storage.writer import WriteContext

Event = tuple[str, str, str, bool, str, int]  # eid, visitor, type, is_bot, category, client ms


def _admit(storage: Storage, feed: CommitFeed | None, events: list[Event], *, key_type: str = "browser",
           now_ms: int = 5000) -> None:
    """One admission in its own transaction; its facts reach `feed` only once it committed."""
    candidates = [
        Candidate(eid, eid.encode().ljust(16, b"#"),
                  json.dumps({"type": kind, "visitorId": visitor, "timestamp": ms,
                              "bot": {"isBot": is_bot, "category": category}}).encode(),
                  None, visitor, kind, is_bot, category, ms)
        for eid, visitor, kind, is_bot, category, ms in events
    ]
    job = Admission(client_id="acme", site_id="web", key_type=key_type, account="acme", period="2026-11",
                    candidates=candidates, window_ms=86_400_000, budget=lambda used, added: None,
                    units=("pageview", "coverage"))
    with storage.env.begin(write=True) as txn:
        raw = txn.get(outbox.NEXT_SEQ, db=storage.dbs.meta)
        ctx = WriteContext(txn, storage, int.from_bytes(raw, "big") if raw else 1, now_ms, feeding=True)
        job.run(ctx)
        txn.put(outbox.NEXT_SEQ, ctx.next_seq.to_bytes(8, "big"), db=storage.dbs.meta)
    if feed is not None and ctx.appended:
        feed.extend(ctx.appended)


def _fold(storage: Storage, feed: CommitFeed | None, batch: int = 100, *, commit: bool = True) -> FoldResult:
    txn = storage.env.begin(write=True)
    result = FoldVisitors(batch, feed).run(WriteContext(txn, storage, 0, 0))
    if commit:
        txn.commit()
    else:
        txn.abort()
    return result


def _visitors(storage: Storage) -> dict[bytes, bytes]:
    with storage.read() as txn:
        return {bytes(k): bytes(v) for k, v in txn.cursor(db=storage.dbs.visitors)}


BATCHES: list[list[Event]] = [
    [("a1", "p", "pageview", False, "human", 1000), ("a2", "p", "click", False, "human", 1100),
     ("a3", "p", "click", False, "human", 1200), ("a4", "bot", "pageview", True, "crawler", 1300)],
    [("b1", "p", "click", False, "human", 1300), ("b2", "p", "_consent_transition", False, "human", 1400),
     ("b3", "bot", "pageview", True, "ai_crawler", 1500)],
    [("c1", "q", "scroll", False, "human", 900)],
]


def test_folding_from_the_feed_equals_reading_the_outbox(tmp_path: Path) -> None:
    fed, read = Storage(tmp_path / "fed"), Storage(tmp_path / "read")
    try:
        feed = CommitFeed()
        for number, batch in enumerate(BATCHES):
            key_type = "mobile" if number == 2 else "browser"
            _admit(fed, feed, batch, key_type=key_type)
            _admit(read, None, batch, key_type=key_type)
        assert len(feed) == 3
        assert _fold(fed, feed) == FoldResult(8, 8, False, fed=True)
        assert _fold(read, None) == FoldResult(8, 8, False, fed=False)
        assert len(feed) == 0  # taken
        assert _visitors(fed) == _visitors(read) and len(_visitors(fed)) == 3
    finally:
        fed.close()
        read.close()


def test_a_gap_in_the_feed_falls_back_to_the_outbox(tmp_path: Path) -> None:
    storage, twin = Storage(tmp_path / "s"), Storage(tmp_path / "t")
    try:
        feed = CommitFeed()
        _admit(storage, feed, BATCHES[0])
        _admit(storage, None, BATCHES[1])  # another process appended: not in this feed
        _admit(storage, feed, BATCHES[2])
        for batch in BATCHES:
            _admit(twin, None, batch)
        # The feed starts at seq 1 and stops at 4: whole entries, then the gap.
        assert _fold(storage, feed, batch=2) == FoldResult(4, 4, True, fed=True)
        # seq 5 is not at the feed's head (8 is): the fold reads the outbox
        assert _fold(storage, feed, batch=3) == FoldResult(3, 7, True, fed=False)
        assert _fold(storage, feed) == FoldResult(1, 8, False, fed=True)  # the feed again
        assert _fold(twin, None) == FoldResult(8, 8, False)
        assert _visitors(storage) == _visitors(twin)
    finally:
        storage.close()
        twin.close()


def test_an_aborted_fold_loses_nothing(tmp_path: Path) -> None:
    storage, twin = Storage(tmp_path / "s"), Storage(tmp_path / "t")
    try:
        feed = CommitFeed()
        for batch in BATCHES:
            _admit(storage, feed, batch)
            _admit(twin, None, batch)
        _fold(storage, feed, commit=False)  # took the entries, then its transaction aborted
        assert len(feed) == 0
        assert _fold(storage, feed) == FoldResult(8, 8, False, fed=False)  # read back from the outbox
        _fold(twin, None)
        assert _visitors(storage) == _visitors(twin)
    finally:
        storage.close()
        twin.close()


def test_feed_take_keeps_to_whole_contiguous_entries_and_a_bound() -> None:
    def entry(first: int, count: int) -> Appended:
        return Appended(first, "c", "s", "browser", 0, [None] * count)

    feed = CommitFeed(max_entries=3)
    feed.extend([entry(1, 2), entry(3, 2), entry(5, 1)])
    assert feed.take(0, 3) == [entry(1, 2), entry(3, 2)]  # whole entries: 4 records for a limit of 3
    assert feed.take(4, 10) == [entry(5, 1)]
    feed.extend([entry(7, 1)])
    assert feed.take(5, 10) is None  # seq 6 is missing
    feed.extend([entry(8, 1), entry(9, 1), entry(10, 1)])  # the oldest is dropped past 3 entries
    assert len(feed) == 3 and feed.take(7, 10) == [entry(8, 1), entry(9, 1), entry(10, 1)]
    feed.extend([entry(11, 3)])
    assert feed.take(12, 10) is None  # the cursor is inside an entry: read the outbox
    assert feed.take(13, 10) is None and len(feed) == 0  # passed it: dropped
