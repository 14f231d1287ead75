"""The visitor fold and the FoldVisitors job over a real LMDB outbox."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from storage import outbox
from storage.admission import Admission, Candidate
from storage.env import Storage
from storage.visitors import (
    CURSOR,
    MAX_PAGES,
    FoldResult,
    FoldVisitors,
    VisitorEvent,
    VisitorRecord,
    VisitorView,
    fold,
    iter_visitors,
    merge,
    read_visitor,
    visitor_key,
)
from storage.writer import WriteContext, run_job_now


def test_fold_takes_the_majority_and_the_most_frequent_category() -> None:
    record = None
    for is_bot, category in [(False, "human"), (True, "automation"), (False, "human")]:
        record = fold(record, VisitorEvent(1000, is_bot, category))
    assert record is not None and not record.is_bot and record.category == "human"
    for is_bot, category in [(True, "tool"), (True, "automation")]:
        record = fold(record, VisitorEvent(2000, is_bot, category))
    assert record.is_bot and record.category == "automation"  # 2 automation, 1 tool
    assert (record.events, record.bot_events, record.first_ms, record.last_ms) == (5, 3, 1000, 2000)
    tied = fold(fold(None, VisitorEvent(5, True, "tool")), VisitorEvent(6, True, "crawler"))
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


def _admit(storage: Storage, events: list[tuple[str, str, str, bool, str]], now_ms: int) -> None:
    """Admit (eid, visitor, type, is_bot, category) events with their facts, as the pipeline does."""
    candidates = []
    for eid, visitor, event_type, is_bot, category in events:
        stored = json.dumps(
            {"type": event_type, "visitorId": visitor, "receivedAt": now_ms - 3,
             "bot": {"isBot": is_bot, "category": category}}
        ).encode()
        candidates.append(
            Candidate(eid, eid.encode().ljust(16, b"#"), stored, None, visitor, event_type, is_bot, category)
        )
    job = Admission(client_id="acme", site_id="web", key_type="browser", account="acme", period="2026-11",
                    candidates=candidates, budget=lambda used, added: None,
                    units=("pageview", "coverage"))
    run_job_now(storage, job, now_ms=now_ms)


def _append_old_format(storage: Storage, seq: int, visitor: str, bot: dict[str, object], **extra: object) -> None:
    """A record exactly as written before records carried facts: a 7-element array."""
    event = json.dumps({"type": "click", "visitorId": visitor, "receivedAt": 500 + seq, "bot": bot, **extra}).encode()
    raw = msgspec.msgpack.encode((f"rcpt_x{seq:012x}", "acme", "web", f"old{seq}", 900 + seq, "browser", event))
    assert outbox.decode(raw).visitor_id is None  # what the fold sees for an old record
    with storage.env.begin(write=True) as txn:
        txn.put(outbox.seq_key(seq), raw, db=storage.dbs.outbox)
        txn.put(outbox.NEXT_SEQ, (seq + 1).to_bytes(8, "big"), db=storage.dbs.meta)


def test_old_records_fold_from_their_event_and_new_ones_from_their_facts(tmp_path: Path) -> None:
    storage = Storage(tmp_path)
    try:
        _append_old_format(storage, 1, "crawler", {"isBot": True, "category": "tool"})
        _append_old_format(storage, 2, "person", {"isBot": False, "category": "human"})
        _admit(storage, [("n1", "crawler", "pageview", True, "ai_crawler"),
                         ("n2", "crawler", "click", True, "ai_crawler"),
                         ("n3", "person", "_consent_transition", False, "human"),
                         ("n4", "person", "scroll", False, "human")], now_ms=5000)
        with storage.read() as txn:
            facts = outbox.decode(txn.get(outbox.seq_key(3), db=storage.dbs.outbox))
        assert (facts.visitor_id, facts.event_type, facts.is_bot, facts.bot_category) == (
            "crawler", "pageview", True, "ai_crawler")
        result = _fold(storage, batch=100)
        assert (result.folded, result.cursor, result.more) == (6, 6, False)
        [(_, _, crawler)] = iter_visitors(storage, "crawler")
        # old: receivedAt of the event; new: the commit time the record carries
        assert (crawler.first_ms, crawler.last_ms, crawler.events, crawler.bot_events) == (501, 5000, 3, 3)
        assert crawler.categories == {"tool": 1, "ai_crawler": 2} and crawler.category == "ai_crawler"
        [(_, _, person)] = iter_visitors(storage, "person")
        assert (person.events, person.bot_events, person.is_bot) == (2, 0, False)  # consent not counted
    finally:
        storage.close()


def test_page_facts_fold_from_new_and_old_records(tmp_path: Path) -> None:
    storage = Storage(tmp_path)
    try:
        # Before facts: the page is read from the event itself.
        _append_old_format(storage, 1, "reader", {"isBot": False, "category": "human"},
                           type="scroll", sessionId="s1", page={"path": "/a"}, depth=50, timeOnPage=6000,
                           timestamp=2000)
        # With facts but before the page fact (review of ecdb3f4): read from the event too.
        event = json.dumps({"type": "scroll", "visitorId": "reader", "sessionId": "s1", "page": {"path": "/b"},
                            "depth": 25, "timeOnPage": 1000}).encode()
        facts = ("rcpt_x000000000002", "acme", "web", "e2", 3000, "browser", event, "reader", "scroll",
                 False, "human", 3000)
        # With the page fact: trusted as it is.
        fields = ("rcpt_x000000000003", "acme", "web", "e3", 4000, "browser", b"{}", "reader", "scroll",
                  False, "human", 4000, ("s1", "/a", 75.0, 9000.0))
        # A fact of another shape (a development build's (depth, time)): the event is read.
        event = json.dumps({"type": "scroll", "visitorId": "reader", "sessionId": "s2", "page": {"path": "/c"},
                            "depth": 90, "timeOnPage": 500}).encode()
        bent = ("rcpt_x000000000004", "acme", "web", "e4", 5000, "browser", event, "reader", "scroll",
                False, "human", 5000, (90.0, 500.0))
        with storage.env.begin(write=True) as txn:
            txn.put(outbox.seq_key(2), outbox.encode_fields(facts), db=storage.dbs.outbox)
            txn.put(outbox.seq_key(3), outbox.encode_fields(fields), db=storage.dbs.outbox)
            txn.put(outbox.seq_key(4), outbox.encode_fields(bent), db=storage.dbs.outbox)
            txn.put(outbox.NEXT_SEQ, (5).to_bytes(8, "big"), db=storage.dbs.meta)
        assert _fold(storage, batch=10).folded == 4
        [(_, _, record)] = iter_visitors(storage, "reader")
        assert sorted(page[3:] for page in record.pages) == [(25.0, 1000.0), (75.0, 9000.0), (90.0, 500.0)]
        assert record.types == {"scroll": 4}
    finally:
        storage.close()


def test_facts_are_trusted_without_parsing_the_event(tmp_path: Path) -> None:
    # The fold reads the record's facts, not the event: an event that does not
    # even parse still folds (check reports facts that disagree with the event).
    storage = Storage(tmp_path)
    try:
        raw = outbox.encode(outbox.OutboxRecord("rcpt_x000000000001", "acme", "web", "e1", 7, "browser",
                                                b"not json", "v1", "click", True, "tool"))
        with storage.env.begin(write=True) as txn:
            txn.put(outbox.seq_key(1), raw, db=storage.dbs.outbox)
            txn.put(outbox.NEXT_SEQ, (2).to_bytes(8, "big"), db=storage.dbs.meta)
        assert _fold(storage, batch=10).folded == 1
        [(_, _, record)] = iter_visitors(storage, "v1")
        assert record.is_bot and record.category == "tool" and record.first_ms == 7
    finally:
        storage.close()


events = st.lists(
    st.builds(
        VisitorEvent,
        st.integers(0, 50),
        st.booleans(),
        st.sampled_from(["tool", "crawler", "ai_crawler"]),
        st.sampled_from(["pageview", "click", "scroll", "form"]),
        st.booleans(),
        st.integers(0, 5000),
        st.one_of(st.none(), st.tuples(st.sampled_from(["s1", "s2"]), st.sampled_from(["/a", "/b", "/c"]),
                                       st.floats(0, 100), st.floats(0, 1e7))),
    ),
    min_size=1, max_size=12,
)


def _fold_each(record: VisitorRecord | None, batch: list[VisitorEvent]) -> VisitorRecord | None:
    for event in batch:
        record = fold(record, event)
    return record


@given(earlier=st.one_of(st.just([]), events), batch=events)
def test_merging_a_batch_equals_folding_one_event_at_a_time(
    earlier: list[VisitorEvent], batch: list[VisitorEvent]
) -> None:
    # Everything a later event depends on (the click burst) must live in the
    # record, or a batch split across fold passes would count differently.
    stored = _fold_each(None, earlier)
    assert merge(stored, batch) == _fold_each(stored, batch)


def test_rage_clicks_are_the_third_and_later_clicks_of_a_burst() -> None:
    def click(ms: int) -> VisitorEvent:
        return VisitorEvent(1, False, "human", "click", False, ms)

    # 5 clicks 200 ms apart (3 rage), a pause, 2 clicks (none), a pageview between
    # clicks does not break a burst, a clock that goes back starts a new one.
    times = [1000, 1200, 1400, 1600, 1800, 5000, 5300]
    record = merge(None, [click(ms) for ms in times])
    assert (record.rage_clicks, record.types) == (3, {"click": 7})
    record = merge(record, [VisitorEvent(1, False, "human", "pageview"), click(5600)])
    assert record.rage_clicks == 4  # 5000, 5300, 5600: a third click within the gap
    record = merge(record, [click(100), click(300)])
    assert record.rage_clicks == 4 and record.click_burst == 2
    # A click of unknown time (records from before times were kept carry 0)
    # ends the burst and is never a rage click.
    record = merge(record, [click(400), click(0), click(0), click(0), click(500)])
    assert record.rage_clicks == 5 and record.click_burst == 1  # only 400 (third of 100, 300, 400)


def _view(ms: int, path: str = "/a", session: str = "s1") -> VisitorEvent:
    return VisitorEvent(1, False, "human", "pageview", False, ms, (session, path, 0.0, 0.0))


def _scroll(ms: int, depth: float, time_on_page: float, path: str = "/a", session: str = "s1") -> VisitorEvent:
    return VisitorEvent(1, False, "human", "scroll", False, ms, (session, path, depth, time_on_page))


def _figures(record: VisitorRecord) -> dict[str, float]:
    from collector.signals.snapshot import engagement

    return engagement(record)


def test_scroll_depth_and_time_on_page_per_page() -> None:
    # Page /a: milestones 25 and 50; the deepest and the longest count.
    record = merge(None, [_view(1000), _scroll(4000, 25, 3000), _scroll(9000, 50, 8000), _scroll(9500, 25, 2000)])
    assert _figures(record) == {"scrollDepth": 50, "timeOnPageMs": 8000, "averageScrollDepth": 50,
                                "totalTimeOnPageMs": 8000, "pages": 1}
    record = merge(record, [_view(20_000, "/b"), _scroll(24_000, 25, 4000, "/b")])
    assert _figures(record) == {"scrollDepth": 25, "timeOnPageMs": 4000, "averageScrollDepth": 37.5,
                                "totalTimeOnPageMs": 12_000, "pages": 2}
    # A late scroll of /a is credited to /a, not to the current page.
    record = merge(record, [_scroll(15_000, 90, 14_000)])
    assert _figures(record) == {"scrollDepth": 25, "timeOnPageMs": 4000, "averageScrollDepth": 57.5,
                                "totalTimeOnPageMs": 18_000, "pages": 2}
    assert record.types == {"pageview": 2, "scroll": 5}


def test_engagement_does_not_depend_on_arrival_order_or_tabs() -> None:
    # Found by audit helper-33 and review helper-31 of the first version, which
    # credited every scroll to the latest pageview.
    events = [_view(1000, "/a", "s1"), _view(2000, "/b", "s2"), _scroll(3000, 100, 900, "/a", "s1"),
              _scroll(4000, 25, 400, "/b", "s2"), _scroll(2500, 50, 2000, "/a", "s1")]
    expected = {"scrollDepth": 25, "timeOnPageMs": 400, "averageScrollDepth": 62.5, "totalTimeOnPageMs": 2400,
                "pages": 2}
    for order in ([0, 1, 2, 3, 4], [2, 0, 4, 3, 1], [4, 3, 2, 1, 0], [3, 2, 1, 0, 4]):
        assert _figures(merge(None, [events[i] for i in order])) == expected, order
    # A scroll before its own pageview is the same page: the average never passes 100.
    record = merge(None, [_scroll(2000, 50, 2000), _view(1000), _scroll(3000, 100, 3000)])
    assert _figures(record)["averageScrollDepth"] == 100 and _figures(record)["pages"] == 1


def test_a_fast_clock_does_not_pin_old_pages() -> None:
    # Eight pages from a clock a day fast, then the real current page and its
    # scrolls: it was evicted as soon as it arrived (review helper-34).
    day = 86_400_000
    record = merge(None, [_view(day + 1000 * n, f"/fast{n}") for n in range(8)])
    record = merge(record, [_view(5000, "/now")] + [_scroll(5000 + n, 25 * n, 2000 * n, "/now") for n in range(1, 5)])
    figures = _figures(record)
    assert figures["pages"] == 9 and figures["totalTimeOnPageMs"] == 8000
    assert [page[3:] for page in record.pages if page[1] == 5000] == [(100.0, 8000.0)]


def test_queued_old_pages_never_push_out_the_current_one() -> None:
    # The current page, then an offline queue of 8 pageviews an hour old: the
    # current page was summed out and the snapshot read 0 (review helper-36).
    hour = 3_600_000
    record = merge(None, [_view(2 * hour, "/current"), _scroll(2 * hour + 5000, 90, 40_000, "/current")])
    record = merge(record, [_view(hour + n, f"/queued{n}") for n in range(8)])
    figures = _figures(record)
    assert (figures["scrollDepth"], figures["timeOnPageMs"], figures["pages"]) == (90, 40_000, 9)


def test_only_the_latest_pages_are_kept_apart_and_wild_times_stay_finite() -> None:
    record = merge(None, [_view(1000 * n, f"/p{n}") for n in range(1, 12)])
    record = merge(record, [_scroll(11_500, 50, 1e308, "/p11")])
    assert len(record.pages) == MAX_PAGES and record.pages_left == 3
    figures = _figures(record)
    assert figures["pages"] == 11 and figures["scrollDepth"] == 50
    assert figures["timeOnPageMs"] == figures["totalTimeOnPageMs"] == 86_400_000
    assert figures["averageScrollDepth"] == round(50 / 11, 1)


def test_records_written_before_the_snapshot_fields_still_decode() -> None:
    # The six-field array that the projection stored before types and clicks existed.
    old = msgspec.msgpack.encode([1000, 2000, 3, 1, {"crawler": 1}, "crawler"])
    record = msgspec.msgpack.decode(old, type=VisitorRecord)
    assert (record.types, record.rage_clicks, record.native_events) == ({}, 0, 0)
    assert merge(record, [VisitorEvent(3000, False, "human", "click", False, 10)]).types == {"click": 1}


def test_read_visitor_says_whether_the_fold_is_behind(tmp_path: Path) -> None:
    storage = Storage(tmp_path)
    try:
        _append(storage, 1, "v1", "pageview", {"isBot": False, "category": "human"})
        view = read_visitor(storage, "acme", "web", "v1")
        assert view.record is None and view.behind
        _fold(storage, batch=10)
        view = read_visitor(storage, "acme", "web", "v1")
        assert view.record is not None and view.record.types == {"pageview": 1} and not view.behind
        _append(storage, 2, "v2", "click", {"isBot": False, "category": "human"})
        assert read_visitor(storage, "acme", "web", "v1").behind  # v2's event is not folded yet
    finally:
        storage.close()


def test_old_records_with_float_or_wild_timestamps_and_unreadable_ones_do_not_stall_the_fold(
    tmp_path: Path,
) -> None:
    # The schema takes any JSON number as a timestamp (performance.now() gives
    # fractions); an old record that cannot be read at all is skipped, not
    # retried forever (the projection and retention behind it would stop).
    storage = Storage(tmp_path)
    try:
        human = {"isBot": False, "category": "human"}
        _append_old_format(storage, 1, "p", human, timestamp=1763900000000.5)
        _append_old_format(storage, 2, "p", human, timestamp=1e20)
        _append_old_format(storage, 3, "p", human, timestamp=1763900000100, clientTimestamp=1763900000300.25)
        with storage.env.begin(write=True) as txn:
            txn.put(outbox.seq_key(4), msgspec.msgpack.encode(("r", "acme", "web", "e", 1, "browser", b"{")),
                    db=storage.dbs.outbox)
            txn.put(outbox.NEXT_SEQ, (5).to_bytes(8, "big"), db=storage.dbs.meta)
        assert _fold(storage, batch=10) == FoldResult(4, 4, False)
        [(_, _, person)] = iter_visitors(storage, "p")
        # the wild clock is "unknown" and ends the burst; the skewed event is
        # timed by the client's own clock
        assert (person.events, person.types, person.rage_clicks) == (3, {"click": 3}, 0)
        assert (person.last_click_ms, person.click_burst) == (1763900000300, 1)
    finally:
        storage.close()


def test_event_times_outside_a_msgpack_int_are_stored_as_unknown() -> None:
    assert outbox.event_time(1763900000000.9) == 1763900000000
    assert [outbox.event_time(v) for v in (1e20, -5, 0, None)] == [0, 0, 0, 0]


def test_a_visitor_record_that_does_not_decode_reads_as_none_and_is_reported_by_the_scan(tmp_path: Path) -> None:
    storage = Storage(tmp_path)
    try:
        _append(storage, 1, "v1", "pageview", {"isBot": False, "category": "human"})
        _fold(storage, batch=10)
        with storage.env.begin(write=True) as txn:
            txn.put(visitor_key("acme", "web", "v1"), b"garbage", db=storage.dbs.visitors)
        # what the next fold starts from, rather than a 503 at every read until then
        assert read_visitor(storage, "acme", "web", "v1") == VisitorView(None, False)
        skipped: list[tuple[str, str]] = []
        assert list(iter_visitors(storage, "v1", on_unreadable=lambda c, s, e: skipped.append((c, s)))) == []
        assert skipped == [("acme", "web")]
        with pytest.raises(msgspec.DecodeError):
            list(iter_visitors(storage, "v1"))
    finally:
        storage.close()


def test_an_outbox_record_with_facts_that_does_not_decode_is_skipped_by_the_catch_up(tmp_path: Path) -> None:
    storage = Storage(tmp_path)
    try:
        _admit(storage, [("a", "p", "pageview", False, "human"), ("b", "p", "click", False, "human")], 5000)
        with storage.env.begin(write=True) as txn:
            raw = txn.get(outbox.seq_key(1), db=storage.dbs.outbox)
            txn.put(outbox.seq_key(1), raw.replace(b"acme", b"\xffcme", 1), db=storage.dbs.outbox)
        assert _fold(storage, batch=10) == FoldResult(2, 2, False)
        [(_, _, person)] = iter_visitors(storage, "p")
        assert person.types == {"click": 1}
    finally:
        storage.close()
