"""The fold at commit: a group folds its own appends before it commits, or leaves them to the catch-up."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from storage import outbox
from storage.admission import Admission, Candidate
from storage.env import Storage
from storage.visitors import (
    CURSOR,
    FoldAtCommit,
    FoldResult,
    FoldVisitors,
    fold_position,
    iter_visitors,
    visitor_key,
)
from storage.writer import AtCommit, GroupCommitWriter, WriteContext

Event = tuple[str, str, str, bool, str, int]  # eid, visitor, type, is_bot, category, client ms


def _job(events: list[Event], *, key_type: str = "browser") -> Admission:
    candidates = [
        Candidate(eid, eid.encode().ljust(16, b"#"),
                  json.dumps({"type": kind, "visitorId": visitor, "timestamp": ms,
                              "bot": {"isBot": is_bot, "category": category}}).encode(),
                  None, visitor, kind, is_bot, category, ms,
                  page=("s1", "/", 50.0, 3000.0) if kind == "scroll" else ("s1", "/", 0.0, 0.0) if kind == "pageview"
                  else None)
        for eid, visitor, kind, is_bot, category, ms in events
    ]
    return Admission(client_id="acme", site_id="web", key_type=key_type, account="acme", period="2026-11",
                     candidates=candidates, budget=lambda used, added: None,
                     units=("pageview", "coverage"))


def _admit(storage: Storage, fold: FoldAtCommit | None, events: list[Event], *, key_type: str = "browser") -> None:
    """One admission in its own transaction, folded at commit when `fold` is given."""
    with storage.env.begin(write=True) as txn:
        raw = txn.get(outbox.NEXT_SEQ, db=storage.dbs.meta)
        ctx = WriteContext(txn, storage, int.from_bytes(raw, "big") if raw else 1, 5000, feeding=fold is not None)
        _job(events, key_type=key_type).run(ctx)
        committed = fold(ctx) if fold is not None else None
        txn.put(outbox.NEXT_SEQ, ctx.next_seq.to_bytes(8, "big"), db=storage.dbs.meta)
    if committed is not None:
        committed()


def _catch_up(storage: Storage, batch: int = 100) -> FoldResult:
    with storage.env.begin(write=True) as txn:
        return FoldVisitors(batch).run(WriteContext(txn, storage, 0, 0))


async def _through_writer(storage: Storage, at_commit: AtCommit, batches: list[list[Event]]) -> GroupCommitWriter:
    """Submit every batch at once (they share groups) to a writer with `at_commit`; the stopped writer."""
    writer = GroupCommitWriter(storage)
    writer.at_commit = at_commit
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        async with trio.open_nursery() as clients:
            for batch in batches:
                clients.start_soon(writer.submit, _job(batch))
        nursery.cancel_scope.cancel()
    return writer


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


def test_folding_at_commit_equals_reading_the_outbox(tmp_path: Path) -> None:
    inline, read = Storage(tmp_path / "inline"), Storage(tmp_path / "read")
    try:
        fold = FoldAtCommit()
        for number, batch in enumerate(BATCHES):
            key_type = "mobile" if number == 2 else "browser"
            _admit(inline, fold, batch, key_type=key_type)
            _admit(read, None, batch, key_type=key_type)
        assert (fold.groups, fold.events, fold.skipped) == (3, 8, 0)
        assert fold_position(inline) == (8, 8)  # nothing left to catch up
        assert _catch_up(inline) == FoldResult(0, 8, False)
        assert fold_position(read) == (0, 8)
        assert _catch_up(read) == FoldResult(8, 8, False)
        assert _visitors(inline) == _visitors(read) and len(_visitors(inline)) == 3
        [(_, _, scroller)] = iter_visitors(inline, "q")
        assert [page[3:] for page in scroller.pages] == [(50.0, 3000.0)]
    finally:
        inline.close()
        read.close()


def test_a_group_behind_the_cursor_is_left_to_the_catch_up(tmp_path: Path) -> None:
    storage, twin = Storage(tmp_path / "s"), Storage(tmp_path / "t")
    try:
        fold = FoldAtCommit()
        _admit(storage, fold, BATCHES[0])  # seqs 1-4, folded
        _admit(storage, None, BATCHES[1])  # seqs 5-7: a process that did not fold them
        _admit(storage, fold, BATCHES[2])  # seq 8: the cursor is at 4, so not folded
        assert (fold.groups, fold.skipped) == (1, 1)
        assert fold_position(storage) == (4, 8)
        assert _catch_up(storage, batch=2) == FoldResult(2, 6, True)
        assert _catch_up(storage) == FoldResult(2, 8, False)
        _admit(storage, fold, [("d1", "q", "click", False, "human", 2000)])  # caught up: folded again
        assert fold.groups == 2 and fold_position(storage) == (9, 9)
        for batch in [*BATCHES, [("d1", "q", "click", False, "human", 2000)]]:
            _admit(twin, None, batch)
        assert _catch_up(twin) == FoldResult(9, 9, False)
        assert _visitors(storage) == _visitors(twin)
    finally:
        storage.close()
        twin.close()


async def test_the_writer_folds_every_group_before_it_commits(tmp_path: Path) -> None:
    storage = Storage(tmp_path)
    fold = FoldAtCommit()
    try:
        await _through_writer(storage, fold, BATCHES)
        assert fold_position(storage) == (8, 8)
        assert fold.events == 8 and fold.skipped == 0
        assert len(_visitors(storage)) == 3
    finally:
        storage.close()


async def test_a_failing_fold_never_fails_the_admissions(tmp_path: Path) -> None:
    storage = Storage(tmp_path)
    calls = []

    def broken(ctx: WriteContext) -> None:
        calls.append(len(ctx.appended or []))
        raise RuntimeError("a bug in the fold")

    try:
        await _through_writer(storage, broken, BATCHES[:1])
        assert calls == [1]
        # committed, not folded: the catch-up finds the events in the outbox
        assert fold_position(storage) == (0, 4)
        with storage.read() as txn:
            assert txn.get(CURSOR.encode(), db=storage.dbs.cursors) is None
        assert _catch_up(storage) == FoldResult(4, 4, False)
    finally:
        storage.close()


def test_a_catch_up_inside_the_group_does_not_stop_the_fold_at_commit(tmp_path: Path) -> None:
    storage, twin = Storage(tmp_path / "s"), Storage(tmp_path / "t")
    try:
        _admit(storage, None, BATCHES[0])  # seqs 1-4, not folded: the cursor is behind
        fold = FoldAtCommit()
        # One group: an admission, the catch-up job (it folds seqs 1-7 from the
        # outbox, including the admission before it), another admission.
        with storage.env.begin(write=True) as txn:
            raw = txn.get(outbox.NEXT_SEQ, db=storage.dbs.meta)
            ctx = WriteContext(txn, storage, int.from_bytes(raw, "big"), 5000, feeding=True)
            _job(BATCHES[1]).run(ctx)
            assert FoldVisitors(100).run(ctx) == FoldResult(7, 7, False)
            _job(BATCHES[2]).run(ctx)
            committed = fold(ctx)
            txn.put(outbox.NEXT_SEQ, ctx.next_seq.to_bytes(8, "big"), db=storage.dbs.meta)
        assert committed is not None
        committed()
        assert (fold.groups, fold.events, fold.skipped) == (1, 1, 0)  # seq 8 alone
        assert fold_position(storage) == (8, 8)
        for batch in BATCHES:
            _admit(twin, None, batch)
        _catch_up(twin)
        assert _visitors(storage) == _visitors(twin)
    finally:
        storage.close()
        twin.close()


async def test_an_lmdb_error_in_the_fold_redoes_the_group_without_it(tmp_path: Path) -> None:
    storage = Storage(tmp_path)
    calls = []

    def too_long_a_key(ctx: WriteContext) -> None:
        calls.append(len(ctx.appended or []))
        ctx.txn.put(b"k" * 600, b"v", db=ctx.dbs.visitors)  # MDB_BAD_VALSIZE

    try:
        writer = await _through_writer(storage, too_long_a_key, BATCHES)
        assert calls and writer.healthy
        stats = writer.statistics()
        assert stats.jobs_committed == 3 and stats.jobs_failed == 0
        assert fold_position(storage) == (0, 8)  # committed, left to the catch-up
        assert _visitors(storage) == {}
    finally:
        storage.close()


def test_a_fold_counts_only_once_its_transaction_commits(tmp_path: Path) -> None:
    storage = Storage(tmp_path)
    try:
        fold = FoldAtCommit()
        with storage.env.begin(write=True) as txn:
            ctx = WriteContext(txn, storage, 1, 5000, feeding=True)
            _job(BATCHES[0]).run(ctx)
            assert fold(ctx) is not None
            txn.abort()  # as the writer does when the commit fails or the group is redone
        assert (fold.groups, fold.events, fold.skipped) == (0, 0, 0)
        _admit(storage, fold, BATCHES[0])
        assert (fold.groups, fold.events, fold.skipped) == (1, 4, 0)
    finally:
        storage.close()


def _damage(storage: Storage, visitor: str, value: bytes = b"garbage") -> None:
    with storage.env.begin(write=True) as txn:
        txn.put(visitor_key("acme", "web", visitor), value, db=storage.dbs.visitors)


def test_a_visitor_record_that_does_not_decode_is_folded_afresh_at_commit(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # It used to fail the fold of every group holding that visitor, so the
    # cursor fell behind and every later group of every visitor was skipped.
    storage = Storage(tmp_path)
    try:
        fold = FoldAtCommit()
        _admit(storage, fold, BATCHES[0])  # p and bot
        _damage(storage, "p")
        later = [("n1", "p", "click", False, "human", 5000), ("n2", "bot", "pageview", True, "crawler", 5100)]
        _admit(storage, fold, later)
        assert (fold.groups, fold.skipped, fold.rebuilt) == (2, 0, 1)
        assert fold_position(storage) == (6, 6)
        [record] = [r for c, s, r in iter_visitors(storage, "p")]
        assert (record.events, record.types) == (1, {"click": 1})  # the new event alone
        [record] = [r for c, s, r in iter_visitors(storage, "bot")]
        assert record.events == 2  # the other visitor folds on as before
        assert caplog.text.count("visitor record acme/web/p did not decode") == 1
        _admit(storage, fold, [("n3", "p", "click", False, "human", 5200)])
        assert fold.rebuilt == 1 and caplog.text.count("did not decode") == 1  # once: it decodes now
    finally:
        storage.close()


def test_the_catch_up_folds_a_visitor_record_that_does_not_decode_afresh(tmp_path: Path) -> None:
    storage = Storage(tmp_path)
    try:
        _admit(storage, None, BATCHES[0])
        _damage(storage, "p", b"\x9b\xff")  # the start of an array, then bytes that are no record
        assert _catch_up(storage) == FoldResult(4, 4, False, ("acme/web/p",))
        [record] = [r for c, s, r in iter_visitors(storage, "p")]
        assert record.types == {"pageview": 1, "click": 2}
    finally:
        storage.close()
