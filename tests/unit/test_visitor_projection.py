"""The visitor fold and the FoldVisitors job over a real LMDB outbox."""

from __future__ import annotations

import json
from pathlib import Path

from storage import outbox
from storage.env import Storage
from storage.visitors import CURSOR, FoldVisitors, fold, iter_visitors
from storage.writer import WriteContext


def test_fold_takes_the_majority_and_the_most_frequent_category() -> None:
    record = None
    for is_bot, category in [(False, "human"), (True, "automation"), (False, "human")]:
        record = fold(record, 1000, is_bot, category)
    assert record is not None and not record.is_bot and record.category == "human"
    for is_bot, category in [(True, "tool"), (True, "automation")]:
        record = fold(record, 2000, is_bot, category)
    assert record.is_bot and record.category == "automation"  # 2 automation, 1 tool
    assert (record.events, record.bot_events, record.first_ms, record.last_ms) == (5, 3, 1000, 2000)
    tied = fold(fold(None, 5, True, "tool"), 6, True, "crawler")
    assert tied.category == "crawler"  # a tie goes to the latest


def _append(storage: Storage, seq: int, visitor: str, event_type: str, bot: dict[str, object] | None) -> None:
    event = {"type": event_type, "visitorId": visitor, "receivedAt": 1000 + seq}
    if bot is not None:
        event["bot"] = bot
    record = outbox.OutboxRecord(f"rcpt_x{seq:012x}", "acme", "web", f"e{seq}", 1000 + seq, "browser",
                                 json.dumps(event).encode())
    with storage.env.begin(write=True) as txn:
        txn.put(outbox.seq_key(seq), outbox.encode(record), db=storage.dbs.outbox)
        txn.put(outbox.NEXT_SEQ, (seq + 1).to_bytes(8, "big"), db=storage.dbs.meta)


def _fold(storage: Storage, batch: int):
    with storage.env.begin(write=True) as txn:
        return FoldVisitors(batch).run(WriteContext(txn, storage, 0, 0))


def test_fold_job_resumes_from_its_cursor_and_skips_consent(tmp_path: Path) -> None:
    storage = Storage(tmp_path)
    try:
        bot = {"isBot": True, "category": "ai_crawler"}
        human = {"isBot": False, "category": "human"}
        _append(storage, 1, "crawler", "pageview", bot)
        _append(storage, 2, "crawler", "pageview", bot)
        _append(storage, 3, "person", "pageview", human)
        _append(storage, 4, "person", "_consent_transition", None)
        first = _fold(storage, batch=2)
        assert (first.folded, first.cursor, first.more) == (2, 2, True)
        second = _fold(storage, batch=2)
        assert (second.folded, second.cursor, second.more) == (2, 4, True)
        assert _fold(storage, batch=2).folded == 0  # caught up: nothing read, nothing written
        with storage.read() as txn:
            assert int.from_bytes(txn.get(CURSOR.encode(), db=storage.dbs.cursors), "big") == 4
        [(_, _, crawler)] = iter_visitors(storage, "crawler")
        assert crawler.is_bot and crawler.category == "ai_crawler" and crawler.events == 2
        [(_, _, person)] = iter_visitors(storage, "person", "acme")
        assert not person.is_bot and person.events == 1  # the consent transition is not counted
        assert list(iter_visitors(storage, "person", "other")) == []
    finally:
        storage.close()
